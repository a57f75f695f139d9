"""The running DRA plugin, end to end: the kubelet-side harness over real unix sockets
and the real protos, the in-test API server, simulated GPUs as captured.

Each test replays what the kubelet v1.36.2 did and compares with what it got
(``tests/fixtures/dra/kubelet-*.json``); the slice is compared with the one the
API server stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.kube import open_api_client
from plugin.dra.config import DraConfig
from plugin.dra.runtime import DraPlugin
from tests.harness.kube_api import FakeKubeApi
from tests.plugin.conftest import wait_until
from tests.plugin.dra.fixtures import (
    CAPTURED_GPUS,
    DRIVER,
    NODE,
    PREPARE_CALLS,
    claim_from_call,
    load,
)
from tests.plugin.dra.kubelet import DraKubelet

SLICE = f"{NODE}-{DRIVER}"


@dataclass
class Running:
    plugin: DraPlugin
    kubelet: DraKubelet
    fake: FakeKubeApi
    root: Path
    gpus_file: Path
    stop: asyncio.Event

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def slice_devices(self) -> list[str] | None:
        obj = self.fake.get("resource.k8s.io/v1", "ResourceSlice", SLICE)
        return None if obj is None else [d["name"] for d in obj["spec"]["devices"]]


def gpus_spec() -> dict[str, Any]:
    return {
        "gpus": [
            {
                "uuid": g.uuid,
                "name": g.name,
                "memory_mib": g.memory_mib,
                "numa_node": g.numa_node,
                "index": g.index,
                "minor_number": g.minor_number,
            }
            for g in CAPTURED_GPUS
        ]
    }


def node(runtime: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "status": {"nodeInfo": {"containerRuntimeVersion": runtime}},
    }


@pytest.fixture
def runtime_version() -> str | None:
    """The node's container runtime; None: no Node object (the check only warns)."""
    return None


@pytest.fixture
async def running(
    short_tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    kube_config_env: Path,
    runtime_version: str | None,
) -> AsyncIterator[Running]:
    fake, _ = kube_api
    if runtime_version is not None:
        fake.put(node(runtime_version))
    root = short_tmp_path
    gpus_file = root / "gpus.yaml"
    gpus_file.write_text(yaml.safe_dump(gpus_spec()))
    config = DraConfig.model_validate(
        {
            "node_name": NODE,
            "plugins_dir": str(root / "plugins"),
            "registry_dir": str(root / "registry"),
            "cdi_dir": str(root / "cdi"),
            "gpus_file": str(gpus_file),
            "health": {"event_timeout_s": 0.1, "recovery_s": 3600, "liveness_interval_s": 0},
            "grace_s": 10,  # longer than any wait below: a stop must not need it
        }
    )
    # a short server-side watch: the fake API's handler ends within the leak check's 2 s
    plugin = DraPlugin(config, open_api=open_api_client, watch_timeout_s=1)
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop), name="dra-plugin-under-test")
    try:
        await asyncio.wait_for(plugin.started.wait(), 10)
        async with DraKubelet(root / "registry") as kubelet:
            yield Running(plugin, kubelet, fake, root, gpus_file, stop)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 10)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def put_claim_of(fake: FakeKubeApi, call: dict[str, Any]) -> dict[str, str]:
    ref, claim = claim_from_call(call)
    fake.put(claim)
    return {"namespace": ref.namespace, "uid": ref.uid, "name": ref.name}


