"""Benchmark: the built image's size, the webhook's start-up in it, and each entry point's idle RSS.

Usage: ``python tests/benchmarks/image_figures.py --image REF [--quick] [--rounds N]``
(``make image`` first; ``make image-test`` runs it with ``--quick``, one round, so it cannot rot).

Figures, each container run as the chart runs it (tests/image/pods.py), with the
same isolation the smoke test picks (podman with real namespaces, else chroot):

* size: unpacked (the engine's figure) and compressed (the layer blobs of
  ``podman save --format oci-archive``, i.e. what a registry stores and a node
  pulls), per layer with the instruction that made it;
* start-up: from ``podman run`` (container creation included) to the webhook's
  first answer to a real AdmissionReview over TLS, median over rounds; beside
  it the same-run baseline: the same webhook, same config and certificates,
  started from the host's .venv (the image's own cost is the difference);
* RSS at idle: webhook, device plugin and node agent, each 2 s after it is ready
  (first answer; registered with the kubelet simulator; mgctl installed), read
  from /proc/<host pid>/status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from metagpu.kubelet_sim import KubeletSim
from tests.conftest import load_admission_fixture
from tests.harness.kube_api import running_kube_api
from tests.image.containers import Runner, Running, RunSpec, choose_runner
from tests.image.pods import (
    Webhook,
    agent_setup,
    device_plugin_setup,
    post_review,
    webhook_setup,
)

IDLE_S = 2.0
TIMEOUT_S = 60.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def sizes(image: str) -> None:
    """Unpacked and compressed size, and each layer's compressed size and origin."""
    unpacked = int(
        subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Size}}", image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    with tempfile.TemporaryDirectory(prefix="mg-size-") as directory:
        archive = Path(directory) / "image.oci.tar"
        subprocess.run(
            ["podman", "save", "--format", "oci-archive", "-o", str(archive), image],
            capture_output=True,
            check=True,
        )
        with tarfile.open(archive) as tar:

            def blob(digest: str) -> Any:
                member = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
                assert member is not None
                return json.load(member)

            index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
            manifest = blob(index["manifests"][0]["digest"])
            config = blob(manifest["config"]["digest"])
    layers = [layer["size"] for layer in manifest["layers"]]
    history = [h for h in config.get("history", []) if not h.get("empty_layer")]
    print(f"image {image}")
    print(f"  unpacked      {unpacked / 2**20:7.1f} MiB")
    print(f"  compressed    {sum(layers) / 2**20:7.1f} MiB ({len(layers)} layers)")
    for size, step in zip(layers, history, strict=False):
        made_by = " ".join(step.get("created_by", "?").split())[:90]
        print(f"    {size / 2**20:7.1f} MiB  {made_by}")


async def first_answer(webhook: Webhook, alive: Callable[[], bool]) -> None:
    """Post the fixture until the webhook answers it (the poll is the measurement's grain)."""
    fixture = load_admission_fixture("pod-half-gpu.json")
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            if (await post_review(webhook, fixture)).status == 200:
                return
        if not alive():
            raise RuntimeError("the webhook exited before answering")
        await asyncio.sleep(0.005)
    raise RuntimeError(f"no answer within {TIMEOUT_S}s")


@contextlib.asynccontextmanager
async def container(runner: Runner, spec: RunSpec) -> AsyncIterator[Running]:
    running = await asyncio.to_thread(runner.start, spec)
    try:
        yield running
    finally:
        await asyncio.to_thread(running.stop)


async def webhook_start(runner: Runner, rounds: int) -> float:
    """Median start-to-first-answer in the image and from the host venv; returns idle RSS."""
    in_image: list[float] = []
    on_host: list[float] = []
    rss: list[float] = []
    venv_metagpu = Path(sys.executable).parent / "metagpu"
    async with running_kube_api() as (_, url):
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="mg-", dir="/tmp") as directory:
                webhook = await asyncio.to_thread(webhook_setup, runner, Path(directory), url)
                start = time.perf_counter()
                async with container(runner, webhook.spec) as running:
                    await first_answer(webhook, running.alive)
                    in_image.append((time.perf_counter() - start) * 1000)
                    await asyncio.sleep(IDLE_S)
                    rss.append(rss_mib(running.pid()))
                # Baseline: the same args and files, mounts replaced by their host paths.
                args = list(webhook.spec.args)
                for m in webhook.spec.mounts:
                    if m.source is not None:
                        args = [a.replace(m.target, str(m.source)) for a in args]
                start = time.perf_counter()
                process = await asyncio.create_subprocess_exec(
                    str(venv_metagpu),
                    *args,
                    env={"KUBECONFIG": str(Path(directory) / "kube" / "kubeconfig"), "PATH": ""},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                try:
                    await first_answer(webhook, lambda p=process: p.returncode is None)  # type: ignore[misc]
                    on_host.append((time.perf_counter() - start) * 1000)
                finally:
                    process.terminate()
                    await asyncio.wait_for(process.wait(), 20)
    image_ms, host_ms = statistics.median(in_image), statistics.median(on_host)
    print(f"webhook start to first AdmissionReview answer ({rounds} rounds, median)")
    spread = f"min {min(in_image):.0f}, max {max(in_image):.0f}"
    print(f"  in the image  {image_ms:7.0f} ms   ({spread})")
    print(f"  host .venv    {host_ms:7.0f} ms   (baseline; ratio {image_ms / host_ms:.2f})")
    return statistics.median(rss)


async def plugin_rss(runner: Runner) -> float:
    with tempfile.TemporaryDirectory(prefix="mg-", dir="/tmp") as directory:
        plugin = device_plugin_setup(Path(directory), gpu_count=2)
        async with (
            KubeletSim(plugin.kubelet_dir) as kubelet,
            container(runner, plugin.spec) as running,
        ):
            await kubelet.wait_registered(plugin.resource, timeout_s=TIMEOUT_S)
            await asyncio.sleep(IDLE_S)
            return rss_mib(running.pid())


async def agent_rss(runner: Runner) -> float:
    with tempfile.TemporaryDirectory(prefix="mg-", dir="/tmp") as directory:
        agent = agent_setup(Path(directory))
        async with container(runner, agent.spec) as running:
            deadline = time.monotonic() + TIMEOUT_S
            while not (agent.socket_dir / "agent.sock").exists():
                if time.monotonic() > deadline or not running.alive():
                    raise RuntimeError(f"the agent did not start:\n{running.logs()}")
                await asyncio.sleep(0.05)
            await asyncio.sleep(IDLE_S)
            return rss_mib(running.pid())


async def main_async(image: str, rounds: int, isolation: str) -> None:
    with choose_runner(image, "podman", isolation) as runner:
        print(f"isolation: {runner.isolation}")
        if shutil.which("podman"):
            sizes(image)
        webhook = await webhook_start(runner, rounds)
        plugin = await plugin_rss(runner)
        agent = await agent_rss(runner)
    print(f"RSS at idle ({IDLE_S:.0f} s after ready; median of the webhook's rounds)")
    print(f"  webhook       {webhook:7.1f} MiB")
    print(f"  device plugin {plugin:7.1f} MiB  (2 simulated GPUs, 200 meta-devices)")
    print(f"  node agent    {agent:7.1f} MiB  (1 simulated GPU, no API server)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="ghcr.io/metagpu/metagpu:dev")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1 round (the smoke test)")
    parser.add_argument("--isolation", choices=("auto", "namespaces", "chroot"), default="auto")
    args = parser.parse_args()
    asyncio.run(main_async(args.image, 1 if args.quick else args.rounds, args.isolation))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
