"""The agent on a DRA node: a claim's share, from PodResources and the DRA plugin's CDI spec.

The spec files are written by the DRA plugin's own :class:`~plugin.dra.prepare.Preparer`
from captured claims, and the kubelet's answer comes over gRPC from the harness, fed
with what that Preparer answered, so neither the spec format nor the message shapes
can drift from what the agent reads. A device-plugin share next to it must be
accounted exactly as before.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest

from plugin._pb import podresources_v1_pb2 as pb
from plugin.agent.accounting import Allocation, Snapshot
from plugin.agent.agent import Agent
from plugin.agent.containers import ContainerKey
from plugin.agent.dra_shares import (
    MAX_SPEC_BYTES,
    ClaimDevice,
    DraShareReader,
    allocations_of_claims,
)
from plugin.agent.enforcement import Report
from plugin.agent.identity import Caller
from plugin.agent.podresources import PodResourcesReader
from plugin.agent.views import device_list
from plugin.api.config import PluginConfig
from plugin.dra.claims import ClaimRef
from plugin.dra.prepare import PreparedDevice, Preparer
from plugin.gpu.simulated import SimulatedGpu, SimulatedGpus, SimulatedGpusFile
from plugin.kubelet.podresources import PodResourcesClient
from tests.agent.builders import index_of, place_in_container, pod, ref
from tests.agent.test_metrics import Scrape
from tests.harness.podresources import FakePodResources, running_pod_resources
from tests.plugin.dra.fixtures import CAPTURED_GPUS, DRIVER, NODE, dra_config, load

R = "cnvrg.io/metagpu"
U0, U1 = CAPTURED_GPUS[0].uuid, CAPTURED_GPUS[1].uuid
P50 = "claim-p50-a-50-units-40gi-allocated.json"
"""50 units and 40Gi of gpu-0, as the scheduler allocated them."""
MEMORY_ONLY = "claim-10gi-memory-only-allocated.json"
"""10Gi asked, units left to the default (1): memory apart from units."""


def ref_of(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def preparer(cdi_dir: Path, **overrides: Any) -> Preparer:
    """The DRA plugin's Preparer on the captured node, writing into ``cdi_dir``."""
    p = Preparer(config=dra_config(cdi_dir, **overrides), node_name=NODE)
    p.offer(CAPTURED_GPUS, withdrawn={})
    return p


def prepare(cdi_dir: Path, claim: dict[str, Any]) -> tuple[PreparedDevice, ...]:
    """What the DRA plugin answers the kubelet; it writes the specs into ``cdi_dir``."""
    return preparer(cdi_dir).prepare(ref_of(claim), claim)


@dataclass
class Rig:
    agent: Agent
    kubelet: FakePodResources
    backend: SimulatedGpus
    cdi_dir: Path
    socket: Path

    def give(self, pod_name: str, claim: dict[str, Any], container: str = "main") -> None:
        """The kubelet prepared ``claim`` (through the real Preparer) for the container."""
        meta = claim["metadata"]
        self.kubelet.assign_claim(
            "ml",
            pod_name,
            container,
            claim_namespace=meta["namespace"],
            claim_name=meta["name"],
            driver=DRIVER,
            devices=prepare(self.cdi_dir, claim),
        )

    def use(self, uuid: str, *procs: tuple[int, int]) -> None:
        self.backend.update(uuid, processes=[{"pid": p, "used_memory_mib": m} for p, m in procs])

    async def snapshot(self) -> Snapshot:
        return (await self.agent.cycle()).snapshot

    async def listed(self) -> pb.ListPodResourcesResponse:
        """The kubelet's answer as sent, for its message shape."""
        client = PodResourcesClient(self.socket, timeout_s=5, mount_into="the test")
        try:
            return await client.list()
        finally:
            await client.close()