def without_cdi_ids(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer minus the CDI IDs, the one deliberate difference from the capture
    (one CDI device per share, not per GPU: see plugin/dra/cdi.py)."""
    stripped = copy.deepcopy(answer)
    for claim in stripped.get("claims", {}).values():
        for device in claim.get("devices", []):
            device.pop("cdi_device_ids", None)
    return stripped


# ------------------------------------------------------------------ registration
async def test_registration_answers_as_captured(running: Running) -> None:
    (get_info, notify, health) = load("kubelet-registration-exchange.json")
    info = await running.kubelet.register()
    expected = dict(get_info["response"])
    assert info == {**expected, "endpoint": str(running.plugin.config.socket_path)}
    assert Path(info["endpoint"]).name == Path(expected["endpoint"]).name == "dra.sock"
    assert Path(info["endpoint"]).parent.name == DRIVER
    await asyncio.wait_for(running.plugin.registration.registered.wait(), 5)
    assert notify["request"] == {"plugin_registered": True}
    # the kubelet asked for the health stream at once, on the same path; the recording
    # plugin answered UNIMPLEMENTED, we serve it
    assert health["method"] == "/v1alpha1.DRAResourceHealth/NodeWatchResources"
    stream = running.kubelet.watch_health()
    try:
        assert await stream.next() == {"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}
    finally:
        stream.cancel()


# ------------------------------------------------------------------ prepare
@pytest.mark.parametrize("name", PREPARE_CALLS)
async def test_prepare_answers_the_captured_calls(running: Running, name: str) -> None:
    call = load(name)
    put_claim_of(running.fake, call)
    await running.kubelet.register()
    answer = await running.kubelet.replay(call)
    assert without_cdi_ids(answer) == without_cdi_ids(call["response"])
    ((uid, entry),) = answer["claims"].items()
    (device,) = entry["devices"]
    assert device["cdi_device_ids"] == [f"{DRIVER}/gpu={device['share_id']}"]
    (spec_file,) = running.cdi_dir.glob(f"*{uid}*.json")
    assert device["share_id"] in spec_file.read_text()


async def test_prepare_twice_is_the_same_answer(running: Running) -> None:
    call = load("kubelet-node-prepare-consumable-50-units.json")
    put_claim_of(running.fake, call)
    await running.kubelet.register()
    first = await running.kubelet.replay(call)
    assert await running.kubelet.replay(call) == first
    assert len(list(running.cdi_dir.glob("*.json"))) == 1


async def test_unprepare_answers_as_captured_and_removes_the_spec(running: Running) -> None:
    prepare = load("kubelet-node-prepare-consumable-50-units.json")
    unprepare = load("kubelet-node-unprepare-consumable-50-units.json")
    put_claim_of(running.fake, prepare)
    await running.kubelet.register()
    await running.kubelet.replay(prepare)
    assert list(running.cdi_dir.glob("*.json"))
    assert await running.kubelet.replay(unprepare) == unprepare["response"]
    assert list(running.cdi_dir.glob("*.json")) == []
    # again, and for a claim never prepared (captured: the kubelet unprepares after a
    # failed prepare too): still an empty entry per claim
    assert await running.kubelet.replay(unprepare) == unprepare["response"]
    failed = load("kubelet-node-unprepare-after-failed-prepare.json")
    assert await running.kubelet.replay(failed) == failed["response"]


async def test_claims_not_for_this_node_get_an_error_entry_naming_them(running: Running) -> None:
    call = load("kubelet-node-prepare-consumable-50-units.json")
    ref = put_claim_of(running.fake, call)
    claim = running.fake.get("resource.k8s.io/v1", "ResourceClaim", ref["name"], ref["namespace"])
    assert claim is not None
    claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"
    ] = ["node-b"]
    running.fake.put(claim)
    gone = {"namespace": "dra-cap", "uid": "0000-gone", "name": "deleted-gpu-xxxxx"}
    await running.kubelet.register()
    answer = await running.kubelet.prepare([ref, gone])
    assert set(answer["claims"]) == {ref["uid"], gone["uid"]}  # every claim has an entry
    assert answer["claims"][ref["uid"]] == {
        "error": f"claim dra-cap/{ref['name']} is allocated to node node-b, not {NODE}"
    }
    assert answer["claims"][gone["uid"]]["error"].startswith(
        "claim dra-cap/deleted-gpu-xxxxx not found in the API server"
    )
    assert list(running.cdi_dir.glob("*.json")) == []


# ------------------------------------------------------------------ the slice
async def test_the_published_slice_is_the_captured_one(running: Running) -> None:
    await wait_until(lambda: running.slice_devices() == ["gpu-0", "gpu-1"], what="the slice")
    stored = running.fake.get("resource.k8s.io/v1", "ResourceSlice", SLICE)
    assert stored is not None
    expected = load("resourceslice-consumable-accepted.json")["response"]["body"]["spec"]
    assert stored["spec"] == expected


async def test_a_deleted_slice_is_published_again_within_seconds(running: Running) -> None:
    await wait_until(lambda: running.slice_devices() == ["gpu-0", "gpu-1"], what="the slice")
    # what the kubelet does at its start: delete every slice of the node
    running.fake.remove("resource.k8s.io/v1", "ResourceSlice", SLICE)
    assert running.slice_devices() is None
    await wait_until(
        lambda: running.slice_devices() == ["gpu-0", "gpu-1"], timeout_s=5, what="republished"
    )


async def test_a_lost_gpu_leaves_the_slice_and_refuses_new_shares(running: Running) -> None:
    await wait_until(lambda: running.slice_devices() == ["gpu-0", "gpu-1"], what="the slice")
    await running.kubelet.register()
    stream = running.kubelet.watch_health()
    assert await stream.next() == {"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}
    spec = gpus_spec()
    spec["gpus"][1]["xids"] = [79]  # fell off the bus
    running.gpus_file.write_text(yaml.safe_dump(spec))
    await wait_until(lambda: running.slice_devices() == ["gpu-0"], timeout_s=5, what="withdrawn")
    stored = running.fake.get("resource.k8s.io/v1", "ResourceSlice", SLICE)
    assert stored is not None
    assert stored["spec"]["pool"]["generation"] == 2
    claim = load("claim-p50-c-50-units-40gi-allocated.json")  # allocated on gpu-1 before
    running.fake.put(claim)
    meta = claim["metadata"]
    # the kubelet hears of it too: pods holding gpu-1 show it Unhealthy
    assert await stream.next() == {"gpu-0": "HEALTHY", "gpu-1": "UNHEALTHY"}
    answer = await running.kubelet.prepare(
        [{"namespace": meta["namespace"], "uid": meta["uid"], "name": meta["name"]}]
    )
    assert (
        "GPU gpu-1 (GPU-0b1c2d3e-0000-4000-8000-000000000002) is withdrawn: "
        in (answer["claims"][meta["uid"]]["error"])
    )


# ------------------------------------------------------------------ the runtime check
@pytest.mark.parametrize("runtime_version", ["containerd://1.6.20"])
async def test_a_runtime_without_cdi_gets_no_gpus_offered(running: Running) -> None:
    await wait_until(lambda: running.slice_devices() == [], what="an empty slice")
    call = load("kubelet-node-prepare-consumable-50-units.json")
    put_claim_of(running.fake, call)
    await running.kubelet.register()
    answer = await running.kubelet.replay(call)
    (entry,) = answer["claims"].values()
    assert "containerd://1.6.20 has no CDI support" in entry["error"]


@pytest.mark.parametrize("runtime_version", ["containerd://2.1.0"])
async def test_a_runtime_with_cdi_gets_every_gpu(running: Running) -> None:
    await wait_until(lambda: running.slice_devices() == ["gpu-0", "gpu-1"], what="the slice")


async def test_liveness_rounds_of_a_healthy_node_cost_no_publish(running: Running) -> None:
    publisher = running.plugin.publisher
    assert publisher is not None
    # once the first list is in, its verdict (maybe "missing", if it raced the create)
    # has been acted on; from then on only our own ADDED event arrives
    await asyncio.wait_for(publisher.watching.wait(), 5)
    await wait_until(publisher.in_sync.is_set, what="the slice in sync")
    published = publisher.published
    for _ in range(3):  # what every liveness_interval_s does to the board
        running.plugin.board.count_liveness({g.uuid: True for g in CAPTURED_GPUS})
    assert publisher.in_sync.is_set()  # not woken: nothing the slice shows changed
    assert publisher.published == published
