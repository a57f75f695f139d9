"""The chart's pods, as containers of the built image: run specs and the clients around them.

Shared by the smoke test (tests/image/test_image_smoke.py) and the image
benchmark (tests/benchmarks/image_figures.py). Every run spec comes from the
chart as helm renders it (:func:`tests.image.containers.spec_from_chart`); what
is added is only what a cluster would supply: Secret/ConfigMap contents
projected as the kubelet does, host directories for hostPath volumes, a free
port (as a chart value), API server credentials, and simulated GPUs
(``--gpus-file``, there being no GPU).
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
import yaml
from prometheus_client.parser import text_string_to_metric_families

from plugin.api.config import PluginConfig
from tests.conftest import REPO_ROOT
from tests.image.containers import (
    Mount,
    Runner,
    Running,
    RunSpec,
    project_volume,
    spec_from_chart,
)
from tests.install.chart import Obj, component, load_rendered_config, one, render
from tests.plugin.builders import gpus, gpus_file_spec, write_yaml
from tests.webhook.http import HttpAnswer

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


# ------------------------------------------------------------ device plugin
@dataclasses.dataclass
class DevicePlugin:
    spec: RunSpec
    resource: str
    units_per_gpu: int
    kubelet_dir: Path


def device_plugin_setup(directory: Path, *, gpu_count: int = 2) -> DevicePlugin:
    """The chart's device plugin container on ``gpu_count`` simulated GPUs; the kubelet's
    device-plugins directory is ``directory/dp`` (serve a KubeletSim there)."""
    objects = render()
    pod = pod_spec(objects, "DaemonSet", "plugin")
    config_map = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "config")
    config = load_rendered_config(objects, config_map, "plugin.yaml", PluginConfig)
    kubelet_dir = directory / "dp"
    sim = directory / "sim"
    sim.mkdir()
    write_yaml(sim / "gpus.yaml", gpus_file_spec(gpus(gpu_count)))
    # No kubelet PodResources socket and no API token here: the plugin says so once
    # and serves on its own policy (the ownership check and the pod watch are tested
    # outside the image, against their harnesses).
    pod_resources = directory / "pr"
    pod_resources.mkdir()
    api_token = directory / "token"
    api_token.mkdir()
    sources = kubelet_volumes(pod, objects, directory / "volumes")
    spec = spec_from_chart(
        pod,
        "device-plugin",
        {
            **sources,
            "device-plugins": kubelet_dir,
            "pod-resources": pod_resources,
            "api-token": api_token,
        },
        extra_args=("--gpus-file", f"{SIM_DIR}/gpus.yaml"),
        extra_mounts=(Mount(SIM_DIR, sim, read_only=True),),
    )
    return DevicePlugin(spec, config.resources[0].name, config.units_per_gpu, kubelet_dir)


# -------------------------------------------------------------------- agent
@dataclasses.dataclass
class NodeAgent:
    spec: RunSpec
    socket_dir: Path
    """The host side of the agent's socket directory (agent.sock, mgctl)."""
    socket_mount: str
    """Where the agent (and every GPU container) sees it."""


def agent_setup(directory: Path) -> NodeAgent:
    """The chart's node agent on one simulated GPU, without an API server (no node name: the
    agent says so and runs without pod names), an empty pod-resources directory."""
    objects = render({"agent": {"metricsPort": free_port()}})
    pod = pod_spec(objects, "DaemonSet", "agent")
    socket_dir = directory / "sock"
    socket_dir.mkdir()
    sim = directory / "sim"
    sim.mkdir()
    write_yaml(sim / "gpus.yaml", gpus_file_spec(gpus(1)))
    pod_resources = directory / "pr"
    pod_resources.mkdir()
    device_plugins = directory / "dp"  # no plugin's health board: the agent's own view
    device_plugins.mkdir()
    sources = kubelet_volumes(pod, objects, directory / "volumes")
    spec = spec_from_chart(
        pod,
        "agent",
        {
            **sources,
            "agent-socket-dir": socket_dir,
            "pod-resources": pod_resources,
            "device-plugins": device_plugins,
        },
        extra_args=("--gpus-file", f"{SIM_DIR}/gpus.yaml"),
        extra_mounts=(Mount(SIM_DIR, sim, read_only=True),),
    )
    (socket_mount,) = [m.target for m in spec.mounts if m.source == socket_dir]
    return NodeAgent(spec, socket_dir, socket_mount)


# ------------------------------------------------- simulated GPUs (plugin.simulatedGpus)
@dataclasses.dataclass
class SimulatedNode:
    """The chart's device plugin and agent in simulated-GPU mode, as kind runs them
    (``examples/kind-values.yaml``): the GPUs come from the chart's ConfigMap, not
    from the test, and the two share the kubelet's device-plugins directory."""

    plugin: RunSpec
    agent: RunSpec
    resource: str
    units_per_gpu: int
    gpu_count: int
    kubelet_dir: Path
    metrics_port: int
    socket_dir: Path


def simulated_node_setup(directory: Path) -> SimulatedNode:
    values = yaml.safe_load((REPO_ROOT / "examples" / "kind-values.yaml").read_text())
    values["agent"] = {"metricsPort": free_port()}
    objects = render(values)
    config = load_rendered_config(objects, "metagpu-plugin-config", "plugin.yaml", PluginConfig)
    gpus_doc = yaml.safe_load(
        one(objects, "ConfigMap", "metagpu-plugin-config")["data"]["simulated-gpus.yaml"]
    )
    kubelet_dir = directory / "dp"  # one host directory: the plugin's socket and board
    kubelet_dir.mkdir()
    pod_resources = directory / "pr"
    pod_resources.mkdir()
    api_token = directory / "token"
    api_token.mkdir()
    socket_dir = directory / "sock"
    socket_dir.mkdir()
    plugin_pod = pod_spec(objects, "DaemonSet", "plugin")
    agent_pod = pod_spec(objects, "DaemonSet", "agent")
    plugin = spec_from_chart(
        plugin_pod,
        "device-plugin",
        {
            **kubelet_volumes(plugin_pod, objects, directory / "plugin-volumes"),
            "device-plugins": kubelet_dir,
            "pod-resources": pod_resources,
            "api-token": api_token,
        },
    )
    agent = spec_from_chart(
        agent_pod,
        "agent",
        {
            **kubelet_volumes(agent_pod, objects, directory / "agent-volumes"),
            "agent-socket-dir": socket_dir,
            "pod-resources": pod_resources,
            "device-plugins": kubelet_dir,
        },
    )
    return SimulatedNode(
        plugin=plugin,
        agent=agent,
        resource=config.resources[0].name,
        units_per_gpu=config.units_per_gpu,
        gpu_count=len(gpus_doc["gpus"]),
        kubelet_dir=kubelet_dir,
        metrics_port=values["agent"]["metricsPort"],
        socket_dir=socket_dir,
    )


async def agent_metric(port: int, name: str) -> dict[str, float]:
    """``name``'s samples on the agent's /metrics, by ``gpu_uuid`` (empty when unreachable)."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            text = await resp.text()
    except aiohttp.ClientError:
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[sample.labels.get("gpu_uuid", "")] = sample.value
    return found
