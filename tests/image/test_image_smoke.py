"""The built image, run the way the chart runs it (``make image-test``).

Every container's user, group, read-only root, capabilities and mounts come
from the chart as helm renders it (:func:`tests.image.containers.spec_from_chart`);
the test adds only what a cluster would supply: Secret/ConfigMap contents
projected like the kubelet does, host directories for hostPath volumes, a free
port (as a chart value) and simulated GPUs (``--gpus-file``, there being no GPU).
Clients run outside the container: a TLS client that trusts only the CA from
``metagpu certs generate``, and the project's kubelet simulator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import socket
import ssl
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from plugin.api.config import PluginConfig
from plugin.api.resources import ENV_UNITS
from plugin.kubelet_sim import KubeletSim
from tests.conftest import REPO_ROOT, load_admission_fixture
from tests.harness.kube_api import FakeKubeApi
from tests.image.containers import (
    Mount,
    Runner,
    Running,
    RunSpec,
    project_volume,
    spec_from_chart,
)
from tests.install.chart import (
    EVERYTHING,
    Obj,
    component,
    load_rendered_config,
    one,
    render,
)
from tests.plugin.builders import gpus, gpus_file_spec, write_yaml
from tests.webhook.http import HttpAnswer
from tests.webhook.test_admission_fixtures import half_gpu, patched, validate_like_the_api_server

pytestmark = pytest.mark.image

VENV = "/opt/metagpu/venv"
"""Where the Dockerfile installs metagpu (its PATH leads there)."""
SIM_DIR = "/etc/metagpu-sim"
"""Where the simulated GPUs file is mounted (the test's one addition to the plugin pod)."""
START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A free port below the ephemeral range: a port from ``bind(0)`` can be handed out again as
    the source port of the container's own outgoing connections (the webhook dials the API
    server before it listens), and then the listener cannot bind it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(20000, min(low, 32768)), 200):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port found between 20000 and {low}")


def pod_spec(objects: list[Obj], kind: str, name: str) -> Obj:
    spec: Obj = component(objects, kind, name)["spec"]["template"]["spec"]
    return spec


def kubelet_volumes(
    pod: Obj,
    objects: list[Obj],
    directory: Path,
    *,
    secrets: Mapping[str, Mapping[str, bytes]] = {},
) -> dict[str, Path]:
    """Host directories for the pod's ConfigMap and Secret volumes, filled as the kubelet
    fills them: the listed items (or every key), defaultMode, group fsGroup."""
    fs_group = int((pod.get("securityContext") or {}).get("fsGroup", 0))
    sources: dict[str, Path] = {}
    for volume in pod.get("volumes") or []:
        if "configMap" in volume:
            source = volume["configMap"]
            data: Mapping[str, str | bytes] = one(objects, "ConfigMap", source["name"])["data"]
        elif "secret" in volume:
            source = volume["secret"]
            data = secrets[source["secretName"]]
        else:
            continue
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        files = {item["path"]: data[item["key"]] for item in items}
        sources[volume["name"]] = project_volume(
            directory / volume["name"], files, mode=source.get("defaultMode", 0o644), gid=fs_group
        )
    return sources


@contextmanager
def started(runner: Runner, spec: RunSpec) -> Iterator[Running]:
    container = runner.start(spec)
    try:
        yield container
    except BaseException:
        print(f"--- container logs ({runner.isolation}) ---\n{container.logs()}")
        raise
    finally:
        container.stop()


async def wait_for(what: str, probe: Callable[[], Any], container: Running) -> None:
    """Re-check ``probe`` (async or not) until it holds; fail at the timeout or if the container
    exits first (with its logs)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        result = probe()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if not container.alive():
            raise AssertionError(f"container exited before {what}:\n{container.logs()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {START_TIMEOUT_S}s:\n{container.logs()}")
        await asyncio.sleep(0.05)


def run_ok(runner: Runner, spec: RunSpec) -> str:
    result = runner.run(spec)
    assert result.returncode == 0, (
        f"{spec.entrypoint or 'metagpu'} {' '.join(spec.args)} exited {result.returncode} "
        f"({runner.isolation}):\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def console_scripts() -> dict[str, str]:
    """``[project.scripts]``: console script name -> ``module:function``."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    scripts: dict[str, str] = project["scripts"]
    return scripts


# ------------------------------------------------------------------ webhook
@dataclasses.dataclass
class Webhook:
    spec: RunSpec
    port: int
    service: Obj
    ca: Path


KUBECONFIG_DIR = "/var/run/metagpu-test"
"""Where the webhook finds a kubeconfig for the test's API server (a cluster mounts a
service account token instead)."""


