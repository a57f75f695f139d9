"""One user's MPS clients per GPU on an MPS node (issue 28): placement and bind keep to it.

The MPS control daemon runs one server per UID; a client of another UID waits until every
client of the running server has exited. On a node a supervised MPS daemon serves (its
ledger lists something in ``enforces``), a pod gets only GPUs whose holders run as its own
user, or that nobody holds; a pod that could only wait is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from plugin.api.scheduling import GpuHolder, GpuLedgerEntry, NodeLedger
from plugin.extender.mps_users import MIXED, pod_user
from plugin.extender.podfacts import PodFacts
from plugin.extender.pods import container_requests
from plugin.extender.protocol import parse_args, parse_preemption
from plugin.extender.service import ExtenderCore
from tests.extender.builders import RESOURCE, ledger, pod


def with_user(the_pod: dict[str, Any], user: int | None, **containers: int) -> dict[str, Any]:
    """``the_pod`` with a pod-level runAsUser, and container-level ones by name."""
    spec = the_pod["spec"]
    if user is not None:
        spec["securityContext"] = {"runAsUser": user}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        if c["name"] in containers:
            c["securityContext"] = {"runAsUser": containers[c["name"]]}
    return the_pod


def mps_node(used: list[int], *, node: str, holders: list[str], mps: bool = True) -> str:
    base: NodeLedger = ledger(used, node=node, holder_uids=holders)
    if mps:
        base = base.model_copy(update={"enforces": ("memory",)})
    return base.model_dump_json()


@pytest.mark.parametrize(
    ("the_pod", "expected"),
    [
        pytest.param(with_user(pod(50), 1000), 1000, id="pod-level"),
        pytest.param(with_user(pod(50, 20), 1000, c1=1000), 1000, id="same-override"),
        pytest.param(with_user(pod(50, 20), 1000, c1=2000), MIXED, id="mixed"),
        pytest.param(pod(50), None, id="unknown"),
        pytest.param(with_user(pod(50, 0), None, c0=7), 7, id="gpu-container-only"),
        pytest.param(with_user(pod(50, 0), None, c1=7), None, id="non-gpu-container-ignored"),
        pytest.param(with_user(pod(50, init=[30]), 5, init0=6), MIXED, id="init-counts"),
    ],
)
def test_the_user_of_a_pods_gpu_containers(the_pod: dict[str, Any], expected: int | None) -> None:
    asking = {c.name for c in container_requests(the_pod, resource=RESOURCE) if c.units}
    assert pod_user(the_pod, asking=asking) == expected


def core_with_users(*, bulk: bool, mps: bool = True) -> ExtenderCore:
    """node "m": GPU 0 held 40 by a pod of UID 1000, GPU 1 held 30 by one of UID 2000, GPU 2
    free. The directory knows both holders' users."""
    core = ExtenderCore(resource=RESOURCE, bulk=bulk)
    core.ledger.set_node(
        "m", mps_node([40, 30, 0], node="m", holders=["h1000", "h2000", "-"], mps=mps)
    )
    core.directory.put(PodFacts("h1000", "ns", "h1000", 0, True, user=1000))
    core.directory.put(PodFacts("h2000", "ns", "h2000", 0, True, user=2000))
    return core


def bind_gpus(core: ExtenderCore, the_pod: dict[str, Any], node: str = "m") -> object:
    ask = core.ask_of(the_pod)
    decision = core.decide_bind(
        ask, node=node, pod_uid=the_pod["metadata"]["uid"], namespace="ns", pod="p", now=0.0
    )
    if isinstance(decision, str):
        return decision
    return [dict(c.gpus) for c in decision.assignment.containers]


@pytest.mark.parametrize("bulk", [True, False], ids=["arrays", "node-by-node"])
def test_a_gpu_of_an_mps_node_serves_one_user(bulk: bool) -> None:
    core = core_with_users(bulk=bulk)
    two = with_user(pod(50, uid="u2000"), 2000)
    assert core.filter(parse_args({"Pod": two, "NodeNames": ["m"]}))["NodeNames"] == ["m"]
    # binpack alone takes GPU 0 (the tightest, 60 free); its clients run as 1000: GPU 1,
    # whose clients run as 2000, is the tightest this pod may join
    assert bind_gpus(core, two) == [{"GPU-m-1": 50}]
    one = with_user(pod(50, uid="u1000"), 1000)
    assert bind_gpus(core, one) == [{"GPU-m-0": 50}]
    other = with_user(pod(50, uid="u3000"), 3000)
    assert bind_gpus(core, other) == [{"GPU-m-2": 50}]


@pytest.mark.parametrize("bulk", [True, False], ids=["arrays", "node-by-node"])
def test_a_pod_that_could_only_wait_is_refused_with_why(bulk: bool) -> None:
    core = core_with_users(bulk=bulk)
    core.ledger.set_node("m", mps_node([40, 30, 90], node="m", holders=["h1000", "h2000", "h2000"]))
    pod_3000 = with_user(pod(50, uid="u3000"), 3000)
    result = core.filter(parse_args({"Pod": pod_3000, "NodeNames": ["m"]}))
    assert result["NodeNames"] == []
    words = result["FailedNodes"]["m"]
    assert words.startswith('container "c0" needs 50 units, 0 free on healthy GPUs')
    assert "GPU(s) 0, 1, 2 of this MPS node serve other users' MPS clients" in words
    assert "this pod runs as UID 3000" in words
    assert isinstance(bind_gpus(core, pod_3000), str)
    unknown = pod(10, uid="unknown")
    result = core.filter(parse_args({"Pod": unknown, "NodeNames": ["m"]}))
    assert "set no runAsUser" in result["FailedNodes"]["m"]
    mixed = with_user(pod(10, 10, uid="mixed"), 1000, c1=2000)
    result = core.filter(parse_args({"Pod": mixed, "NodeNames": ["m"]}))
    assert "run as different users" in result["FailedAndUnresolvableNodes"]["m"]


