"""The built image, run the way the chart runs it (``make image-test``).

Every container's user, group, read-only root, capabilities and mounts come
from the chart as helm renders it (see :mod:`tests.image.pods`). Clients run
outside the container: a TLS client that trusts only the CA from ``metagpu
certs generate``, the project's kubelet simulator, and an in-test API server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from metagpu.kubelet_sim import KubeletSim
from plugin.api.resources import ENV_UNITS
from plugin.gpu.health_file import HEALTH_FILE_NAME, read_board
from tests.conftest import REPO_ROOT, load_admission_fixture
from tests.harness.kube_api import FakeKubeApi
from tests.image.containers import Mount, Runner
from tests.image.pods import (
    START_TIMEOUT_S,
    VENV,
    agent_metric,
    agent_setup,
    console_scripts,
    device_plugin_setup,
    healthy,
    post_review,
    run_ok,
    simulated_node_setup,
    started,
    wait_for,
    webhook_setup,
)
from tests.install.chart import EVERYTHING, render
from tests.webhook.test_admission_fixtures import half_gpu, patched, validate_like_the_api_server

pytestmark = pytest.mark.image


async def test_webhook_answers_an_admission_review_over_tls_as_the_chart_runs_it(
    runner: Runner, short_tmp_path: Path, kube_api: tuple[FakeKubeApi, str]
) -> None:
    webhook = await asyncio.to_thread(webhook_setup, runner, short_tmp_path, kube_api[1])
    assert webhook.spec.user == 65532
    assert webhook.spec.read_only_root
    with started(runner, webhook.spec) as container:
        await wait_for("answer on /healthz", lambda: healthy(webhook), container)
        fixture = load_admission_fixture("pod-half-gpu.json")
        answer = await post_review(webhook, fixture)
        assert answer.status == 200, answer.text
        assert answer.review["response"]["uid"] == fixture["request"]["uid"]
        assert answer.response["allowed"] is True
        out = patched(fixture, answer)
        half_gpu(fixture, out, answer)
        validate_like_the_api_server(out)
        assert container.alive()


def test_the_root_is_read_only_and_only_the_charts_mounts_are_writable(
    runner: Runner, short_tmp_path: Path
) -> None:
    """The webhook's run spec, with python3 in place of the webhook: what can it write?"""
    spec = webhook_setup(runner, short_tmp_path).spec
    writable = [m.target for m in spec.mounts if not m.read_only]
    probe = (
        "import os, sys\n"
        "ok = []\n"
        "for d in sys.argv[1:]:\n"
        "    try:\n"
        "        open(os.path.join(d, '.probe'), 'w').close(); ok.append(d)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(os.getuid(), os.getgid(), ' '.join(ok))\n"
    )
    places = ["/", "/etc", "/opt/metagpu/venv", "/var/tmp", "/run", *writable]
    out = run_ok(
        runner, dataclasses.replace(spec, entrypoint="python3", args=("-c", probe, *places))
    )
    uid, gid, *can_write = out.split()
    assert (int(uid), int(gid)) == (spec.user, spec.group)
    assert can_write == writable


# ------------------------------------------------------------ device plugin
async def test_device_plugin_registers_with_the_kubelet_and_answers_allocate(
    runner: Runner, short_tmp_path: Path
) -> None:
    plugin = device_plugin_setup(short_tmp_path, gpu_count=2)
    assert plugin.spec.user == 0
    async with KubeletSim(plugin.kubelet_dir) as kubelet:
        container = await asyncio.to_thread(runner.start, plugin.spec)
        try:
            conn = await kubelet.wait_registered(plugin.resource, timeout_s=START_TIMEOUT_S)
            assert len(conn.healthy_ids()) == 2 * plugin.units_per_gpu
            ids, response = await kubelet.allocate(plugin.resource, 50)
            assert len(ids) == 50
            assert response.envs[ENV_UNITS] == "50"
            assert container.alive()
        except BaseException:
            print(f"--- device plugin logs ({runner.isolation}) ---\n{container.logs()}")
            raise
        finally:
            await asyncio.to_thread(container.stop)


