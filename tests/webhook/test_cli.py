"""``metagpu mutate`` and ``metagpu webhook`` flag handling, through the real dispatcher."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from metagpu.cli import build_parser, main
from tests.conftest import REPO_ROOT
from webhook.cli import COMMANDS, curl_command, listen_line, load_webhook_config

POD = """
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: team-a}
spec:
  containers:
    - name: train
      image: busybox
      resources: {limits: {nvidia.com/gpu: 0.5}}
"""


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``main()`` configures the root logger on pytest's captured stderr; undo that."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


THIRD = POD.replace("0.5", "0.333").replace("name: p,", "name: third,")


def write(tmp_path: Path, text: str, name: str = "in.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_mutate_prints_object_patch_and_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mutate", "-f", str(write(tmp_path, POD))]) == 0
    out, err = capsys.readouterr()
    assert "# " in out
    assert '"path": "/spec/containers/0/resources/limits/cnvrg.io~1metagpu"' in out
    pod = yaml.safe_load(out)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"cnvrg.io/metagpu": "50"}
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert "Warning: " in err
    assert "nvidia.com/gpu 0.5 converted to cnvrg.io/metagpu 50" in err


def test_mutate_denial_goes_to_stderr_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    both = write(tmp_path, POD + "---\n" + THIRD)
    assert main(["mutate", "-f", str(both), "-o", "json"]) == 1
    out, err = capsys.readouterr()
    results = json.loads(out)
    assert [r["allowed"] for r in results] == [True, False]
    assert "Pod/third denied (400 Invalid)" in err
    assert "0.33 or 0.34" in err


def test_mutate_reads_stdin_lists_and_reviews(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = yaml.safe_load(POD)
    doc = {"apiVersion": "v1", "kind": "List", "items": [pod, {**pod, "metadata": {"name": "q"}}]}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(doc)))
    review = REPO_ROOT / "examples" / "admission-review-half-gpu.json"
    assert main(["mutate", "-f", "-", "-f", str(review), "-o", "json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 3
    assert all(r["patch"] for r in results)


@pytest.mark.parametrize(
    ("flags", "key", "expected"),
    [
        pytest.param(
            ["--namespace-policy", "fixed"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50", id="policy"
        ),
        pytest.param(["--namespace-opt-out"], None, None, id="opt-out"),
    ],
)
def test_mutate_simulates_the_namespace(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    key: str | None,
    expected: str | None,
) -> None:
    assert main(["mutate", "-f", str(write(tmp_path, POD)), "-o", "json", *flags]) == 0
    result = json.loads(capsys.readouterr().out)[0]
    env = {e["name"]: e["value"] for e in result["object"]["spec"]["containers"][0].get("env", [])}
    if key is None:
        assert result["patch"] == []
    else:
        assert env[key] == expected


def test_mutate_uses_the_config_file_and_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(tmp_path, "units_per_gpu: 1000\nresource_name: example.com/shares\n", "c.yaml")
    monkeypatch.setenv("METAGPU_WEBHOOK_UNITS_PER_GPU", "10")
    assert (
        main(["mutate", "-f", str(write(tmp_path, POD)), "--config", str(config), "-o", "json"])
        == 0
    )
    limits = json.loads(capsys.readouterr().out)[0]["object"]["spec"]["containers"][0]["resources"][
        "limits"
    ]
    assert limits == {"example.com/shares": "5"}  # env (10 per GPU) beats the file (1000)


@pytest.mark.parametrize(
    ("text", "must_contain"),
    [
        pytest.param("a: [", "not YAML or JSON at line", id="bad-yaml"),
        pytest.param("- 1\n- 2\n", "not a Kubernetes object", id="not-object"),
        pytest.param(
            "apiVersion: v1\nkind: Pod\nspec: {containers: {}}\n", "must be a list", id="shape"
        ),
    ],
)
def test_mutate_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, must_contain: str
) -> None:
    assert main(["mutate", "-f", str(write(tmp_path, text))]) == 1
    assert must_contain in capsys.readouterr().err


GPU_TEMPLATE = """
  template:
    spec:
      containers:
        - name: train
          image: busybox
          resources: {limits: {nvidia.com/gpu: 0.5}}
