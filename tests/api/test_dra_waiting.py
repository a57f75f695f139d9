"""Why a DRA claim waits, said from the captured slice and claims (plugin.api.dra_waiting).

The captured case: two 60-unit shares on the two A100s of ``localhost``, and a 70-unit
claim the scheduler refused with the generic ``cannot allocate all claims``
(``event-70-units-unschedulable.json``). After one 60 was released the same 70 was
allocated on gpu-0 (``claim-70-units-allocated-after-release.json``): then there is
nothing to say.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from plugin.api.dra_waiting import (
    ShareRequest,
    WaitingBoard,
    free_per_device,
    pod_waiting_words,
    share_request,
    waiting_words,
)
from plugin.api.quantity import MIB
from tests.plugin.dra.fixtures import DRIVER, NODE, load

GI = 1024 * MIB


def node_slice() -> dict[str, Any]:
    """The slice as the API server stored it."""
    stored: dict[str, Any] = load("resourceslice-consumable-accepted.json")["response"]["body"]
    return stored


def free_after(*claims: str) -> Any:
    return free_per_device(
        [node_slice()], [load(name) for name in claims], driver=DRIVER, node_name=NODE
    )


def test_the_captured_70_units_beside_60_and_60() -> None:
    free = free_after("claim-60-units-a-allocated.json", "claim-60-units-b-allocated.json")
    assert [(d.device, int(d.units_free), d.memory_free_mib) for d in free] == [
        ("gpu-0", 40, 79 * 1024),
        ("gpu-1", 40, 79 * 1024),
    ]
    waiting = load("event-70-units-unschedulable.json")
    assert "cannot allocate all claims" in waiting["events"]["items"][0]["message"]
    words = waiting_words(free, share_request(waiting["claim"]))
    assert words == (
        "no single GPU has 70 free units (largest 40; 80 free in total)"
        " (free: gpu-0 40 units, 79Gi; gpu-1 40 units, 79Gi)"
    )


def test_after_the_release_the_70_fits_and_nothing_is_said() -> None:
    free = free_after("claim-60-units-b-allocated.json")
    claim = load("claim-70-units-allocated-after-release.json")
    assert waiting_words(free, share_request(claim)) is None
    # and once allocated, gpu-0 has what the capture says it consumed left
    after = free_after(
        "claim-60-units-b-allocated.json", "claim-70-units-allocated-after-release.json"
    )
    assert [(d.device, int(d.units_free)) for d in after] == [("gpu-0", 30), ("gpu-1", 40)]


def test_the_captured_150_units_above_the_policy() -> None:
    pending = load("claim-150-units-over-policy-pending.json")
    words = waiting_words(free_after(), share_request(pending["claim"]))
    assert words is not None
    assert words.startswith("no GPU has 150 units (at most 100 per GPU)")


def test_the_scheduler_rounds_up_to_the_step_as_captured() -> None:
    """1500Mi was charged 2Gi (and the units default, 1)."""
    free = free_after("claim-1500mi-rounded-allocated.json")
    assert (int(free[0].units_free), free[0].memory_free_mib) == (99, 78 * 1024)
    (gpu0, _) = free
    assert gpu0.memory.charge(Decimal(1500 * MIB)) == 2 * GI


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        pytest.param(
            ShareRequest(units=None, memory=Decimal(50 * GI)),
            "no single GPU has 50Gi free memory (largest 40Gi; 40Gi free in total)",
            id="memory-only",
        ),
        pytest.param(
            ShareRequest(units=Decimal(10), memory=Decimal(50 * GI)),
            "no single GPU has 50Gi free memory (largest 40Gi; 40Gi free in total)",
            id="units-fit-memory-does-not",
        ),
        pytest.param(
            ShareRequest(units=Decimal(60), memory=Decimal(10 * GI)),
            "no single GPU has 60 free units (largest 50; 50 free in total)",
            id="units-do-not-fit",
        ),
        pytest.param(
            ShareRequest(units=None, memory=Decimal(100 * GI)),
            "no GPU has 100Gi of memory (at most 80Gi per GPU)",
            id="memory-above-any-gpu",
        ),
    ],
)
def test_the_p50_shares(request_: ShareRequest, expected: str) -> None:
    """p50-a and p50-b (50 units, 40Gi each) fill gpu-0; p50-c holds half of gpu-1."""
    free = free_after(
        "claim-p50-a-50-units-40gi-allocated.json",
        "claim-p50-b-50-units-40gi-allocated.json",
        "claim-p50-c-50-units-40gi-allocated.json",
    )
    words = waiting_words(free, request_)
    assert words is not None
    assert words.startswith(expected), words
    assert words.endswith("(free: gpu-0 0 units, 0Gi; gpu-1 50 units, 40Gi)")


def test_units_and_memory_each_fit_somewhere_but_never_together() -> None:
    # gpu-0: 50 units, 10Gi free; gpu-1: 10 units, 70Gi free
    shares = [("gpu-0", "50", "70Gi"), ("gpu-1", "90", "10Gi")]
    claims = [
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": device,
                                "consumedCapacity": {"units": units, "memory": memory},
                            }
                        ]
                    }
                }
            }
        }
        for device, units, memory in shares
    ]
    free = free_per_device([node_slice()], claims, driver=DRIVER, node_name=NODE)
    words = waiting_words(free, ShareRequest(units=Decimal(40), memory=Decimal(20 * GI)))
    assert words == (
        "no single GPU has both 40 free units and 20Gi free memory"
        " (free: gpu-0 50 units, 10Gi; gpu-1 10 units, 70Gi)"
    )


def test_a_device_taken_whole_and_other_drivers_and_nodes() -> None:
    claims = [
        {"status": {"allocation": {"devices": {"results": [
            {"driver": DRIVER, "pool": NODE, "device": "gpu-0"},
            {"driver": "other.example.com", "pool": NODE, "device": "gpu-1",
             "consumedCapacity": {"units": "100"}},
            {"driver": DRIVER, "pool": "node-b", "device": "gpu-1",
             "consumedCapacity": {"units": "100"}},
        ]}}}}
    ]  # fmt: skip
    free = free_per_device([node_slice()], claims, driver=DRIVER, node_name=NODE)
    assert [(d.device, int(d.units_free), d.memory_free_mib) for d in free] == [
        ("gpu-0", 0, 0),
        ("gpu-1", 100, 80 * 1024),
    ]
    assert free_per_device([node_slice()], [], driver=DRIVER, node_name="node-b") == ()
    assert waiting_words((), ShareRequest(None, None)) == (
        "the node offers no GPU (its ResourceSlice has no devices)"
    )


def on_node(obj: dict[str, Any], node: str) -> dict[str, Any]:
    """A copy of a captured slice or allocated claim, moved to ``node``'s pool."""
    moved = copy.deepcopy(obj)
    if moved.get("kind") == "ResourceSlice":
        moved["metadata"]["name"] = f"{node}-{DRIVER}"
        moved["spec"]["nodeName"] = node
        moved["spec"]["pool"]["name"] = node
    else:
        for result in moved["status"]["allocation"]["devices"]["results"]:
            result["pool"] = node
    return moved