@pytest.fixture
async def rig(short_tmp_path: Path, tmp_path: Path) -> AsyncIterator[Rig]:
    proc_root = tmp_path / "proc"
    for pid, owner in ((101, ref("a")), (201, ref("b")), (301, ref("c", "side"))):
        place_in_container(proc_root, pid, owner)
    backend = SimulatedGpus(
        SimulatedGpusFile(
            gpus=[
                SimulatedGpu(uuid=g.uuid, name=g.name, memory_mib=g.memory_mib, index=g.index)
                for g in CAPTURED_GPUS
            ]
        )
    )
    cdi_dir = tmp_path / "cdi"
    sock = short_tmp_path / "kubelet.sock"
    config = PluginConfig.model_validate(
        {"agent": {"proc_root": str(proc_root), "dra_cdi_dir": str(cdi_dir)}}
    )
    async with running_pod_resources(sock) as kubelet:
        reader = PodResourcesReader(
            sock,
            timeout_s=5,
            dra=DraShareReader(config.agent.dra_cdi_dir, driver=config.agent.dra_driver),
        )
        agent = Agent(
            config,
            backend=backend,
            allocations=reader,
            index=index_of(pod("a"), pod("b"), pod("c", containers=("main", "side"))),
        )
        try:
            yield Rig(agent, kubelet, backend, cdi_dir, sock)
        finally:
            await reader.close()


def units_allocated(s: Snapshot, uuid: str) -> int:
    gpu = s.gpu(uuid)
    assert gpu is not None, uuid
    return gpu.units_allocated


NODE_CALLER = Caller(pid=1, uid=0, scope="node", container=None, via="host root")


def scrape(rig: Rig) -> Scrape:
    return Scrape(generate_latest(rig.agent.metrics.registry).decode())


async def test_a_prepared_share_is_accounted_as_the_containers_share(rig: Rig) -> None:
    rig.give("a", load(P50))
    rig.kubelet.assign("ml", "b", "main", R, [f"{U1}::{u}" for u in range(25)])
    rig.use(U0, (101, 45000))  # over the 40Gi the claim was charged
    rig.use(U1, (201, 1000))

    result = await rig.agent.cycle()
    s = result.snapshot

    (share,) = s.shares_of(ContainerKey("ml", "a", "main"))
    assert (share.gpu_uuid, share.units, share.memory_limit_mib) == (U0, 50, 40960)
    assert share.resource == DRIVER
    assert share.pids == (101,)
    assert share.memory_used_mib == 45000
    assert share.over_limit
    assert units_allocated(s, U0) == 50
    # The device-plugin share beside it: 25 meta-devices, the formula's memory.
    (dp,) = s.shares_of(ContainerKey("ml", "b", "main"))
    assert (dp.gpu_uuid, dp.units, dp.memory_limit_mib, dp.resource) == (U1, 25, 20480, R)
    assert not s.unresolved
    assert not s.problems

    # Enforcement: the same decision a device-plugin share over its limit gets.
    (report,) = result.decisions
    assert isinstance(report, Report)
    assert report.share.key == ContainerKey("ml", "a", "main")

    doc = device_list(s, NODE_CALLER, node="n1")
    gpu0 = next(g for g in doc["items"] if g["uuid"] == U0)
    assert gpu0["unitsAllocated"] == 50
    assert gpu0["unitsFree"] == 50
    (shown,) = gpu0["shares"]
    assert (shown["pod"], shown["units"], shown["memoryLimitMiB"], shown["resource"]) == (
        "a",
        50,
        40960,
        DRIVER,
    )
    assert shown["overLimit"] is True
    assert doc["unresolvedShares"] == []

    m = scrape(rig)
    labels = {"namespace": "ml", "pod": "a", "container": "main", "gpu_uuid": U0}
    assert m.value("metagpu_container_units", **labels) == 50
    assert m.value("metagpu_container_memory_limit_bytes", **labels) == 40960 * 2**20
    assert m.value("metagpu_container_memory_over_limit", **labels) == 1
    assert m.value("metagpu_container_units", pod="b", gpu_uuid=U1) == 25


async def test_memory_asked_apart_from_units_is_the_limit(rig: Rig) -> None:
    rig.give("a", load(MEMORY_ONLY))
    rig.use(U0, (101, 9000))
    (share,) = (await rig.snapshot()).shares_of(ContainerKey("ml", "a", "main"))
    # 1 unit would allow 819 MiB by the formula; the claim was charged 10Gi.
    assert (share.units, share.memory_limit_mib, share.over_limit) == (1, 10240, False)


