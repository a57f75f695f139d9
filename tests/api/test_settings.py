"""Config loading: precedence, env parsing, and error messages an operator can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from plugin.api.settings import (
    ConfigError,
    StrictModel,
    deep_merge,
    env_var_names,
    load_config,
    read_config_file,
    split_listen,
)


class Tls(StrictModel):
    cert_file: Path | None = None
    reload_interval_s: float = Field(default=0.5, gt=0)


class Item(StrictModel):
    key: str
    effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"


class Sample(StrictModel):
    version: Literal["v1"] = "v1"
    listen: str = "127.0.0.1:8443"
    units: int = Field(default=100, ge=1, le=1000)
    names: list[str] = Field(default_factory=lambda: ["a"])
    enabled: bool | Literal["auto"] = "auto"
    tls: Tls = Field(default_factory=Tls)
    items: list[Item] = Field(default_factory=list)


PREFIX = "T_"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_when_nothing_given() -> None:
    assert load_config(Sample) == Sample()


def test_precedence_is_flags_over_env_over_file(tmp_path: Path) -> None:
    file = write(tmp_path, "units: 10\nlisten: file:1\ntls: {reload_interval_s: 3}\n")
    env = {"T_UNITS": "20", "T_TLS__RELOAD_INTERVAL_S": "4"}
    cfg = load_config(
        Sample, file=file, env=env, env_prefix=PREFIX, flags={"units": 30, "listen": None}
    )
    assert cfg.units == 30  # flag wins
    assert cfg.listen == "file:1"  # flag was None: not given
    assert cfg.tls.reload_interval_s == 4  # env beats file, nested by "__"


def test_env_lists_accept_commas_and_yaml_flow() -> None:
    cfg = load_config(Sample, env={"T_NAMES": "x, y,,z"}, env_prefix=PREFIX)
    assert cfg.names == ["x", "y", "z"]
    cfg = load_config(
        Sample, env={"T_ITEMS": "[{key: a}, {key: b, effect: NoExecute}]"}, env_prefix=PREFIX
    )
    assert [i.key for i in cfg.items] == ["a", "b"]


def test_env_strings_are_taken_as_written() -> None:
    """An IPv6 listen address starts with "[" like a YAML list; a string setting keeps it."""
    cfg = load_config(Sample, env={"T_LISTEN": "[::1]:8443"}, env_prefix=PREFIX)
    assert cfg.listen == "[::1]:8443"
    cfg = load_config(Sample, env={"T_TLS__CERT_FILE": "[odd].pem"}, env_prefix=PREFIX)
    assert cfg.tls.cert_file == Path("[odd].pem")


def test_unknown_prefixed_env_vars_are_ignored() -> None:
    # Kubernetes service links: a Service named "t" would inject T_SERVICE_HOST, T_PORT...
    cfg = load_config(
        Sample, env={"T_SERVICE_HOST": "10.0.0.1", "T_PORT": "tcp://x"}, env_prefix=PREFIX
    )
    assert cfg == Sample()


def test_nested_file_sections_merge_with_env(tmp_path: Path) -> None:
    file = write(tmp_path, "tls: {cert_file: /etc/tls.crt}\n")
    cfg = load_config(Sample, file=file, env={"T_TLS__RELOAD_INTERVAL_S": "2"}, env_prefix=PREFIX)
    assert cfg.tls == Tls(cert_file=Path("/etc/tls.crt"), reload_interval_s=2)


@pytest.mark.parametrize(
    ("text", "env", "flags", "expected"),
    [
        pytest.param(
            "units: 0\n",
            {},
            {},
            ["units:", "greater than or equal to 1", "got 0", "from file"],
            id="range-from-file",
        ),
        pytest.param(
            "",
            {"T_UNITS": "many"},
            {},
            ["units:", "valid integer", "'many'", "env T_UNITS"],
            id="type-from-env",
        ),
        pytest.param(
            "", {}, {"units": 5000}, ["units:", "1000", "flag for units"], id="range-from-flag"
        ),
        pytest.param(
            "unitz: 5\n",
            {},
            {},
            ["unitz: unknown setting", "accepted here:", "units"],
            id="typo-lists-accepted-keys",
        ),
        pytest.param(
            "tls: {cert: x}\n",
            {},
            {},
            ["tls.cert: unknown setting", "cert_file"],
            id="nested-typo",
        ),
        pytest.param(
            "items: [{key: a, efect: x}]\n",
            {},
            {},
            ["items.0.efect", "accepted here:", "effect"],
            id="typo-inside-list-item",
        ),
        pytest.param(
            "version: v2\n", {}, {}, ["version:", "'v1'", "got 'v2'"], id="unknown-version"
        ),
    ],
)
def test_errors_name_field_value_and_source(
    tmp_path: Path, text: str, env: dict[str, str], flags: dict[str, object], expected: list[str]
) -> None:
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(Sample, file=file, env=env, env_prefix=PREFIX, flags=flags)
    message = str(info.value)
    for fragment in expected:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(None, "no such file", id="missing"),
        pytest.param("a: [1, 2\n", "invalid YAML at line", id="bad-yaml"),
        pytest.param("- 1\n- 2\n", "must be a YAML mapping", id="not-a-mapping"),
        pytest.param(b"\xff\xfe", "cannot read", id="not-utf8"),
    ],
)
def test_bad_files_are_clear(tmp_path: Path, content: str | bytes | None, expected: str) -> None:
    path = tmp_path / "c.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=expected):
        read_config_file(path)


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("x: " + "a" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        read_config_file(path)


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(Sample, file=write(tmp_path, "")) == Sample()


def test_bad_env_flow_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="env T_ITEMS"):
        load_config(Sample, env={"T_ITEMS": "[{key: a"}, env_prefix=PREFIX)


def test_env_var_names_cover_nested_fields() -> None:
    names = env_var_names(Sample, PREFIX)
    assert names["T_TLS__CERT_FILE"] == ("tls", "cert_file")
    assert "T_UNITS" in names


def test_deep_merge_merges_mappings_and_replaces_the_rest() -> None:
    into = {"a": {"b": 1, "c": [1]}, "d": 1}
    deep_merge(into, {"a": {"c": [2], "e": 3}, "d": {"x": 1}})
    assert into == {"a": {"b": 1, "c": [2], "e": 3}, "d": {"x": 1}}


def test_models_are_frozen() -> None:
    cfg = Sample()
    with pytest.raises(ValueError, match="frozen"):
        cfg.units = 3  # type: ignore[misc]


# ------------------------------------------------------------- split_listen
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("127.0.0.1:8443", ("127.0.0.1", 8443), id="ipv4"),
        pytest.param("0.0.0.0:0", ("0.0.0.0", 0), id="every-interface-any-port"),
        pytest.param("localhost:1", ("localhost", 1), id="name"),
        pytest.param("[::]:65535", ("::", 65535), id="ipv6-any-highest-port"),
        pytest.param("[::1]:8443", ("::1", 8443), id="ipv6-loopback"),
        pytest.param("[fd00::7]:9400", ("fd00::7", 9400), id="ipv6-address"),
        pytest.param("[::ffff:10.0.0.1]:80", ("::ffff:10.0.0.1", 80), id="ipv4-mapped"),
        pytest.param("host:008443", ("host", 8443), id="leading-zeros"),
    ],
)
def test_split_listen_accepts(value: str, expected: tuple[str, int]) -> None:
    assert split_listen(value, example="127.0.0.1:8443") == expected


@pytest.mark.parametrize(
    ("value", "must_contain"),
    [
        pytest.param("8443", ["must be HOST:PORT"], id="no-colon"),
        pytest.param("", ["must be HOST:PORT"], id="empty"),
        pytest.param("host:", ["must be HOST:PORT"], id="no-port"),
        pytest.param("host:http", ["numeric port"], id="named-port"),
        pytest.param("host:-1", ["numeric port"], id="negative-port"),
        pytest.param("host:+1", ["numeric port"], id="signed-port"),
        pytest.param("host: 1", ["numeric port"], id="space-in-port"),
        pytest.param("host:\u0661\u0662", ["numeric port"], id="non-ascii-digits"),
        pytest.param("host:65536", ["0..65535"], id="port-too-high"),
        pytest.param("host:" + "9" * 5000, ["0..65535"], id="port-of-5000-digits"),
        pytest.param(":8443", ["host is empty", "use 0.0.0.0 for every interface"], id="no-host"),
        pytest.param("::1:8443", ["IPv6 address in brackets", "[::1]:1234"], id="bare-ipv6"),
        pytest.param("::8443", ["IPv6 address in brackets"], id="bare-ipv6-any"),
        pytest.param("[::1:8443", ["in brackets"], id="open-bracket"),
        pytest.param("::1]:8443", ["in brackets"], id="close-bracket"),
        pytest.param("[zz]:1", ["not an IPv6 address in brackets", "[::1]:1234"], id="not-ipv6"),
        pytest.param("[]:1", ["not an IPv6 address in brackets"], id="empty-brackets"),
        pytest.param(
            "[10.0.0.1]:1", ["not an IPv6 address", "without brackets"], id="bracketed-v4"
        ),
        pytest.param("[host]:1", ["not an IPv6 address"], id="bracketed-name"),
    ],
)
def test_split_listen_says_what_is_wrong_and_what_would_do(
    value: str, must_contain: list[str]
) -> None:
    """Every refusal names the problem, shows the caller's example and the value."""
    with pytest.raises(ValueError, match=r"e\.g\. 10\.1\.2\.3:1234") as info:
        split_listen(value, example="10.1.2.3:1234")
    message = str(info.value)
    for part in must_contain:
        assert part in message
    assert repr(value)[:60] in message
