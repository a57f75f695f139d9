"""Honouring the extender's assignments: the book's matching rule (pure), the servicer's
answers with it, and the fallback to the plugin's own policy."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from plugin._pb import deviceplugin_v1beta1_pb2 as pb
from plugin.api.config import PluginConfig
from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS
from plugin.deviceplugin.assignments import AssignmentBook
from plugin.deviceplugin.servicer import DevicePluginServicer
from plugin.gpu.health_monitor import HealthBoard
from tests.plugin.builders import gpu, table, uuid_for
from tests.plugin.deviceplugin.assignment_builders import assigned_pod
from tests.plugin.deviceplugin.test_servicer import FakeContext

G0, G1, G2 = uuid_for(0), uuid_for(1), uuid_for(2)
IDS = [G0, G1, G2]
EMPTY = [100, 100, 100]
NONE = [0, 0, 0]


def book_of(*pods: dict[str, Any]) -> AssignmentBook:
    book = AssignmentBook()
    book.replace(pods)
    return book


def test_the_oldest_pending_container_of_that_size_is_chosen() -> None:
    book = book_of(
        assigned_pod("young", [("main", "app", 30, {G2: 30})], created="2026-11-25T10:00:02Z"),
        assigned_pod("old", [("main", "app", 30, {G1: 30})], created="2026-11-25T10:00:01Z"),
        assigned_pod("other", [("main", "app", 40, {G0: 40})], created="2026-11-25T10:00:00Z"),
    )
    match = book.match(30, gpu_ids=IDS, free=EMPTY, held=NONE)
    assert match is not None
    assert (match.container.pod, match.take) == ("old", (0, 30, 0))
    assert book.match(50, gpu_ids=IDS, free=EMPTY, held=NONE) is None  # nobody asks for 50


def test_a_container_stops_being_pending_once_allocated_and_the_next_one_is_chosen() -> None:
    book = book_of(
        assigned_pod("a", [("main", "app", 30, {G1: 30})], created="2026-11-25T10:00:01Z"),
        assigned_pod("b", [("main", "app", 30, {G2: 30})], created="2026-11-25T10:00:02Z"),
    )
    first = book.match(30, gpu_ids=IDS, free=EMPTY, held=NONE)
    assert first is not None
    ids = [f"{G1}::{u}" for u in range(30)]
    book.answered(ids, first.container)
    assert book.allocated(ids, {G1: 30}) == first.container
    second = book.match(30, gpu_ids=IDS, free=[100, 70, 100], held=NONE)
    assert second is not None
    assert second.container.pod == "b"


def test_an_allocation_the_plugin_did_not_answer_is_matched_by_its_counts() -> None:
    book = book_of(
        assigned_pod("a", [("main", "app", 30, {G1: 30})], created="2026-11-25T10:00:01Z"),
        assigned_pod("b", [("main", "app", 30, {G2: 30})], created="2026-11-25T10:00:02Z"),
    )
    gone = book.allocated([f"{G2}::{u}" for u in range(30)], {G2: 30})
    assert gone is not None
    assert gone.pod == "b"
    assert [c.pod for c in book.pending()] == ["a"]
    assert book.allocated([f"{G0}::{u}" for u in range(30)], {G0: 30}) is None  # nobody's


def test_an_assigned_gpu_without_room_is_skipped_for_the_next_candidate_or_none() -> None:
    book = book_of(
        assigned_pod("a", [("main", "app", 30, {G1: 30})], created="2026-11-25T10:00:01Z"),
        assigned_pod("b", [("main", "app", 30, {G2: 30})], created="2026-11-25T10:00:02Z"),
    )
    match = book.match(30, gpu_ids=IDS, free=[100, 20, 100], held=NONE)
    assert match is not None
    assert match.container.pod == "b"
    assert book.match(30, gpu_ids=IDS, free=[100, 20, 20], held=NONE) is None


def test_reused_units_must_match_must_include() -> None:
    pod = assigned_pod(
        "p",
        [("setup", "init", 30, {G1: 30}), ("main", "app", 50, {G1: 50})],
    )
    plain = assigned_pod("q", [("main", "app", 50, {G2: 50})], created="2026-11-25T10:00:05Z")
    book = book_of(pod, plain)
    # the init container's request: 30, nothing reused
    init = book.match(30, gpu_ids=IDS, free=EMPTY, held=NONE)
    assert init is not None
    assert init.container.container == "setup"
    # 50 with 30 reused on G1 is "main" of p: 20 more on G1
    main = book.match(50, gpu_ids=IDS, free=[100, 70, 100], held=[0, 30, 0])
    assert main is not None
    assert (main.container.container, main.take) == ("main", (0, 20, 0))
    # 50 with nothing reused is q's, though p's main is older
    fresh = book.match(50, gpu_ids=IDS, free=EMPTY, held=NONE)
    assert fresh is not None
    assert fresh.container.pod == "q"
    # must_include on a GPU the assignment does not name: no match
    assert book.match(50, gpu_ids=IDS, free=EMPTY, held=[0, 0, 30]) is None


def test_the_pod_being_admitted_goes_on_before_older_pods() -> None:
    book = book_of(
        assigned_pod("old", [("main", "app", 20, {G0: 20})], created="2026-11-25T10:00:00Z"),
        assigned_pod(
            "two",
            [("a", "app", 30, {G1: 30}), ("b", "app", 20, {G2: 20})],
            created="2026-11-25T10:00:09Z",
        ),
    )
    first = book.match(30, gpu_ids=IDS, free=EMPTY, held=NONE)
    assert first is not None
    assert first.container.pod == "two"
    ids = [f"{G1}::{u}" for u in range(30)]
    book.answered(ids, first.container)
    book.allocated(ids, {G1: 30})
    nxt = book.match(20, gpu_ids=IDS, free=[100, 70, 100], held=NONE)
    assert nxt is not None
    assert (nxt.container.pod, nxt.container.container) == ("two", "b")


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"status": {"phase": "Running"}}, id="running"),
        pytest.param(
            {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}}, id="rejected"
        ),
        pytest.param(
            {"status": {"phase": "Pending", "containerStatuses": [{"name": "main"}]}},
            id="admitted-not-started",
        ),
        pytest.param({"metadata": {"deletionTimestamp": "2026-11-25T10:01:00Z"}}, id="deleting"),
    ],
)
def test_a_pod_the_kubelet_admitted_or_that_is_going_away_is_not_pending(
    change: dict[str, Any],
) -> None:
    pod = assigned_pod("a", [("main", "app", 30, {G1: 30})])
    book = book_of(pod)
    assert len(book.pending()) == 1
    updated = {**pod, **{k: {**pod.get(k, {}), **v} for k, v in change.items()}}
    book.apply("MODIFIED", updated)
    assert book.pending() == []


def test_deleted_pods_and_pods_without_an_assignment_are_not_pending() -> None:
    pod = assigned_pod("a", [("main", "app", 30, {G1: 30})])
    bare = assigned_pod("b", [("main", "app", 30, {G1: 30})])
    del bare["metadata"]["annotations"]
    book = book_of(pod, bare)
    assert [c.pod for c in book.pending()] == ["a"]
    book.apply("DELETED", pod)
    assert book.pending() == []


def test_a_malformed_assignment_is_ignored_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pod = assigned_pod("a", [("main", "app", 30, {G1: 30})])
    pod["metadata"]["annotations"][ANNOTATION_ASSIGNED_GPUS] = '{"version": "v9"}'
    book = AssignmentBook()
    with caplog.at_level(logging.WARNING):
        book.apply("ADDED", pod)
        book.apply("MODIFIED", pod)
    assert book.pending() == []
    assert caplog.text.count("ignoring the metagpu.io/assigned-gpus annotation of pod ml/a") == 1


# ------------------------------------------------------------ the servicer
def servicer_with(book: AssignmentBook, **config: Any) -> DevicePluginServicer:
    cfg = PluginConfig(units_per_gpu=100, **config)
    t = table([gpu(0), gpu(1), gpu(2)], units_per_gpu=100)
    return DevicePluginServicer(
        table=t, config=cfg, board=HealthBoard(), stop=__import__("asyncio").Event(), book=book
    )


def preferred_request(available: list[str], size: int, must: list[str] | None = None) -> Any:
    request = pb.PreferredAllocationRequest()
    request.container_requests.add(
        available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
    )
    return request


def per_gpu(ids: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in ids:
        g = i.rsplit("::", 1)[0]
        out[g] = out.get(g, 0) + 1
    return out


async def test_preferred_allocation_answers_with_the_assigned_gpu_not_the_policy() -> None:
    book = book_of(assigned_pod("a", [("main", "app", 30, {G2: 30})]))
    servicer = servicer_with(book)
    # G0 is fuller, so binpack alone would pick it
    available = [f"{G0}::{u}" for u in range(50, 100)] + [
        f"{g}::{u}" for g in (G1, G2) for u in range(100)
    ]
    response = await servicer.GetPreferredAllocation(
        preferred_request(available, 30), FakeContext()
    )
    ids = list(response.container_responses[0].deviceIDs)
    assert per_gpu(ids) == {G2: 30}
    # Allocate of exactly that answer consumes the assignment: the next 30 is the policy's
    await servicer.Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
        FakeContext(),
    )
    assert book.pending() == []
    response = await servicer.GetPreferredAllocation(
        preferred_request(available, 30), FakeContext()
    )
    assert per_gpu(list(response.container_responses[0].deviceIDs)) == {G0: 30}


async def test_without_room_on_the_assigned_gpu_the_policy_answers() -> None:
    book = book_of(assigned_pod("a", [("main", "app", 30, {G2: 30})]))
    servicer = servicer_with(book)
    available = [f"{G0}::{u}" for u in range(100)] + [f"{G2}::{u}" for u in range(80, 100)]
    response = await servicer.GetPreferredAllocation(
        preferred_request(available, 30), FakeContext()
    )
    assert per_gpu(list(response.container_responses[0].deviceIDs)) == {G0: 30}
    assert len(book.pending()) == 1  # still pending: it was not answered


async def test_must_include_is_kept_with_an_assignment() -> None:
    book = book_of(
        assigned_pod("p", [("setup", "init", 30, {G1: 30}), ("main", "app", 50, {G1: 50})])
    )
    servicer = servicer_with(book)
    reused = [f"{G1}::{u}" for u in range(30)]
    book.allocated(reused, {G1: 30})  # the init container's Allocate
    available = (
        reused
        + [f"{g}::{u}" for g in (G0, G2) for u in range(100)]
        + [f"{G1}::{u}" for u in range(30, 100)]
    )
    response = await servicer.GetPreferredAllocation(
        preferred_request(available, 50, reused), FakeContext()
    )
    ids = list(response.container_responses[0].deviceIDs)
    assert set(reused) <= set(ids)
    assert per_gpu(ids) == {G1: 50}


def test_an_answer_for_a_pod_gone_meanwhile_consumes_no_other_pods_assignment() -> None:
    a = assigned_pod("a", [("main", "app", 30, {G1: 30})], created="2026-11-25T10:00:01Z")
    b = assigned_pod("b", [("main", "app", 30, {G1: 30})], created="2026-11-25T10:00:02Z")
    book = book_of(a, b)
    match = book.match(30, gpu_ids=IDS, free=EMPTY, held=NONE)
    assert match is not None
    assert match.container.pod == "a"
    ids = [f"{G1}::{u}" for u in range(30)]
    book.answered(ids, match.container)
    book.apply("DELETED", a)
    assert book.allocated(ids, {G1: 30}) == match.container
    assert [c.pod for c in book.pending()] == ["b"]  # b, with the same counts, still waits
