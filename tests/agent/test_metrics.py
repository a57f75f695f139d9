"""The metrics endpoint, scraped over HTTP and parsed with prometheus-client's own parser."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from plugin.agent.accounting import Allocation, Snapshot, build_snapshot
from plugin.agent.enforcement import EnforcementRecord
from plugin.agent.metrics import CONTAINER_LABELS, AgentMetrics
from plugin.agent.probes import ProbeServer, ProbeState
from plugin.gpu.mps import MpsNode, MpsStatus
from tests.agent.builders import gpu, gpu_uuid, index_of, key, pod, reading, ref

R = "cnvrg.io/metagpu"
U0, U1 = gpu_uuid(0), gpu_uuid(1)
MIB = 1 << 20


def snapshot(*, with_b: bool = True) -> Snapshot:
    index = index_of(pod("a"), pod("b"))
    a, b = ref("a"), ref("b")
    procs = [(101, 25000), (900, 100)] + ([(201, 1000)] if with_b else [])
    allocations = [Allocation(key("a"), R, tuple(f"{U0}::{u}" for u in range(25)))]
    if with_b:
        allocations.append(Allocation(key("b"), R, tuple(f"{U0}::{u}" for u in range(25, 75))))
    return build_snapshot(
        [reading(gpu(0), procs, util=60), reading(gpu(1), [], util=None)],
        allocations,
        {101: a.container_id, 201: b.container_id, 900: None},
        directory=index,
        units_per_gpu=100,
        gpu_resources={U0: R, U1: R},
        resources=[R],
        taken_at=1_700_000_000,
        stale=frozenset({"pods"}),
    )


class Scrape:
    """Samples by sample name (a counter's family ``x`` has samples ``x_total``)."""

    def __init__(self, text: str) -> None:
        self.by_name: dict[str, list[Sample]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.by_name.setdefault(sample.name, []).append(sample)

    def samples(self, name: str) -> list[Sample]:
        return self.by_name[name]

    def value(self, name: str, **labels: str) -> float:
        matches = [s.value for s in self.samples(name) if labels.items() <= s.labels.items()]
        assert len(matches) == 1, (name, labels, self.samples(name))
        return matches[0]


@pytest.fixture
async def served() -> AsyncIterator[tuple[AgentMetrics, str, list[float | None]]]:
    metrics = AgentMetrics(version="1.2.3", backend="simulated", node="node-a")
    age: list[float | None] = [None]
    server = ProbeServer(
        ProbeState(metrics=metrics, last_cycle_age_s=lambda: age[0], stuck_after_s=45),
        "127.0.0.1:0",
    )
    async with server:
        yield metrics, f"http://127.0.0.1:{server.port}", age


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, resp.headers["Content-Type"], await resp.text()


async def test_scrape_and_parse(served: tuple[AgentMetrics, str, list[float | None]]) -> None:
    metrics, url, _ = served
    metrics.update(snapshot())
    metrics.count([EnforcementRecord("report", (key("a"), U0))])
    status, content_type, text = await get(url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=")
    m = Scrape(text)

    g0 = {"gpu_uuid": U0, "gpu_index": "0", "gpu_model": "NVIDIA A100-SXM4-80GB", "resource": R}
    assert m.value("metagpu_gpu_units_total", **g0) == 100
    assert m.value("metagpu_gpu_units_allocated", **g0) == 75
    assert m.value("metagpu_gpu_memory_total_bytes", **g0) == 81920 * MIB
    assert m.value("metagpu_gpu_memory_used_bytes", **g0) == 26100 * MIB
    assert m.value("metagpu_gpu_memory_unattributed_bytes", **g0) == 100 * MIB
    assert m.value("metagpu_gpu_utilization_ratio", **g0) == 0.6
    assert m.value("metagpu_gpu_healthy", **g0) == 1
    assert m.value("metagpu_gpu_processes", **g0) == 3
    # GPU 1's driver cannot tell utilisation: no sample rather than a made-up 0
    assert [s.labels["gpu_index"] for s in m.samples("metagpu_gpu_utilization_ratio")] == ["0"]

    a = {"namespace": "ml", "pod": "a", "container": "main", "gpu_uuid": U0}
    assert m.value("metagpu_container_units", **a) == 25
    assert m.value("metagpu_container_memory_limit_bytes", **a) == 20480 * MIB
    assert m.value("metagpu_container_memory_used_bytes", **a) == 25000 * MIB
    assert m.value("metagpu_container_memory_over_limit", **a) == 1
    assert m.value("metagpu_container_memory_over_limit", pod="b") == 0
    assert m.value("metagpu_container_processes", **a) == 1
    for family in (
        "metagpu_container_units",
        "metagpu_container_memory_limit_bytes",
        "metagpu_container_memory_used_bytes",
        "metagpu_container_processes",
    ):
        for sample in m.samples(family):
            assert set(CONTAINER_LABELS) <= sample.labels.keys()
            assert sample.labels["container"]

    assert m.value("metagpu_enforcement_actions_total", action="report") == 1
    assert m.value("metagpu_enforcement_actions_total", action="kill") == 0
    assert m.value("metagpu_agent_source_up", source="pods") == 0
    assert m.value("metagpu_agent_source_up", source="podresources") == 1
    assert m.value("metagpu_agent_info", version="1.2.3", backend="simulated", node="node-a") == 1
    assert m.value("metagpu_agent_last_cycle_timestamp_seconds") == 1_700_000_000


async def test_departed_containers_disappear(
    served: tuple[AgentMetrics, str, list[float | None]],
) -> None:
    metrics, url, _ = served
    metrics.update(snapshot())
    metrics.update(snapshot(with_b=False))
    m = Scrape((await get(url + "/metrics"))[2])
    assert {s.labels["pod"] for s in m.samples("metagpu_container_units")} == {"a"}


async def test_probes(served: tuple[AgentMetrics, str, list[float | None]]) -> None:
    _, url, age = served
    assert (await get(url + "/readyz"))[0] == 503
    assert (await get(url + "/healthz"))[0] == 200  # starting is not stuck
    age[0] = 3.0
    assert (await get(url + "/readyz"))[0] == 200
    age[0] = 46.0
    status, _, text = await get(url + "/healthz")
    assert status == 503
    assert "no accounting cycle finished for 46 s" in text


def with_policy(the_pod: dict[str, object], policy: str) -> dict[str, object]:
    meta = the_pod["metadata"]
    assert isinstance(meta, dict)
    meta["annotations"] = {"metagpu.io/compute-policy": policy}
    return the_pod


def mps_snapshot(mps: MpsNode) -> Snapshot:
    """``a`` (fixed, 25 units) and ``b`` (balance, 50 units) on GPU 0."""
    index = index_of(with_policy(pod("a"), "fixed"), with_policy(pod("b"), "balance"))
    return build_snapshot(
        [reading(gpu(0), [], util=None)],
        [
            Allocation(key("a"), R, tuple(f"{U0}::{u}" for u in range(25))),
            Allocation(key("b"), R, tuple(f"{U0}::{u}" for u in range(25, 75))),
        ],
        {},
        directory=index,
        units_per_gpu=100,
        gpu_resources={U0: R},
        resources=[R],
        taken_at=1_700_000_000,
        mps=mps,
    )


def scrape_of(snap: Snapshot) -> Scrape:
    metrics = AgentMetrics()
    metrics.update(snap)
    return Scrape(metrics.render().decode())


@pytest.mark.parametrize(
    ("mps", "enforced"),
    [
        pytest.param(MpsNode(), 0, id="time-sliced-advice"),
        pytest.param(MpsNode(mode="unsupervised"), 0, id="unsupervised-advice"),
        pytest.param(
            MpsNode(mode="supervised", status=MpsStatus(state="up", restarts=2)), 1, id="supervised"
        ),
    ],
)
def test_per_container_limits_and_whether_each_is_enforced(mps: MpsNode, enforced: int) -> None:
    """Issue 28: the limits from plugin.api.limits, enforced or advisory per the node."""
    scrape = scrape_of(mps_snapshot(mps))
    by_container = {
        (s.labels["container"], s.labels["pod"], s.labels["limit"]): s.value
        for s in scrape.by_name["metagpu_container_limit_enforced"]
    }
    assert by_container == {
        ("main", "a", "memory"): enforced,
        ("main", "a", "sm"): enforced,
        ("main", "b", "memory"): enforced,  # balance: no SM cap, so no sm series
    }
    caps = {s.labels["pod"]: s.value for s in scrape.by_name["metagpu_container_sm_limit_ratio"]}
    assert caps == {"a": 0.25}
    node = {s.labels["limit"]: s.value for s in scrape.by_name["metagpu_node_limit_enforced"]}
    assert node == {"memory": enforced, "fixed": enforced}
    assert [s.labels["mode"] for s in scrape.by_name["metagpu_mps_info"]] == [mps.mode]


def test_the_supervised_daemon_is_up_and_counts_its_restarts() -> None:
    up = scrape_of(mps_snapshot(MpsNode(mode="supervised", status=MpsStatus("up", restarts=2))))
    assert [s.value for s in up.by_name["metagpu_mps_daemon_up"]] == [1]
    assert [s.value for s in up.by_name["metagpu_mps_daemon_restarts_total"]] == [2]
    down = scrape_of(
        mps_snapshot(MpsNode(mode="supervised", status=MpsStatus("down", "gone", restarts=3)))
    )
    assert [(s.labels["state"], s.value) for s in down.by_name["metagpu_mps_daemon_up"]] == [
        ("down", 0)
    ]
    off = scrape_of(mps_snapshot(MpsNode()))
    assert "metagpu_mps_daemon_up" not in off.by_name
