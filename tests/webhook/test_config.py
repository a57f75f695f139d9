"""WebhookConfig: defaults (a contract with the chart), validation, env/file/flag precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin.api.settings import ConfigError, load_config
from webhook.config import ENV_PREFIX, WebhookConfig


def load(
    yaml_text: str = "", *, tmp_path: Path, env: dict[str, str] | None = None, **flags: object
) -> WebhookConfig:
    file = tmp_path / "webhook.yaml"
    file.write_text(yaml_text)
    return load_config(WebhookConfig, file=file, env=env or {}, env_prefix=ENV_PREFIX, flags=flags)


def test_defaults_are_the_documented_contract() -> None:
    c = WebhookConfig()
    assert c.model_dump(by_alias=True) == {
        "version": "v1",
        "listen": "127.0.0.1:8443",
        "tls": {
            "cert_file": None,
            "key_file": None,
            "generate_dir": Path("run/webhook-tls"),
            "reload_interval_s": 0.5,
        },
        "resource_name": "cnvrg.io/metagpu",
        "extra_resource_names": [],
        "units_per_gpu": 100,
        "fraction_resource_names": ["nvidia.com/gpu", "cnvrg.io/gpu"],
        "convert_whole_gpus": False,
        "max_gpus_per_container": 8,
        "tolerations": [
            {
                "key": "cnvrg.io/metagpu",
                "operator": "Equal",
                "value": "present",
                "effect": "NoSchedule",
                "tolerationSeconds": None,
            },
            {
                "key": "nvidia.com/gpu",
                "operator": "Exists",
                "value": None,
                "effect": "NoSchedule",
                "tolerationSeconds": None,
            },
        ],
        "runtime_class_name": "nvidia",
        "scheduler_name": None,
        "default_compute_policy": "balance",
        "visible_devices_policy": "deny",
        "deny_privileged": True,
        "void_non_gpu_containers": True,
        "mps_host_directories": ["/tmp/nvidia-mps", "/var/run/metagpu-mps"],
        "mode": "device-plugin",
        "dra": {
            "device_class_name": "gpu.metagpu.io",
            "gpu_memory_mib": None,
            "memory_step_mib": 1024,
            "memory_min_mib": 1024,
            "memory_resource_name": "metagpu.io/gpu-memory",
            "template_prefix": "metagpu",
            "controller": "auto",
            "lease_name": "metagpu-claim-templates",
            "explain_waiting": True,
            "explain_refresh_s": 60.0,
            "driver_name": "gpu.metagpu.io",
        },
        "kubernetes": {
            "enabled": "auto",
            "kubeconfig": None,
            "namespace_lookup_timeout_s": 1.0,
            "initial_sync_timeout_s": 10.0,
        },
        "quota_mirror": {
            "enabled": "auto",
            "lease_name": "metagpu-quota-mirror",
            "lease_namespace": None,
            "identity": None,
            "lease_duration_s": 15,
            "renew_deadline_s": 10.0,
            "retry_period_s": 2.0,
        },
        "max_body_bytes": 4 * 1024 * 1024,
        "shutdown_timeout_s": 10,
        "connections": {
            "max_connections": 1024,
            "max_connections_per_client": 256,
            "tls_handshake_timeout_s": 10,
            "header_timeout_s": 10,
            "body_timeout_s": 30,
            "write_timeout_s": 30,
            "idle_timeout_s": 120,
        },
        "drain_delay_s": 0,
    }


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    text = "units_per_gpu: 10\nlisten: 0.0.0.0:9443\ndefault_compute_policy: fixed\n"
    env = {"METAGPU_WEBHOOK_UNITS_PER_GPU": "20", "METAGPU_WEBHOOK_LISTEN": "127.0.0.1:1"}
    c = load(text, tmp_path=tmp_path, env=env, listen="[::1]:8443")
    assert (c.units_per_gpu, c.listen, c.default_compute_policy) == (20, "[::1]:8443", "fixed")
    assert (c.host, c.port) == ("::1", 8443)


def test_chart_style_file(tmp_path: Path) -> None:
    text = """
version: v1
listen: 0.0.0.0:8443
tls: {cert_file: /tls/tls.crt, key_file: /tls/tls.key, reload_interval_s: 1}
extra_resource_names: [cnvrg.io/metagpu-a100]
tolerations:
  - {key: gpu, operator: Exists, effect: NoExecute, tolerationSeconds: 30}