async def test_a_missing_spec_file_is_reported_with_its_reason(rig: Rig) -> None:
    claim = load(P50)
    rig.give("a", claim)
    preparer(rig.cdi_dir).unprepare(ref_of(claim))  # the spec is gone, the kubelet still lists it
    rig.use(U0, (101, 1000))

    s = await rig.snapshot()

    (u,) = s.unresolved
    assert u.key == ContainerKey("ml", "a", "main")
    assert u.claim == f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
    share_id = claim["status"]["allocation"]["devices"]["results"][0]["shareID"]
    assert u.device == f"{DRIVER}/gpu={share_id}"
    assert "no CDI spec" in u.reason
    assert str(rig.cdi_dir) in u.reason
    # Usage is still shown, as for any container without units: no limit, no enforcement.
    (share,) = s.shares_of(u.key)
    assert (share.units, share.allocated) == (0, False)
    assert any("no CDI spec" in p for p in s.problems)

    doc = device_list(s, NODE_CALLER, node="n1")
    (shown,) = doc["unresolvedShares"]
    assert shown["pod"] == "a"
    assert "no CDI spec" in shown["reason"]
    container = Caller(pid=2, uid=1000, scope="container", container=ref("b"), via="pod container")
    assert device_list(s, container, node="n1")["unresolvedShares"] == []
    assert scrape(rig).value("metagpu_share_unresolved", pod="a", device=u.device) == 1


async def test_a_missing_cdi_dir_says_what_to_mount(rig: Rig) -> None:
    rig.kubelet.assign_claim(
        "ml",
        "a",
        "main",
        claim_namespace="ml",
        claim_name="x",
        driver=DRIVER,
        devices=[PreparedDevice((), "localhost", "gpu-0", (f"{DRIVER}/gpu=abc",), "abc")],
    )
    (u,) = (await rig.snapshot()).unresolved
    assert "does not exist: mount the host's CDI spec directory" in u.reason


async def test_each_share_counts_once_despite_the_kubelets_cumulative_cdi_list(rig: Rig) -> None:
    claim = load(P50)
    results = claim["status"]["allocation"]["devices"]["results"]
    second = copy.deepcopy(results[0])
    second.update(request="gpu2", shareID="11111111-2222-4333-8444-555555555555")
    second["consumedCapacity"] = {"memory": "10Gi", "units": "20"}
    results.append(second)
    rig.give("a", claim)
    # The second ClaimResource repeats the first one's CDI ID, as a real kubelet sends it.
    (claim_listed,) = (await rig.listed()).pod_resources[0].containers[0].dynamic_resources
    assert [len(r.cdi_devices) for r in claim_listed.claim_resources] == [1, 2]

    s = await rig.snapshot()
    (share,) = s.shares_of(ContainerKey("ml", "a", "main"))
    assert (share.units, share.memory_limit_mib) == (70, 40960 + 10240)
    assert units_allocated(s, U0) == 70


async def test_a_claim_shared_by_two_containers_counts_once_on_its_gpu(rig: Rig) -> None:
    claim = load(P50)
    rig.give("c", claim, container="main")
    rig.give("c", claim, container="side")
    rig.use(U0, (301, 1000))
    s = await rig.snapshot()
    # Each container was told the share's limits, so each is held to them ...
    for container in ("main", "side"):
        (share,) = s.shares_of(ContainerKey("ml", "c", container))
        assert (share.units, share.memory_limit_mib) == (50, 40960)
    # ... but the GPU gave the share once.
    assert units_allocated(s, U0) == 50


async def test_another_drivers_claims_are_not_shares(rig: Rig) -> None:
    rig.kubelet.assign_claim(
        "ml",
        "a",
        "main",
        claim_namespace="ml",
        claim_name="nv",
        driver="gpu.nvidia.com",
        devices=[PreparedDevice((), "localhost", "gpu-0", ("nvidia.com/gpu=gpu-0",), None)],
    )
    s = await rig.snapshot()
    assert s.shares == ()
    assert s.unresolved == ()


# ------------------------------------------------------------ the reader alone
KEY = ContainerKey("ml", "a", "main")


def device(*cdi_ids: str, driver: str = DRIVER) -> ClaimDevice:
    return ClaimDevice(KEY, "ml/c", driver, "localhost", "gpu-0", cdi_ids)


def resolve(cdi_dir: Path, devices: Sequence[ClaimDevice]) -> Allocation:
    (allocation,) = DraShareReader(cdi_dir, driver=DRIVER).resolve(devices)
    return allocation


def spec_files(cdi_dir: Path) -> list[Path]:
    return sorted(cdi_dir.glob("*.json"))


