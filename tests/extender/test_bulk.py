"""The vectorised filter and prioritize (plugin.extender.bulk) answer as node-by-node does.

Two extender cores see the same ledger and the same operations (reports,
binds, deletions, nodes coming and going, an unreadable ledger, a new NUMA
node, a node with more GPUs); after each, one-container pods are filtered and
prioritized by both, and the answers must be equal: the passing names in
order, every refusal word for word, the unresolvable nodes, every score.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.extender.bulk import BulkDecisions
from plugin.extender.decision import FIXED_NEEDS_CAP, filter_nodes
from plugin.extender.ledger import NO_LEDGER
from plugin.extender.matrix import MAX_NUMA_COLUMNS, NodeMatrix
from plugin.extender.protocol import parse_args
from plugin.extender.service import ExtenderCore
from plugin.placement.fleet import distinct_rows
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
    node = ledger(used, units=upg, unhealthy=unhealthy, numa=numa, node=name)
    if draw(st.booleans()):  # a supervised MPS node: a fixed pod may go there
        node = node.model_copy(update={"enforces": ("memory", "fixed")})
    return node.model_dump_json()


operations = st.one_of(
    st.tuples(st.just("report"), st.sampled_from(NAMES), st.integers(0, 10**6)),
    st.tuples(st.just("bind"), st.sampled_from(NAMES), st.integers(1, 250)),
    st.tuples(st.just("forget"), st.sampled_from(NAMES), st.integers(1, 6)),
    st.tuples(st.just("drop"), st.sampled_from(NAMES), st.integers(0, 0)),
)


def ask_pod(units: int, policy: str, *, extra: bool, uid: str) -> dict[str, Any]:
    """One container asks; with ``extra``, an init container and a second app container
    that ask for nothing."""
    return pod(
        units,
        *([0] if extra else []),
        init=[0] if extra else [],
        uid=uid,
        name="train",
        annotations={"metagpu.io/placement-policy": policy},
    )


@st.composite
def asks(draw: st.DrawFn, uid: str) -> dict[str, Any]:
    """Mostly one container; often init containers (reused), sidecars, several apps."""
    policy = draw(st.sampled_from(["binpack", "spread"]))
    if draw(st.booleans()):
        asked = ask_pod(draw(st.integers(1, 320)), policy, extra=draw(st.booleans()), uid=uid)
        if draw(st.booleans()):
            asked["metadata"]["annotations"]["metagpu.io/compute-policy"] = "fixed"
        return asked
    sizes = st.one_of(st.integers(0, 250), st.sampled_from([0, 10, 100, 200]))
    return pod(
        *draw(st.lists(sizes, min_size=1, max_size=3)),
        init=draw(st.lists(sizes, max_size=2)),
        sidecars=draw(st.lists(sizes, max_size=1)),
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
    # a handful of nodes is placed row by row unless told otherwise: arrays both ways
    bulk.bulk.node_by_node_below = data.draw(st.sampled_from([0, 8]))

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
        same_answers(bulk, plain, data.draw(asks(f"q{step}")), asked)
        # the same pods again after every change: kept answers, patched row by row
        spread = {"metagpu.io/placement-policy": "spread"}
        for repeated in (
            pod(50, uid="r1"),
            pod(80, init=[30], uid="r2"),
            pod(150, uid="r3"),
            pod(60, uid="r4", annotations=spread),
        ):
            same_answers(bulk, plain, repeated, asked)


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


def test_a_pod_whose_init_container_is_reused_is_decided_in_bulk_too() -> None:
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("a", ledger([20, 0], node="a").model_dump_json())
    core.ledger.set_node("b", ledger([65, 0], node="b").model_dump_json())
    core.ledger.set_node("c", ledger([65, 30], node="c").model_dump_json())
    assert core.bulk is not None
    the_pod = pod(80, init=[30], name="train")
    ask = core.ask_of(the_pod)
    # a: the init container's 30 land on GPU 0 (80 free), the app's other 50 fit there too;
    # b: binpack would put the 30 on GPU 0 (35 free), with no room for 50 more there: the
    #    whole-pod plan puts them on GPU 1, where the app's 80 fit;
    # c: no GPU holds 80, wherever the 30 go
    outcome = core.bulk.filter(ask, ["a", "b", "c"])
    assert outcome is not None
    assert outcome.passed == ("a", "b")
    assert outcome.failed == {
        "c": 'container "c0": the GPU holding its 30 reused units has no room for 50 more '
        "(largest free 70; 75 free in total)"
    }
    assert outcome == filter_nodes(ask, ["a", "b", "c"], core.ledger, core.memo)


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


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["n2", "n0", "n1"], [2, 0, 1]),  # all known: one itemgetter call
        (["n2", "nowhere", "n0"], [2, -1, 0]),  # one unknown: name by name
        (["n1"], [1]),
        (["nowhere"], [-1]),
        ([], []),
    ],
)
def test_rows_of_every_name_known_or_not(names: list[str], expected: list[int]) -> None:
    core = ExtenderCore(resource=RESOURCE)
    for i in range(3):
        core.ledger.set_node(f"n{i}", ledger([i * 10], node=f"n{i}").model_dump_json())
    matrix = NodeMatrix(core.ledger)
    matrix.sync()
    fleet = matrix.fleet()
    assert fleet is not None
    rows = matrix.rows_of(names)
    assert rows.dtype == np.int64
    assert rows.shape == (len(names),)
    # rows as the matrix numbered them: n{i} has 100 - 10 * i units free
    by_free = {100 - 10 * i: f"n{i}" for i in range(3)}
    assert [by_free[int(fleet.free[row, 0])] if row >= 0 else None for row in rows] == [
        f"n{e}" if e >= 0 else None for e in expected
    ]


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


def test_answers_are_kept_by_kind_as_well_as_size() -> None:
    """30 + 50 units as an init container and an app (the 30 reused: 50 in all) is not
    30 + 50 as two apps (80 in all): the kept answer of one must not serve the other."""
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("a", ledger([40], node="a").model_dump_json())
    reused = parse_args({"Pod": pod(50, init=[30], uid="u1"), "NodeNames": ["a"]})
    both = parse_args({"Pod": pod(30, 50, uid="u2"), "NodeNames": ["a"]})
    assert core.filter(reused)["NodeNames"] == ["a"]
    assert core.filter(both)["NodeNames"] == []


def test_a_kept_answer_is_patched_only_where_nodes_changed() -> None:
    core = ExtenderCore(resource=RESOURCE)
    for i in range(8):
        core.ledger.set_node(f"n{i}", ledger([20, 90], node=f"n{i}").model_dump_json())
    core.warm()
    assert core.bulk is not None
    matrix = core.bulk.matrix
    args = parse_args({"Pod": pod(70), "NodeNames": [f"n{i}" for i in range(8)]})
    assert len(core.filter(args)["NodeNames"] or []) == 8
    version = matrix.version
    core.ledger.set_node("n3", ledger([50, 50], node="n3").model_dump_json())
    result = core.filter(args)
    changed = matrix.changed_since(version)
    assert changed is not None
    assert changed.tolist() == [matrix.rows_of(["n3"])[0]]
    assert result["FailedNodes"] == {
        "n3": "no single GPU has 70 free units (largest 50; 100 free in total)"
    }
    # a new node changes the number of rows: nothing before can be patched
    core.ledger.set_node("n8", ledger([0], node="n8").model_dump_json())
    matrix.sync()
    assert matrix.changed_since(version) is None
    assert core.filter(args)["FailedNodes"] == result["FailedNodes"]


@given(st.lists(st.lists(st.integers(0, 3), min_size=6, max_size=6), max_size=40))
def test_distinct_rows_equal_numpys_unique(rows: list[list[int]]) -> None:
    keys = np.array(rows, dtype=np.int64).reshape(-1, 6)
    distinct, inverse = distinct_rows(keys)
    assert sorted(map(tuple, distinct.tolist())) == sorted({tuple(r) for r in rows})
    assert len(distinct) == len({tuple(r) for r in rows})
    assert [distinct[i].tolist() for i in inverse.tolist()] == rows


def test_an_oversized_or_odd_ledger_refuses_that_node_only() -> None:
    """A node annotation no agent writes (a million units per GPU, a negative NUMA node)
    is that node's unreadable ledger; every other node is still answered."""
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("ok", ledger([0], node="ok").model_dump_json())
    huge = (
        ledger([0], node="huge")
        .model_dump_json()
        .replace('"units_per_gpu":100', '"units_per_gpu":1000000')
    )
    odd = ledger([0], numa=[0], node="odd").model_dump_json().replace('"numa":0', '"numa":-1')
    core.ledger.set_node("huge", huge)
    core.ledger.set_node("odd", odd)
    result = core.filter(parse_args({"Pod": pod(50), "NodeNames": ["ok", "huge", "odd"]}))
    assert result["NodeNames"] == ["ok"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"huge", "odd"}
    assert "cannot be read" in result["FailedAndUnresolvableNodes"]["huge"]