def explain(
    pending: dict[str, Any], *, slices: list[dict[str, Any]], allocated: list[dict[str, Any]]
) -> str | None:
    claim = pending["claim"]
    return pod_waiting_words(
        pending["pod"],
        claims={claim["metadata"]["name"]: claim},
        slices=slices,
        allocated=allocated,
        driver=DRIVER,
        device_class=DRIVER,
    )


SIXTIES = ("claim-60-units-a-allocated.json", "claim-60-units-b-allocated.json")


def test_the_captured_pending_pod_gets_its_words() -> None:
    """The Event note for pod p70: the scheduler's Event said only `cannot allocate all claims`."""
    pending = load("event-70-units-unschedulable.json")
    words = explain(pending, slices=[node_slice()], allocated=[load(n) for n in SIXTIES])
    assert words == (
        "claim p70-gpu-nd7kc: localhost: no single GPU has 70 free units (largest 40; "
        "80 free in total) (free: gpu-0 40 units, 79Gi; gpu-1 40 units, 79Gi)"
    )


def test_the_captured_150_units_pod() -> None:
    pending = load("claim-150-units-over-policy-pending.json")
    words = explain(pending, slices=[node_slice()], allocated=[])
    assert words is not None
    assert ": localhost: no GPU has 150 units (at most 100 per GPU)" in words


