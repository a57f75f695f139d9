"""ExtenderConfig ``listen``: the shared HOST:PORT rules, with the extender's own example."""

from __future__ import annotations

import pytest

from plugin.api.settings import ConfigError, load_config
from plugin.extender.config import ENV_PREFIX, ExtenderConfig


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        pytest.param("127.0.0.1:8450", "127.0.0.1", 8450, id="default"),
        pytest.param("[::1]:0", "::1", 0, id="ipv6-any-port"),
        pytest.param("localhost:1", "localhost", 1, id="name"),
    ],
)
def test_host_and_port_come_from_listen(listen: str, host: str, port: int) -> None:
    c = ExtenderConfig(listen=listen)
    assert (c.host, c.port) == (host, port)


@pytest.mark.parametrize(
    ("listen", "must_contain"),
    [
        pytest.param("8450", ["must be HOST:PORT"], id="no-host"),
        pytest.param(":8450", ["host is empty", "0.0.0.0"], id="empty-host"),
        # Accepted (as host "::1") before the extender shared the webhook's parser.
        pytest.param("::1:8450", ["in brackets", "[::1]:8450"], id="bare-ipv6"),
        pytest.param("[zz]:8450", ["not an IPv6 address"], id="bad-ipv6"),
        pytest.param("host:99999", ["0..65535"], id="port"),
    ],
)
def test_bad_listen_names_field_value_and_example(listen: str, must_contain: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ExtenderConfig, env={}, env_prefix=ENV_PREFIX, flags={"listen": listen})
    message = str(info.value)
    for part in must_contain:
        assert part in message
    assert "listen:" in message
    assert "e.g. 127.0.0.1:8450" in message
    assert "from flag for listen" in message


def test_the_metrics_listener_takes_its_own_port() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            ExtenderConfig,
            env={},
            env_prefix=ENV_PREFIX,
            flags={"listen": "127.0.0.1:8450", "metrics_listen": "0.0.0.0:8450"},
        )
    assert "must use another port than listen" in str(info.value)
    assert ExtenderConfig(metrics_listen="0.0.0.0:8451").metrics_listen == "0.0.0.0:8451"
    with pytest.raises(ConfigError) as bad:
        load_config(ExtenderConfig, env={}, env_prefix=ENV_PREFIX, flags={"metrics_listen": "8451"})
    assert "metrics_listen" in str(bad.value)