def test_a_fixed_pod_is_refused_where_nothing_caps_it_on_both_paths() -> None:
    """Issue 28: ``fixed`` only where a supervised MPS daemon caps SMs, with a reason the
    scheduler counts once; preemption cannot help there (unresolvable)."""
    cores = [ExtenderCore(resource=RESOURCE), ExtenderCore(resource=RESOURCE, bulk=False)]
    capped = ledger([0], node="mps").model_copy(update={"enforces": ("memory", "fixed")})
    for core in cores:
        core.ledger.set_node("mps", capped.model_dump_json())
        core.ledger.set_node("plain", ledger([0], node="plain").model_dump_json())
        core.ledger.set_node("old", ledger([0], node="old").model_dump_json())
    fixed = pod(50, annotations={"metagpu.io/compute-policy": "fixed"})
    balance = pod(50, annotations={"metagpu.io/compute-policy": "balance"})
    names = ["mps", "plain", "old", "unknown"]
    answers = []
    for core in cores:
        result = core.filter(parse_args({"Pod": fixed, "NodeNames": names}))
        assert result["NodeNames"] == ["mps"]
        assert result["FailedNodes"] == {}
        unresolvable = result["FailedAndUnresolvableNodes"]
        assert unresolvable["plain"] == unresolvable["old"] == FIXED_NEEDS_CAP
        assert unresolvable["unknown"] == NO_LEDGER
        answers.append(result)
        other = core.filter(parse_args({"Pod": balance, "NodeNames": names}))
        assert other["NodeNames"] == ["mps", "plain", "old"]
        # bind refuses it too (a node's ledger may change between filter and bind)
        refused = core.decide_bind(
            core.ask_of(fixed), node="plain", pod_uid="uid-p", namespace="ns", pod="p", now=0.0
        )
        assert refused == FIXED_NEEDS_CAP
        bound = core.decide_bind(
            core.ask_of(fixed), node="mps", pod_uid="uid-p", namespace="ns", pod="p", now=0.0
        )
        assert not isinstance(bound, str)
    assert answers[0] == answers[1]
    assert "metagpu.io/enforces=memory.fixed" in FIXED_NEEDS_CAP


