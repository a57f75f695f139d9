"""certs.config: flags > env > defaults, and errors that name the field, value and source."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from certs.config import ENV_PREFIX, BootstrapSettings, GenerateSettings
from plugin.api.settings import ConfigError, load_config


def bootstrap(env: dict[str, str] | None = None, **flags: object) -> BootstrapSettings:
    return load_config(BootstrapSettings, env=env or {}, env_prefix=ENV_PREFIX, flags=flags)


def test_defaults_match_the_documented_cli() -> None:
    s = bootstrap()
    assert (s.service, s.namespace, s.secret, s.webhook_config) == (
        "metagpu-webhook",
        None,
        "metagpu-webhook-tls",
        None,
    )
    assert (s.validity_days, s.ca_validity_days, s.key_algorithm) == (365, 3650, "ecdsa-p256")
    assert (s.cluster_domain, s.request_timeout_s, s.attempts) == ("cluster.local", 10.0, 5)
    assert s.renew_fraction == pytest.approx(1 / 3)


def test_env_fills_in_and_flags_win() -> None:
    env = {
        "METAGPU_CERTS_NAMESPACE": "gpu",
        "METAGPU_CERTS_DNS": "a.example.com,B.example.com",
        "METAGPU_CERTS_WEBHOOK_CONFIG": "from-env",
        "METAGPU_CERTS_WEBHOOKS": "pods.metagpu.io",
        "METAGPU_CERTS_VALIDITY_DAYS": "90",
    }
    s = bootstrap(env, webhook_config="from-flag", validity_days=None)
    assert s.namespace == "gpu"
    assert s.dns == ("a.example.com", "b.example.com")
    assert s.webhook_config == "from-flag"
    assert s.webhooks == ("pods.metagpu.io",)
    assert s.validity_days == 90
    policy = s.policy(s.names("gpu"), ())
    assert policy.dns_names[:4] == (
        "metagpu-webhook",
        "metagpu-webhook.gpu",
        "metagpu-webhook.gpu.svc",
        "metagpu-webhook.gpu.svc.cluster.local",
    )
    assert policy.dns_names[4:] == ("a.example.com", "b.example.com")
    assert policy.leaf_validity == dt.timedelta(days=90)


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        pytest.param({}, {"namespace": "Bad_NS"}, ["namespace", "DNS label", "flag"], id="ns"),
        pytest.param(
            {"METAGPU_CERTS_SECRET": "UPPER"},
            {},
            ["secret", "env METAGPU_CERTS_SECRET"],
            id="secret",
        ),
        pytest.param({}, {"ip": ["10.0.0.999"]}, ["not an IP address: '10.0.0.999'"], id="ip"),
        pytest.param({}, {"validity_days": 0}, ["validity_days", "greater than or equal"], id="v0"),
        pytest.param(
            {}, {"validity_days": 400, "ca_validity_days": 300}, ["cannot outlive"], id="leaf>ca"
        ),
        pytest.param({}, {"renew_fraction": 1.0}, ["renew_fraction", "less than 1"], id="fraction"),
        pytest.param({}, {"key_algorithm": "dsa"}, ["key_algorithm", "ecdsa-p256"], id="alg"),
        pytest.param(
            {}, {"webhooks": ["pods.metagpu.io"]}, ["without webhook_config"], id="hooks-no-config"
        ),
        pytest.param({}, {"attempts": 0}, ["attempts"], id="attempts"),
        # A value from a YAML block scalar or a file read into an env var ends in a newline.
        pytest.param(
            {"METAGPU_CERTS_SECRET": "metagpu-webhook-tls\n"},
            {},
            ["secret", "DNS subdomain"],
            id="secret-newline",
        ),
        pytest.param({}, {"service": "svc\n"}, ["service", "DNS label"], id="service-newline"),
        pytest.param({}, {"namespace": "ns\n"}, ["namespace", "DNS label"], id="ns-newline"),
        pytest.param({}, {"webhook_config": "metagpu\n"}, ["webhook_config"], id="config-newline"),
        pytest.param({}, {"dns": ["a\n.example.com"]}, ["dns", "labels"], id="dns-newline"),
        pytest.param({"METAGPU_CERTS_TYPO": "x"}, {"service": None}, [], id="unknown-env-ignored"),
    ],
)
def test_bad_settings_name_field_value_and_source(
    env: dict[str, str], flags: dict[str, object], expected: list[str]
) -> None:
    if not expected:
        bootstrap(env, **flags)  # service-link style variables must not break start-up
        return
    with pytest.raises(ConfigError) as err:
        bootstrap(env, **flags)
    for text in expected:
        assert text in str(err.value)


def test_generate_names_default_to_localhost_unless_given(tmp_path: Path) -> None:
    def gen(**flags: object) -> GenerateSettings:
        return load_config(
            GenerateSettings, env={}, env_prefix=ENV_PREFIX, flags={"out": tmp_path, **flags}
        )

    assert gen().names() == (("localhost",), ("127.0.0.1", "::1"))
    assert gen(dns=["x.example"]).names() == ((), ())
    assert gen(service="wh", namespace="ns", cluster_domain="corp.local").names()[0][-1] == (
        "wh.ns.svc.corp.local"
    )
    with pytest.raises(ConfigError, match="out"):
        load_config(GenerateSettings, env={}, env_prefix=ENV_PREFIX, flags={})