def test_a_changed_spec_is_read_again_and_a_removed_one_forgotten(tmp_path: Path) -> None:
    (prepared,) = prepare(tmp_path, load(P50))
    (cdi_id,) = prepared.cdi_device_ids
    reader = DraShareReader(tmp_path, driver=DRIVER)
    (first,) = reader.resolve([device(cdi_id)])
    assert first.grants[0].units == 50

    (path,) = spec_files(tmp_path)
    spec = json.loads(path.read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    spec["devices"][0]["containerEdits"]["env"] = [
        "METAGPU_UNITS=30" if e.startswith("METAGPU_UNITS=") else e for e in env
    ]
    path.write_text(json.dumps(spec))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a new mtime, surely
    (second,) = reader.resolve([device(cdi_id)])
    assert second.grants[0].units == 30

    path.unlink()
    (third,) = reader.resolve([device(cdi_id)])
    assert third.grants == ()
    assert "no CDI spec" in third.unresolved[0].reason


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param("{not json", "cannot be read", id="not-json"),
        pytest.param('{"kind": "nvidia.com/gpu", "devices": []}', "kind is", id="other-kind"),
        pytest.param("x" * (MAX_SPEC_BYTES + 1), "more than a share's spec", id="too-big"),
    ],
)
def test_an_unreadable_spec_is_named_in_the_reason(
    tmp_path: Path, content: str, reason: str
) -> None:
    (prepared,) = prepare(tmp_path, load(P50))
    (path,) = spec_files(tmp_path)
    path.write_text(content)
    got = resolve(tmp_path, [device(*prepared.cdi_device_ids)])
    assert got.grants == ()
    assert "cannot be read" in got.unresolved[0].reason
    assert reason in got.unresolved[0].reason


def test_a_spec_without_the_share_env_is_named(tmp_path: Path) -> None:
    (prepared,) = prepare(tmp_path, load(P50))
    (path,) = spec_files(tmp_path)
    spec = json.loads(path.read_text())
    spec["devices"][0]["containerEdits"]["env"] = ["NVIDIA_VISIBLE_DEVICES=" + U0]
    path.write_text(json.dumps(spec))
    got = resolve(tmp_path, [device(*prepared.cdi_device_ids)])
    assert "METAGPU_UNITS is None, not a whole number" in got.unresolved[0].reason


def test_two_files_defining_one_device_are_refused(tmp_path: Path) -> None:
    (prepared,) = prepare(tmp_path, load(P50))
    (path,) = spec_files(tmp_path)
    (tmp_path / path.name.replace(".json", "-copy.json")).write_bytes(path.read_bytes())
    got = resolve(tmp_path, [device(*prepared.cdi_device_ids)])
    assert "defined by two spec files" in got.unresolved[0].reason


def test_a_device_with_no_cdi_id_of_ours_is_reported(tmp_path: Path) -> None:
    got = resolve(tmp_path, [device("nvidia.com/gpu=GPU-x")])
    (u,) = got.unresolved
    assert u.device == "localhost/gpu-0"
    assert f"no CDI device of kind {DRIVER}/gpu" in u.reason


def test_the_extra_cdi_device_is_not_a_second_share(tmp_path: Path) -> None:
    claim = load(P50)
    (prepared,) = preparer(tmp_path, extra_cdi_device="nvidia.com/gpu={uuid}").prepare(
        ref_of(claim), claim
    )
    assert len(prepared.cdi_device_ids) == 2
    got = resolve(tmp_path, [device(*prepared.cdi_device_ids)])
    assert [g.units for g in got.grants] == [50]
    assert got.unresolved == ()


def test_pure_join_without_files() -> None:
    """allocations_of_claims is the whole rule; no file is needed to check it."""
    got = allocations_of_claims(
        [device("gpu.metagpu.io/gpu=s1"), device("gpu.metagpu.io/gpu=s1", "gpu.metagpu.io/gpu=s2")],
        {"gpu.metagpu.io/gpu=s1": "bad file", "gpu.metagpu.io/gpu=s2": "also bad"},
        driver=DRIVER,
        missing="missing",
    )
    (allocation,) = got
    assert [(u.device, u.reason) for u in allocation.unresolved] == [
        ("gpu.metagpu.io/gpu=s1", "bad file"),
        ("gpu.metagpu.io/gpu=s2", "also bad"),
    ]