@pytest.mark.parametrize("bulk", [True, False], ids=["arrays", "node-by-node"])
def test_a_pod_that_fits_nowhere_says_why_in_one_word(bulk: bool) -> None:
    """The label of metagpu_extender_unschedulable_total: the rule that refused the most
    nodes, the same on both paths; nodes without a ledger count as no_usable_ledger."""
    core = ExtenderCore(resource=RESOURCE, bulk=bulk)
    for n in range(3):
        core.ledger.set_node(f"a{n}", ledger([60, 60], node=f"a{n}").model_dump_json())
    core.ledger.set_node("b", ledger([100, 100], node="b").model_dump_json())
    names = ["a0", "a1", "a2", "b", "unknown-1"]
    result, why = core.filter_with_reason(parse_args({"Pod": pod(70), "NodeNames": names}))
    assert result["NodeNames"] == []
    assert why == "no_single_gpu"  # 3 nodes; "b" is short of units, "unknown-1" has no ledger
    result, why = core.filter_with_reason(
        parse_args({"Pod": pod(70), "NodeNames": ["b", "unknown-1", "unknown-2"]})
    )
    assert why == "no_usable_ledger"
    passed, why = core.filter_with_reason(parse_args({"Pod": pod(30), "NodeNames": names}))
    assert passed["NodeNames"]
    assert why is None


def test_a_stale_ledger_makes_its_node_unresolvable_on_the_arrays_too() -> None:
    from plugin.extender.ledger import rfc3339

    core = ExtenderCore(resource=RESOURCE)
    at = 1_800_000_000.0
    for name in ("a", "b"):
        text = ledger([40, 0], node=name).model_copy(update={"observed_at": rfc3339(at)})
        core.ledger.set_node(name, text.model_dump_json(), refresh_s=60)
    args = parse_args({"Pod": pod(50), "NodeNames": ["a", "b"]})
    assert core.filter(args)["NodeNames"] == ["a", "b"]
    core.ledger.set_node(
        "b",
        ledger([40, 0], node="b")
        .model_copy(update={"observed_at": rfc3339(at + 100)})
        .model_dump_json(),
        refresh_s=60,
    )
    assert core.ledger.mark_stale(at + 181) == ["a"]
    result = core.filter(args)
    assert result["NodeNames"] == ["b"]
    assert "has not refreshed" in result["FailedAndUnresolvableNodes"]["a"]