def test_nodes_with_the_same_figures_share_a_sentence() -> None:
    pending = load("event-70-units-unschedulable.json")
    sixties = [load(n) for n in SIXTIES]
    slices = [node_slice(), on_node(node_slice(), "node-b")]
    words = explain(
        pending, slices=slices, allocated=sixties + [on_node(c, "node-b") for c in sixties]
    )
    assert words is not None
    assert words.startswith("claim p70-gpu-nd7kc: localhost, node-b: no single GPU has 70")


def test_a_node_with_room_means_the_pod_waits_for_something_else() -> None:
    pending = load("event-70-units-unschedulable.json")
    slices = [node_slice(), on_node(node_slice(), "node-b")]
    assert explain(pending, slices=slices, allocated=[load(n) for n in SIXTIES]) is None
    after_release = [load("claim-60-units-b-allocated.json")]
    assert explain(pending, slices=[node_slice()], allocated=after_release) is None


def test_claims_not_ours_or_allocated_are_not_explained() -> None:
    pending = load("event-70-units-unschedulable.json")
    other = copy.deepcopy(pending)
    other["claim"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "other"
    allocated = [load(n) for n in SIXTIES]
    assert explain(other, slices=[node_slice()], allocated=allocated) is None
    assert explain(pending, slices=[], allocated=[]) == (
        "no node publishes a ResourceSlice of driver gpu.metagpu.io"
    )


def test_a_claim_the_pod_names_itself_is_explained_too() -> None:
    """A pod may name a ResourceClaim directly (``resourceClaimName``): no status entry."""
    pending = copy.deepcopy(load("event-70-units-unschedulable.json"))
    pending["pod"]["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimName": pending["claim"]["metadata"]["name"]}
    ]
    pending["pod"]["status"].pop("resourceClaimStatuses")
    words = explain(pending, slices=[node_slice()], allocated=[load(n) for n in SIXTIES])
    assert words is not None
    assert words.startswith("claim p70-gpu-nd7kc: localhost: no single")


def test_one_board_for_many_pods_says_what_one_board_per_pod_says() -> None:
    """The pass's shared board (one walk, words memoised per request) against a board
    built afresh for each pod, over pods of several sizes on two nodes."""
    sixties = [load(n) for n in SIXTIES]
    slices = [node_slice(), on_node(node_slice(), "node-b")]
    allocated = [*sixties, on_node(sixties[0], "node-b")]
    board = WaitingBoard.of(slices, allocated, driver=DRIVER, device_class=DRIVER)
    for units in (10, 40, 41, 70, 100, 150, 40, 70):
        pending = copy.deepcopy(load("event-70-units-unschedulable.json"))
        asked = pending["claim"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
        asked["requests"]["units"] = str(units)
        claims = {pending["claim"]["metadata"]["name"]: pending["claim"]}
        alone = pod_waiting_words(
            pending["pod"],
            claims=claims,
            slices=slices,
            allocated=allocated,
            driver=DRIVER,
            device_class=DRIVER,
        )
        assert board.pod_words(pending["pod"], claims) == alone
        assert (alone is None) == (units <= 100)  # node-b has a whole GPU free


def test_many_nodes_with_one_sentence_leave_room_for_the_reason() -> None:
    """1,000 nodes with the same figures would fill the Event's 1 KiB note with their names
    before the reason; the names past three are counted instead."""
    pending = load("event-70-units-unschedulable.json")
    nodes = [f"node-{i}" for i in range(5)]
    slices = [on_node(node_slice(), n) for n in nodes]
    allocated = [on_node(load(s), n) for n in nodes for s in SIXTIES]
    words = explain(pending, slices=slices, allocated=allocated)
    assert words is not None
    assert words.startswith(
        "claim p70-gpu-nd7kc: node-0, node-1, node-2 and 2 more nodes: no single GPU has 70"
    )
