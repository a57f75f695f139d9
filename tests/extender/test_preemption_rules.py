"""The pure rules of preemption: budgets as kube-scheduler counts them, and its node order."""

from __future__ import annotations

from typing import Any

import pytest

from plugin.extender.budgets import Disruptable, parse_budget, violations
from plugin.extender.podfacts import PodDirectory, PodFacts
from plugin.extender.preemption import NodePlan, Victim, pick_node


def budget(selector: object, *, allowed: int, disrupted: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": "b", "namespace": "ml"},
        "spec": {"selector": selector},
        "status": {"disruptionsAllowed": allowed, "disruptedPods": dict.fromkeys(disrupted, "t")},
    }


POD_A = Disruptable("ml", "a", {"app": "x"})
POD_B = Disruptable("ml", "b", {"app": "x"})


@pytest.mark.parametrize(
    ("selector", "allowed", "disrupted", "pods", "expected"),
    [
        pytest.param(
            {"matchLabels": {"app": "x"}},
            1,
            (),
            [POD_A, POD_B],
            [False, True],
            id="second-over-budget",
        ),
        pytest.param(
            {"matchLabels": {"app": "x"}}, 0, ("a",), [POD_A], [False], id="already-disrupted"
        ),
        pytest.param({}, 0, (), [POD_A], [False], id="empty-selector-matches-nothing"),
        pytest.param(None, 0, (), [POD_A], [False], id="nil-selector-matches-nothing"),
        pytest.param(
            {"matchLabels": {"app": "x"}},
            0,
            (),
            [Disruptable("other", "a", {"app": "x"})],
            [False],
            id="other-namespace",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["y"]}]},
            0,
            (),
            [POD_A],
            [True],
            id="not-in",
        ),
        pytest.param(
            {"matchLabels": {"app": "x"}},
            0,
            (),
            [Disruptable("ml", "a", {})],
            [False],
            id="no-labels",
        ),
    ],
)
def test_budget_violations(
    selector: object,
    allowed: int,
    disrupted: tuple[str, ...],
    pods: list[Disruptable],
    expected: list[bool],
) -> None:
    assert (
        violations(pods, [parse_budget(budget(selector, allowed=allowed, disrupted=disrupted))])
        == expected
    )


def plan(node: str, *priorities: int, violations: int = 0, start: str = "") -> NodePlan:
    victims = tuple(
        Victim(f"{node}-{i}", "ml", f"{node}-{i}", p, {0: 10}, start, {})
        for i, p in enumerate(priorities)
    )
    return NodePlan(node, victims, violations, {"GPU-0": 70})


@pytest.mark.parametrize(
    ("plans", "chosen"),
    [
        pytest.param(
            [plan("a", 0, violations=1), plan("b", 0, 0, 0)],
            "b",
            id="fewest-budget-violations-first",
        ),
        pytest.param([plan("a", 50), plan("b", 10, 10)], "b", id="lowest-highest-priority"),
        pytest.param([plan("a", 10, 10), plan("b", 10, 0)], "b", id="lowest-sum"),
        pytest.param([plan("a", 10, 10), plan("b", 10)], "b", id="fewest-victims"),
        pytest.param(
            [plan("a", 10, start="2024-01-01"), plan("b", 10, start="2024-02-01")],
            "b",
            id="latest-start",
        ),
        pytest.param([plan("a", 10), plan("b", 10)], "a", id="first-on-a-tie"),
        pytest.param([plan("a")], None, id="no-victims-no-node"),
    ],
)
def test_pick_node_follows_pick_one_node_for_preemption(
    plans: list[NodePlan], chosen: str | None
) -> None:
    picked = pick_node(plans)
    assert (picked.node if picked else None) == chosen


def test_the_directory_knows_whether_any_pod_could_be_a_victim() -> None:
    """Most unschedulable pods have no lower-priority pod to preempt anywhere (a cluster of
    one priority): the extender's own search answers that from the directory's tally of
    priorities instead of placing the pod on every refused node (24 ms at 1,000 nodes)."""
    directory = PodDirectory(limit=3)
    assert not directory.any_below(1000)

    def facts(uid: str, priority: int) -> PodFacts:
        return PodFacts(uid, "ns", uid, priority, True)

    directory.put(facts("a", 0))
    directory.put(facts("b", 100))
    assert directory.any_below(100)
    assert not directory.any_below(0)
    directory.put(facts("a", 200))  # the same pod again, another priority: not counted twice
    assert not directory.any_below(100)
    assert directory.any_below(101)
    directory.put(facts("c", 50))
    directory.put(facts("d", 300))  # over the limit: the oldest ("b", 100) is dropped
    assert directory.get("b") is None
    assert directory.any_below(51)
    assert not directory.any_below(50)
    directory.drop("c")
    assert not directory.any_below(200)
