"""The vectorised filter and prioritize (plugin.extender.bulk) answer as node-by-node does.

Two extender cores see the same ledger and the same operations (reports,
binds, deletions, nodes coming and going, an unreadable ledger, a new NUMA
node, a node with more GPUs); after each, one-container pods are filtered and
prioritized by both, and the answers must be equal: the passing names in
order, every refusal word for word, the unresolvable nodes, every score.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.extender.bulk import BulkDecisions, sole_gpu_container
from plugin.extender.ledger import NO_LEDGER
from plugin.extender.matrix import MAX_NUMA_COLUMNS, NodeMatrix
from plugin.extender.protocol import parse_args
from plugin.extender.service import ExtenderCore
from tests.extender.builders import RESOURCE, ledger, pod

NAMES = [f"n{i}" for i in range(6)]


@st.composite
def node_texts(draw: st.DrawFn, name: str) -> str | None:
    kind = draw(st.sampled_from(["ledger", "ledger", "ledger", "none", "garbage"]))
    if kind == "none":
        return None
    if kind == "garbage":
        return '{"resource": 5}'
    upg = draw(st.sampled_from([10, 100]))
    count = draw(st.integers(0, 8))
    used = draw(
        st.lists(
            st.sampled_from([0, 0, upg, upg // 2, upg // 5, upg - 1]),
            min_size=count,
            max_size=count,
        )
    )
    unhealthy = draw(st.lists(st.integers(0, max(count - 1, 0)), max_size=2)) if count else []
    numa = draw(st.lists(st.sampled_from([None, 0, 1, 2]), min_size=count, max_size=count))
    return ledger(used, units=upg, unhealthy=unhealthy, numa=numa, node=name).model_dump_json()


operations = st.one_of(
    st.tuples(st.just("report"), st.sampled_from(NAMES), st.integers(0, 10**6)),
    st.tuples(st.just("bind"), st.sampled_from(NAMES), st.integers(1, 250)),
    st.tuples(st.just("forget"), st.sampled_from(NAMES), st.integers(1, 6)),
    st.tuples(st.just("drop"), st.sampled_from(NAMES), st.integers(0, 0)),
)


def ask_pod(units: int, policy: str, *, extra: bool, uid: str) -> dict[str, Any]:
    """One container asks; with ``extra``, an init container and a second app container
    that ask for nothing (the pod is still one-container for placement)."""
    return pod(
        units,
        *([0] if extra else []),
        init=[0] if extra else [],
        uid=uid,
        name="train",
        annotations={"metagpu.io/placement-policy": policy},
    )


def same_answers(
    bulk: ExtenderCore, plain: ExtenderCore, the_pod: dict[str, Any], names: list[str]
) -> None:
    args = parse_args({"Pod": the_pod, "NodeNames": names})
    assert bulk.filter(args) == plain.filter(args)
    assert bulk.prioritize(args) == plain.prioritize(args)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_bulk_answers_equal_node_by_node(data: st.DataObject) -> None:
    bulk = ExtenderCore(resource=RESOURCE)
    plain = ExtenderCore(resource=RESOURCE, bulk=False)
    assert bulk.bulk is not None
    assert plain.bulk is None

    def report(name: str) -> None:
        text = data.draw(node_texts(name))
        for core in (bulk, plain):
            core.ledger.set_node(name, text)

    for name in NAMES[:4]:
        report(name)
    asked = data.draw(st.lists(st.sampled_from([*NAMES, "unknown"]), min_size=1, max_size=8))
    for step, (op, name, number) in enumerate(data.draw(st.lists(operations, max_size=6))):
        if op == "report":
            report(name)
        elif op == "bind":
            the_pod = pod(number, uid=f"b{step}")
            for core in (bulk, plain):
                core.decide_bind(
                    core.ask_of(the_pod),
                    node=name,
                    pod_uid=f"b{step}",
                    namespace="ns",
                    pod="p",
                    now=0.0,
                )
        elif op == "forget":
            for core in (bulk, plain):
                core.ledger.forget(f"b{step - number}")
        else:
            for core in (bulk, plain):
                core.ledger.drop_node(name)
        units = data.draw(st.integers(1, 320))
        policy = data.draw(st.sampled_from(["binpack", "spread"]))
        extra = data.draw(st.booleans())
        same_answers(bulk, plain, ask_pod(units, policy, extra=extra, uid=f"q{step}"), asked)


def test_the_issue_example_is_refused_in_the_same_words() -> None:
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("a", ledger([60, 60], node="a").model_dump_json())
    core.ledger.set_node("b", ledger([60, 0], node="b").model_dump_json())
    args = parse_args({"Pod": pod(70), "NodeNames": ["a", "b", "c"]})
    result = core.filter(args)
    assert result["NodeNames"] == ["b"]
    assert result["FailedNodes"] == {
        "a": "no single GPU has 70 free units (largest 40; 80 free in total)"
    }
    assert result["FailedAndUnresolvableNodes"] == {"c": NO_LEDGER}
    assert core.prioritize(args) == [
        {"Host": "a", "Score": 0},
        {"Host": "b", "Score": 7},
        {"Host": "c", "Score": 0},
    ]


def test_pods_with_gpus_in_several_containers_go_node_by_node() -> None:
    core = ExtenderCore(resource=RESOURCE)
    assert core.bulk is not None
    several = core.ask_of(pod(30, 20))
    reused = core.ask_of(pod(30, init=[10]))
    one = core.ask_of(pod(30, 0, init=[0]))
    assert sole_gpu_container(several) is None
    assert sole_gpu_container(reused) is None
    assert core.bulk.filter(several, ["a"]) is None
    assert core.bulk.prioritize(reused, ["a"]) is None
    found = sole_gpu_container(one)
    assert found is not None
    assert found.units == 30


def test_too_many_numa_nodes_go_node_by_node() -> None:
    """A cluster reporting more NUMA nodes than the arrays are built for is still answered."""
    core = ExtenderCore(resource=RESOURCE)
    numa = list(range(MAX_NUMA_COLUMNS + 1))
    core.ledger.set_node("a", ledger([0] * len(numa), numa=numa, node="a").model_dump_json())
    assert core.bulk is not None
    assert core.bulk.filter(core.ask_of(pod(50)), ["a"]) is None
    result = core.filter(parse_args({"Pod": pod(50), "NodeNames": ["a"]}))
    assert result["NodeNames"] == ["a"]


def test_only_changed_nodes_are_rewritten_and_gone_nodes_free_their_rows() -> None:
    core = ExtenderCore(resource=RESOURCE)
    for i in range(5):
        core.ledger.set_node(f"n{i}", ledger([i * 10], node=f"n{i}").model_dump_json())
    matrix = NodeMatrix(core.ledger)
    matrix.sync()
    version = matrix.version
    matrix.sync()
    assert matrix.version == version  # nothing changed: nothing rewritten
    core.ledger.set_node("n1", ledger([90], node="n1").model_dump_json())
    core.ledger.drop_node("n4")
    matrix.sync()
    assert matrix.version == version + 1
    rows = matrix.rows_of(["n1", "n4"])
    assert rows[1] == -1
    fleet = matrix.fleet()
    assert fleet is not None
    assert fleet.free[rows[0], 0] == 10
    core.ledger.set_node("n5", ledger([0], node="n5").model_dump_json())
    matrix.sync()
    assert matrix.rows_of(["n5"])[0] < 5  # n4's row, reused


def test_an_unbounded_change_log_falls_back_to_a_full_rebuild() -> None:
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("a", ledger([0], node="a").model_dump_json())
    for i in range(3000):
        core.ledger.drop_node(f"gone-{i}")  # names the ledger never held
    assert core.ledger.take_changed() is None
    assert core.ledger.take_changed() == set()
    matrix = NodeMatrix(core.ledger)
    matrix.sync()
    assert matrix.rows_of(["a"])[0] == 0


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_prioritize_after_filter_reuses_the_answer(policy: str) -> None:
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("a", ledger([50, 20], node="a").model_dump_json())
    assert core.bulk is not None
    bulk: BulkDecisions = core.bulk
    the_pod = ask_pod(40, policy, extra=False, uid="u")
    ask = core.ask_of(the_pod)
    assert bulk.filter(ask, ["a"]) is not None
    version = bulk.matrix.version
    assert bulk.prioritize(ask, ["a"]) is not None
    assert bulk.matrix.version == version


def test_the_fraction_beside_whole_gpus_prefers_their_numa_node() -> None:
    """150 units: the whole GPU comes from NUMA node 0 (the fewest completely free GPUs
    that suffice), so the 50 go to GPU 1 there (70 free), not to the tighter GPU 4 on
    NUMA node 1: score 9 (10 - 20 / 100 / 2 × 10, rounded), as place_pod decides."""
    state = ledger([0, 30, 0, 0, 45], numa=[0, 0, 1, 1, 1], node="a").model_dump_json()
    args = parse_args({"Pod": pod(150), "NodeNames": ["a"]})
    answers = []
    for bulk in (True, False):
        core = ExtenderCore(resource=RESOURCE, bulk=bulk)
        core.ledger.set_node("a", state)
        answers.append(core.prioritize(args))
    assert answers[0] == answers[1] == [{"Host": "a", "Score": 9}]