@pytest.mark.parametrize("bulk", [True, False], ids=["arrays", "node-by-node"])
def test_unknown_users_get_gpus_nobody_holds_and_nodes_without_mps_are_not_affected(
    bulk: bool,
) -> None:
    core = core_with_users(bulk=bulk)
    unknown = pod(50, uid="unknown")
    assert bind_gpus(core, unknown) == [{"GPU-m-2": 50}]
    # GPU 2 is now held by a pod whose user nobody knows: nobody joins it
    known = with_user(pod(50, uid="u1000"), 1000)
    assert bind_gpus(core, known) == [{"GPU-m-0": 50}]
    # a holder the extender has no facts for (a bind not seen back yet) counts as unknown
    core.directory.drop("h1000")
    again = with_user(pod(10, uid="u1000-b"), 1000)
    assert "GPU(s) 0, 1, 2 of this MPS node" in str(bind_gpus(core, again))
    plain = core_with_users(bulk=bulk, mps=False)
    assert bind_gpus(plain, with_user(pod(50, uid="u3000"), 3000)) == [{"GPU-m-0": 50}]


def test_prioritize_scores_the_gpus_the_pod_may_use() -> None:
    """Binpack scores the tightest GPU the pod would get: on the MPS node, not another
    user's GPU."""
    core = core_with_users(bulk=True)
    core.ledger.set_node("n", mps_node([40, 30, 0], node="n", holders=["x", "y", "-"], mps=False))
    other = with_user(pod(70, uid="u3000"), 3000)
    scores = {
        h["Host"]: h["Score"]
        for h in core.prioritize(parse_args({"Pod": other, "NodeNames": ["m", "n"]}))
    }
    # n: 70 fill GPU 1 exactly (10); m: GPU 1 is another user's, the 70 go to GPU 2 (7)
    assert scores == {"n": 10, "m": 7}


# ------------------------------------------------------------------ preemption
def mps_ledger(*gpus: Sequence[tuple[str, int]]) -> str:
    """An MPS node "m" whose GPU ``i`` is held by ``gpus[i]`` (pod UID, units) pairs."""
    return NodeLedger(
        resource=RESOURCE,
        units_per_gpu=100,
        enforces=("memory",),
        gpus=tuple(
            GpuLedgerEntry(
                uuid=f"GPU-m-{i}",
                index=i,
                units=100,
                healthy=True,
                holders=tuple(
                    GpuHolder(pod_uid=uid, namespace="ns", pod=uid, container="c", units=n)
                    for uid, n in held
                ),
            )
            for i, held in enumerate(gpus)
        ),
    ).model_dump_json()


def core_for_preemption() -> ExtenderCore:
    """GPU 0: a-low (UID 1000, priority 0, 40) beside a-high (UID 1000, priority 100, 20);
    GPU 1: b-low (UID 2000, priority 10, 60). Both GPUs have 40 free."""
    core = ExtenderCore(resource=RESOURCE, bulk=True)
    core.ledger.set_node("m", mps_ledger([("a-low", 40), ("a-high", 20)], [("b-low", 60)]))
    for uid, priority, user in (("a-low", 0, 1000), ("a-high", 100, 1000), ("b-low", 10, 2000)):
        core.directory.put(PodFacts(uid, "ns", uid, priority, True, user=user))
    return core


def preempt_for(core: ExtenderCore, user: int) -> dict[str, Any]:
    """The preempt verb for a 50-unit pod of priority 50 running as ``user``, offered node m."""
    preemptor = with_user(pod(50, uid=f"u{user}"), user)
    preemptor["spec"]["priority"] = 50
    args = parse_preemption(
        {
            "Pod": preemptor,
            "NodeNameToMetaVictims": {"m": {"Pods": [{"UID": "a-low"}], "NumPDBViolations": 0}},
        }
    )
    return dict(core.preempt(args, now=0.0))


def victims(answer: dict[str, Any]) -> list[str]:
    return [p["UID"] for p in answer["NodeNameToMetaVictims"].get("m", {}).get("Pods", [])]


def test_preemption_empties_a_gpu_of_other_users_not_just_of_units() -> None:
    """By units alone a-low is the victim (b-low, of higher priority, is spared first): GPU 0
    would have 80 free. But a-high stays there and runs as UID 1000, so a pod of UID 3000
    could only wait on GPU 0 after the eviction. The victim that helps is b-low: GPU 1 is
    then nobody's."""
    assert victims(preempt_for(core_for_preemption(), 3000)) == ["b-low"]


def test_a_preemptor_of_the_holders_user_may_share_their_gpu() -> None:
    """UID 1000 may join a-high on GPU 0: evicting a-low (the lower priority) is enough."""
    assert victims(preempt_for(core_for_preemption(), 1000)) == ["a-low"]


def test_preemption_that_cannot_give_the_pod_a_gpu_of_its_own_user_evicts_nobody() -> None:
    """Every GPU keeps a higher-priority pod of another user: no victim helps."""
    core = ExtenderCore(resource=RESOURCE, bulk=True)
    core.ledger.set_node("m", mps_ledger([("a-low", 40), ("a-high", 20)], [("b-high", 60)]))
    for uid, priority, user in (("a-low", 0, 1000), ("a-high", 100, 1000), ("b-high", 100, 2000)):
        core.directory.put(PodFacts(uid, "ns", uid, priority, True, user=user))
    assert victims(preempt_for(core, 3000)) == []