runtime_class_name: null
kubernetes: {enabled: true, namespace_lookup_timeout_s: 0.5}
"""
    c = load(text, tmp_path=tmp_path)
    assert c.tls.cert_file == Path("/tls/tls.crt")
    assert c.tolerations[0].toleration_seconds == 30
    assert c.runtime_class_name is None
    assert c.kubernetes.enabled is True


@pytest.mark.parametrize(
    ("env", "expected"),
    [("auto", "auto"), ("true", True), ("false", False)],
)
def test_kubernetes_enabled_from_env(tmp_path: Path, env: str, expected: object) -> None:
    c = load(tmp_path=tmp_path, env={"METAGPU_WEBHOOK_KUBERNETES__ENABLED": env})
    assert c.kubernetes.enabled == expected


@pytest.mark.parametrize(
    ("text", "must_contain"),
    [
        pytest.param("version: v2", ["version", "'v2'"], id="version"),
        pytest.param(
            "unitsPerGPU: 10", ["unitsPerGPU: unknown setting", "units_per_gpu"], id="typo"
        ),
        pytest.param(
            "units_per_gpu: 0", ["units_per_gpu", "greater than or equal to 1"], id="units-zero"
        ),
        pytest.param(
            "units_per_gpu: 1001", ["units_per_gpu", "less than or equal to 1000"], id="units-high"
        ),
        pytest.param(
            "resource_name: metagpu", ["resource_name", "<domain>/<name>"], id="resource-no-domain"
        ),
        pytest.param(
            "fraction_resource_names: [cnvrg.io/metagpu]",
            ["cnvrg.io/metagpu is in both"],
            id="overlap",
        ),
        pytest.param(
            "extra_resource_names: [a.io/x, a.io/x]", ["listed twice: a.io/x"], id="duplicate"
        ),
        pytest.param(
            "listen: '8443'", ["listen", "must be HOST:PORT", "127.0.0.1:8443"], id="listen-no-host"
        ),
        pytest.param(
            "listen: ':8443'", ["listen", "host is empty", "0.0.0.0"], id="listen-empty-host"
        ),
        pytest.param("listen: ::1:8443", ["in brackets", "[::1]:8443"], id="listen-ipv6"),
        pytest.param("listen: '[zz]:8443'", ["not an IPv6 address"], id="listen-bad-ipv6"),
        pytest.param("listen: host:99999", ["0..65535"], id="listen-port"),
        pytest.param(
            "tls: {cert_file: /a}", ["tls.cert_file and tls.key_file go together"], id="half-tls"
        ),
        pytest.param(
            "tolerations: [{operator: Equal}]",
            ["operator must be Exists when key is empty"],
            id="toleration-key",
        ),
        pytest.param(
            "tolerations: [{key: a, operator: Exists, value: b}]",
            ["value must be empty"],
            id="toleration-value",
        ),
        pytest.param(
            "tolerations: [{key: a, effect: NoSchedule, tolerationSeconds: 5}]",
            ["only allowed with effect NoExecute"],
            id="toleration-seconds",
        ),
        pytest.param(
            "default_compute_policy: turbo", ["default_compute_policy", "'turbo'"], id="policy"
        ),
        pytest.param("visible_devices_policy: allow", ["visible_devices_policy"], id="visible"),
        pytest.param("runtime_class_name: Nvidia_X", ["DNS subdomain"], id="runtime-class"),
        pytest.param(
            'runtime_class_name: "nvidia\\n"', ["DNS subdomain"], id="runtime-class-newline"
        ),
        # A YAML block scalar keeps its final newline: "|" then the name on the next line.
        pytest.param(
            "resource_name: |\n  cnvrg.io/metagpu\n",
            ["resource_name", "alphanumeric", "'cnvrg.io/metagpu\\n'"],
            id="resource-name-newline",
        ),
        pytest.param(
            'extra_resource_names: ["cnvrg.io/metagpu-a100\\n"]',
            ["extra_resource_names", "alphanumeric"],
            id="extra-name-newline",
        ),
        pytest.param("max_gpus_per_container: 0.001", ["less than one unit"], id="max-too-small"),
        pytest.param("max_body_bytes: 10", ["max_body_bytes"], id="body-too-small"),
    ],
)
def test_bad_config_names_field_and_value(
    tmp_path: Path, text: str, must_contain: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load(text, tmp_path=tmp_path)
    for part in must_contain:
        assert part in str(info.value)


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [("127.0.0.1:8443", "127.0.0.1", 8443), ("[::]:0", "::", 0), ("localhost:1", "localhost", 1)],
)
def test_host_and_port_come_from_listen(listen: str, host: str, port: int) -> None:
    c = WebhookConfig(listen=listen)
    assert (c.host, c.port) == (host, port)