# ------------------------------------------- simulated GPUs: the kind install (issue 32)
async def test_simulated_gpus_as_the_kind_install_runs_them(
    runner: Runner, short_tmp_path: Path
) -> None:
    """``examples/kind-values.yaml``: the plugin and the agent get their GPUs from the
    chart's ConfigMap (no --gpus-file, no extra mount from the test), the plugin
    registers them with the kubelet and allocates, and the agent, sharing the
    kubelet's directory as on a node, reports the same GPUs."""
    node = simulated_node_setup(short_tmp_path)
    assert not any("--gpus-file" in a for a in (*node.plugin.args, *node.agent.args))
    async with KubeletSim(node.kubelet_dir) as kubelet:
        plugin = await asyncio.to_thread(runner.start, node.plugin)
        agent = None
        try:
            conn = await kubelet.wait_registered(node.resource, timeout_s=START_TIMEOUT_S)
            assert len(conn.healthy_ids()) == node.gpu_count * node.units_per_gpu
            ids, response = await kubelet.allocate(node.resource, 50)
            assert len(ids) == 50
            assert response.envs[ENV_UNITS] == "50"
            board = read_board(node.kubelet_dir / HEALTH_FILE_NAME)
            assert board is not None
            assert board.stamp is not None  # who wrote it, for the agent to check
            assert len(board.gpus) == node.gpu_count
            agent = await asyncio.to_thread(runner.start, node.agent)

            async def gpus_reported() -> bool:
                healthy = await agent_metric(node.metrics_port, "metagpu_gpu_healthy")
                return sorted(healthy.values()) == [1.0] * node.gpu_count

            await wait_for("the agent reports the simulated GPUs", gpus_reported, agent)
            await wait_for("mgctl installed", (node.socket_dir / "mgctl").is_file, agent)
            assert plugin.alive()
            assert agent.alive()
        except BaseException:
            print(f"--- device plugin logs ({runner.isolation}) ---\n{plugin.logs()}")
            if agent is not None:
                print(f"--- agent logs ({runner.isolation}) ---\n{agent.logs()}")
            raise
        finally:
            if agent is not None:
                await asyncio.to_thread(agent.stop)
            await asyncio.to_thread(plugin.stop)
    # The plugin removed its board when it stopped: nothing left on the "host".
    assert not (node.kubelet_dir / HEALTH_FILE_NAME).exists()


# ---------------------------------------------------------------- mgctl, CLIs
async def test_the_agent_installs_mgctl_and_a_gpu_container_runs_it(
    runner: Runner, short_tmp_path: Path
) -> None:
    """The agent, as the chart runs it, copies mgctl into its socket directory; another
    container, with that directory read-only, runs it with Python's standard library alone."""
    agent = agent_setup(short_tmp_path)
    spec, socket_dir, socket_mount = agent.spec, agent.socket_dir, agent.socket_mount
    installed = socket_dir / "mgctl"
    container = await asyncio.to_thread(runner.start, spec)
    try:
        await wait_for("mgctl in the socket directory", installed.is_file, container)
    finally:
        await asyncio.to_thread(container.stop)
    # The copy is the module the image's mgctl console script runs (version line aside).
    module = console_scripts()["mgctl"].split(":")[0]
    source = (REPO_ROOT / (module.replace(".", "/") + ".py")).read_text()
    copy = installed.read_text()
    assert [a for a in copy.splitlines() if "_EMBEDDED_VERSION" not in a] == [
        b for b in source.splitlines() if "_EMBEDDED_VERSION" not in b
    ]
    gpu_container = dataclasses.replace(
        spec,
        user=65532,
        group=65532,
        cap_add=(),
        entrypoint="python3",
        args=("-I", "-S", f"{socket_mount}/mgctl", "--help"),
        mounts=(Mount(socket_mount, socket_dir, read_only=True),),
    )
    assert "usage" in run_ok(runner, gpu_container).lower()


def chart_commands() -> set[tuple[str, ...]]:
    """Every ``metagpu`` subcommand a rendered container runs (all modes, every option on)."""
    found: set[tuple[str, ...]] = set()
    for values in ({}, EVERYTHING, {**EVERYTHING, "certs": {"mode": "cert-manager"}}):
        for obj in render(values):
            template = obj.get("spec", {})
            if obj["kind"] == "CronJob":
                template = template["jobTemplate"]["spec"]
            pod = template.get("template", {}).get("spec")
            if not pod:
                continue
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                if c.get("command"):
                    continue  # not the image's entry point (the MPS control daemon)
                args = c.get("args", [])
                words = tuple(
                    a
                    for a in args[
                        : next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
                    ]
                )
                found.add(words)
    return found


def test_every_console_script_and_chart_command_starts(
    runner: Runner, short_tmp_path: Path
) -> None:
    base = webhook_setup(runner, short_tmp_path).spec  # the strictest run spec
    for script in console_scripts():
        out = run_ok(runner, dataclasses.replace(base, entrypoint=script, args=("--help",)))
        assert "usage" in out.lower(), (script, out)
        path = run_ok(
            runner, dataclasses.replace(base, entrypoint="sh", args=("-c", f"command -v {script}"))
        )
        assert path.strip() == f"{VENV}/bin/{script}"
    commands = chart_commands()
    assert {("webhook",), ("device-plugin",), ("agent",)} <= commands, commands
    for words in sorted(commands):
        out = run_ok(runner, dataclasses.replace(base, args=(*words, "--help")))
        assert f"metagpu {' '.join(words)}" in out, out


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_the_image_benchmark_runs_quick(runner: Runner, request: pytest.FixtureRequest) -> None:
    """tests/benchmarks/image_figures.py still works (docs/benchmarks.md quotes it)."""
    isolation = "chroot" if runner.isolation.startswith("chroot") else "namespaces"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "tests" / "benchmarks" / "image_figures.py"),
            "--quick",
            "--image",
            request.config.getoption("--image"),
            "--isolation",
            isolation,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "median" in result.stdout, result.stdout