"""


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n",
            id="configmap",
        ),
        # The server's classify() requires apps/v1; mutate must not patch what it leaves alone.
        pytest.param(
            "apiVersion: apps/v1beta2\nkind: Deployment\nmetadata: {name: c}\nspec:" + GPU_TEMPLATE,
            id="apps-v1beta2-deployment",
        ),
        pytest.param(
            "apiVersion: batch/v1beta1\nkind: Job\nmetadata: {name: c}\nspec:" + GPU_TEMPLATE,
            id="batch-v1beta1-job",
        ),
    ],
)
def test_mutate_other_kinds_are_noted_and_printed_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    assert main(["mutate", "-f", str(write(tmp_path, text)), "-o", "json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)[0]
    assert result["patch"] == []
    assert result["object"] == yaml.safe_load(text)
    assert "not a v1 Pod or an apps/v1, batch/v1 or v1 workload" in err
    assert "the webhook leaves it alone" in err


def test_mutate_patches_an_apps_v1_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control for the case above: the same Deployment at apps/v1 is mutated."""
    text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: c}\nspec:" + GPU_TEMPLATE
    assert main(["mutate", "-f", str(write(tmp_path, text)), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)[0]
    assert result["patch"] != []


def test_mutate_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["mutate", "-f", str(tmp_path / "nope.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_bad_config_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "units_per_gpu: 0\n", "c.yaml")
    assert main(["mutate", "-f", str(write(tmp_path, POD)), "--config", str(config)]) == 2
    assert "units_per_gpu" in capsys.readouterr().err


def test_webhook_flags_beat_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(tmp_path, "listen: 0.0.0.0:1\nunits_per_gpu: 10\n", "c.yaml")
    monkeypatch.setenv("METAGPU_WEBHOOK_LISTEN", "127.0.0.1:2")
    monkeypatch.setenv("METAGPU_WEBHOOK_UNITS_PER_GPU", "20")
    webhook = next(c for c in COMMANDS if c.name == "webhook")
    args = build_parser(webhook).parse_args(
        [
            "--config",
            str(config),
            "--listen",
            "127.0.0.1:3",
            "--tls-cert",
            "/c.crt",
            "--tls-key",
            "/c.key",
            "--kubernetes",
            "false",
        ]
    )
    loaded = load_webhook_config(args)
    assert loaded.listen == "127.0.0.1:3"
    assert loaded.units_per_gpu == 20
    assert loaded.tls.cert_file == Path("/c.crt")
    assert loaded.kubernetes.enabled is False


def test_webhook_print_config_shows_the_effective_config_and_serves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(tmp_path, "units_per_gpu: 10\nlisten: 127.0.0.1:1\n", "c.yaml")
    monkeypatch.setenv("METAGPU_WEBHOOK_CONFIG", str(config))  # --config from the env
    assert main(["webhook", "--print-config", "--listen", "127.0.0.1:2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["units_per_gpu"] == 10
    assert printed["listen"] == "127.0.0.1:2"
    assert printed["resource_name"] == "cnvrg.io/metagpu"


def test_curl_command_quotes_paths() -> None:
    line = curl_command("https://127.0.0.1:8443/mutate", Path("/tmp/a b/ca.crt"))
    assert "--cacert '/tmp/a b/ca.crt'" in line
    assert "--data @examples/admission-review-half-gpu.json" in line


def test_webhook_modules_never_load_grpc_or_nvml() -> None:
    code = (
        "import sys, webhook.cli, webhook.server, webhook.namespaces, webhook.offline; "
        "print(sorted(m for m in ('grpc', 'pynvml') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_cli_module_is_light() -> None:
    code = (
        "import sys, webhook.cli; "
        "print(sorted(m for m in ('aiohttp', 'kubernetes_asyncio', 'jsonpatch', 'webhook.rules') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_every_connection_setting_has_a_flag_that_beats_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from webhook.cli import CONNECTION_FLAGS
    from webhook.config import ConnectionsConfig

    monkeypatch.setenv("METAGPU_WEBHOOK_CONNECTIONS__HEADER_TIMEOUT_S", "7")
    webhook = next(c for c in COMMANDS if c.name == "webhook")
    argv = ["--max-connections", "500", "--max-connections-per-client", "50"]
    argv += [a for flag, kind, _ in CONNECTION_FLAGS if kind is float for a in (f"--{flag}", "4.5")]
    loaded = load_webhook_config(build_parser(webhook).parse_args(argv)).connections
    assert (loaded.max_connections, loaded.max_connections_per_client) == (500, 50)
    timeouts = {k: v for k, v in loaded.model_dump().items() if k.endswith("_s")}
    assert timeouts == dict.fromkeys(timeouts, 4.5)
    assert len(CONNECTION_FLAGS) == len(ConnectionsConfig.model_fields)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("0.0.0.0", "listening on every IPv4 address (0.0.0.0:8443)", id="chart"),
        pytest.param("::", "listening on every address ([::]:8443", id="ipv6 wildcard"),
        pytest.param("127.0.0.1", "serving https://127.0.0.1:8443/mutate", id="loopback"),
    ],
)
def test_the_start_up_line_names_the_real_listen_address(host: str, expected: str) -> None:
    """Issue 32: a pod listening on every address logged only its loopback URL."""
    line = listen_line(host, 8443, "https://127.0.0.1:8443/mutate")
    assert expected in line
    assert line.endswith("serving https://127.0.0.1:8443/mutate")  # what tools parse
