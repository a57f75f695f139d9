"""``metagpu quota-mirror`` and the webhook's quota flags, through the real dispatcher; and a
real process stopped by SIGTERM, which gives its Lease back."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metagpu.cli import main
from tests.conftest import REPO_ROOT
from tests.harness.kube_api import FakeKubeApi
from tests.webhook.quotas.builders import for_put, quota
from tests.webhook.waiting import eventually


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "METAGPU_WEBHOOK_CONFIG"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["--lease-name", "Not_A_Name"], "lease_name must be a DNS subdomain", id="lease-name"
        ),
        pytest.param(
            ["--lease-namespace", "a.b"], "lease_namespace must be a namespace name", id="ns"
        ),
        pytest.param([], "no Kubernetes cluster is configured", id="no-cluster"),
    ],
)
def test_bad_input_is_a_clear_usage_error(
    argv: list[str], expected: str, no_cluster: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quota-mirror", *argv]) == 2
    assert expected in capsys.readouterr().err


def test_timings_client_go_would_refuse_are_refused(
    tmp_path: Path, no_cluster: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "webhook.yaml"
    config.write_text("quota_mirror: {lease_duration_s: 5, renew_deadline_s: 6}\n")
    assert main(["quota-mirror", "--config", str(config)]) == 2
    assert "lease_duration_s (5) must be greater than renew_deadline_s (6.0)" in (
        capsys.readouterr().err
    )


def test_a_config_that_turns_the_mirror_off_is_refused(
    tmp_path: Path, no_cluster: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "webhook.yaml"
    config.write_text("quota_mirror: {enabled: false}\n")
    assert main(["quota-mirror", "--config", str(config)]) == 2
    assert "quota_mirror.enabled is false" in capsys.readouterr().err


def test_outside_a_pod_the_lease_namespace_must_be_given(
    kube_config_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quota-mirror"]) == 2
    assert "quota_mirror.lease_namespace is not set" in capsys.readouterr().err


def test_flags_reach_the_config(no_cluster: None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--lease-name", "gpu-mirror", "--lease-namespace", "ops", "--units-per-gpu", "10"]
    assert main(["quota-mirror", *argv, "--print-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["quota_mirror"]["lease_name"] == "gpu-mirror"
    assert config["quota_mirror"]["lease_namespace"] == "ops"
    assert config["units_per_gpu"] == 10
    assert main(["webhook", "--quota-mirror", "false", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["quota_mirror"]["enabled"] is False


async def test_sigterm_stops_it_cleanly_and_releases_the_lease(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metagpu.cli",
        "quota-mirror",
        "--lease-namespace",
        "metagpu",
        "--identity",
        "solo",
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await eventually(
            lambda: api.get("v1", "ResourceQuota", "gpus-metagpu", "team-a") is not None
        )
        lease = api.get("coordination.k8s.io/v1", "Lease", "metagpu-quota-mirror", "metagpu")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "solo"
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            out, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, out.decode()
    lease = api.get("coordination.k8s.io/v1", "Lease", "metagpu-quota-mirror", "metagpu")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == ""