def webhook_setup(runner: Runner, directory: Path, kube_url: str | None = None) -> Webhook:
    """The chart's webhook pod, with a serving certificate from ``metagpu certs generate``;
    with ``kube_url``, credentials for that API server (the webhook looks namespaces up)."""
    port = free_port()
    objects = render({"webhook": {"port": port}})
    pod = pod_spec(objects, "Deployment", "webhook")
    service: Obj = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"][
        "service"
    ]
    bare = spec_from_chart(pod, "webhook", {"config": directory, "tls": directory})
    certs = directory / "certs"
    certs.mkdir()
    os.chown(certs, bare.user, bare.group)
    # As the webhook's user, read-only root, a writable directory of its own.
    run_ok(
        runner,
        dataclasses.replace(
            bare,
            args=(
                "certs",
                "generate",
                "--out",
                "/certs",
                "--service",
                service["name"],
                "--namespace",
                service["namespace"],
            ),
            mounts=(Mount("/certs", certs, read_only=False),),
        ),
    )
    tls_secret = next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "tls")
    secret = {name: (certs / name).read_bytes() for name in ("ca.crt", "tls.crt", "tls.key")}
    sources = kubelet_volumes(pod, objects, directory / "volumes", secrets={tls_secret: secret})
    spec = spec_from_chart(pod, "webhook", sources)
    if kube_url is not None:
        kube = project_volume(
            directory / "kube", {"kubeconfig": kubeconfig(kube_url)}, mode=0o444, gid=0
        )
        spec = dataclasses.replace(
            spec,
            mounts=(*spec.mounts, Mount(KUBECONFIG_DIR, kube, read_only=True)),
            env={**spec.env, "KUBECONFIG": f"{KUBECONFIG_DIR}/kubeconfig"},
        )
    return Webhook(spec, port, service, certs / "ca.crt")


def kubeconfig(url: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        }
    )


async def post_review(webhook: Webhook, body: Obj | None) -> HttpAnswer:
    """POST (or, without a body, GET /healthz) as the API server would: by the Service's DNS
    name, trusting only the generated CA."""
    context = ssl.create_default_context(cafile=str(webhook.ca))
    name = f"{webhook.service['name']}.{webhook.service['namespace']}.svc"
    url = f"https://127.0.0.1:{webhook.port}"
    async with aiohttp.ClientSession() as session:
        if body is None:
            request = session.get(url + "/healthz", ssl=context, server_hostname=name)
        else:
            request = session.post(
                url + webhook.service.get("path", "/"),
                json=body,
                ssl=context,
                server_hostname=name,
            )
        async with request as r:
            return HttpAnswer(r.status, await r.text())


async def healthy(webhook: Webhook) -> bool:
    try:
        return (await post_review(webhook, None)).status == 200
    except aiohttp.ClientConnectorError:
        return False


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
    objects = render()
    pod = pod_spec(objects, "DaemonSet", "plugin")
    config_map = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "config")
    config = load_rendered_config(objects, config_map, "plugin.yaml", PluginConfig)
    resource = config.resources[0].name
    kubelet_dir = short_tmp_path / "dp"
    sim = short_tmp_path / "sim"
    sim.mkdir()
    write_yaml(sim / "gpus.yaml", gpus_file_spec(gpus(2)))
    sources = kubelet_volumes(pod, objects, short_tmp_path / "volumes")
    spec = spec_from_chart(
        pod,
        "device-plugin",
        {**sources, "device-plugins": kubelet_dir},
        extra_args=("--gpus-file", f"{SIM_DIR}/gpus.yaml"),
        extra_mounts=(Mount(SIM_DIR, sim, read_only=True),),
    )
    assert spec.user == 0
    async with KubeletSim(kubelet_dir) as kubelet:
        container = await asyncio.to_thread(runner.start, spec)
        try:
            conn = await kubelet.wait_registered(resource, timeout_s=START_TIMEOUT_S)
            assert len(conn.healthy_ids()) == 2 * config.units_per_gpu
            ids, response = await kubelet.allocate(resource, 50)
            assert len(ids) == 50
            assert response.envs[ENV_UNITS] == "50"
            assert container.alive()
        except BaseException:
            print(f"--- device plugin logs ({runner.isolation}) ---\n{container.logs()}")
            raise
        finally:
            await asyncio.to_thread(container.stop)


# ---------------------------------------------------------------- mgctl, CLIs
async def test_the_agent_installs_mgctl_and_a_gpu_container_runs_it(
    runner: Runner, short_tmp_path: Path
) -> None:
    """The agent, as the chart runs it, copies mgctl into its socket directory; another
    container, with that directory read-only, runs it with Python's standard library alone."""
    objects = render({"agent": {"metricsPort": free_port()}})
    pod = pod_spec(objects, "DaemonSet", "agent")
    socket_dir = short_tmp_path / "sock"
    socket_dir.mkdir()
    sim = short_tmp_path / "sim"
    sim.mkdir()
    write_yaml(sim / "gpus.yaml", gpus_file_spec(gpus(1)))
    pod_resources = short_tmp_path / "pr"
    pod_resources.mkdir()
    sources = kubelet_volumes(pod, objects, short_tmp_path / "volumes")
    spec = spec_from_chart(
        pod,
        "agent",
        {**sources, "agent-socket-dir": socket_dir, "pod-resources": pod_resources},
        extra_args=("--gpus-file", f"{SIM_DIR}/gpus.yaml"),
        extra_mounts=(Mount(SIM_DIR, sim, read_only=True),),
    )
    (socket_mount,) = [m.target for m in spec.mounts if m.source == socket_dir]
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
