"""The extender's pure decisions: table cases, then properties against place_pod itself."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from plugin.extender.decision import MAX_EXTENDER_PRIORITY, PlacementMemo
from plugin.extender.ledger import NO_LEDGER, Ledger, NodeView
from plugin.extender.pods import PodSpecError, container_requests, placement_policy
from plugin.extender.protocol import parse_args
from plugin.extender.service import ExtenderCore
from plugin.placement.pod import GpuState, place_pod
from tests.extender.builders import RESOURCE, ledger, pod


def core_with(*, node_by_node: bool = False, **nodes: Any) -> ExtenderCore:
    """A core with these nodes' ledgers; ``node_by_node``: without the vectorised path."""
    core = ExtenderCore(resource=RESOURCE, bulk=not node_by_node)
    for name, node_ledger in nodes.items():
        core.ledger.set_node(name, None if node_ledger is None else node_ledger.model_dump_json())
    return core


def filter_pod(core: ExtenderCore, the_pod: dict[str, Any], *names: str) -> dict[str, Any]:
    return dict(core.filter(parse_args({"Pod": the_pod, "NodeNames": list(names)})))


# ------------------------------------------------------------------ filter table
@pytest.mark.parametrize(
    ("used", "app", "passes", "reason"),
    [
        pytest.param(
            [40, 40],
            [70],
            False,
            "no single GPU has 70 free units (largest 60; 120 free in total)",
            id="issue-14: 0.7 over two 0.6 GPUs",
        ),
        pytest.param(
            [60, 60],
            [70],
            False,
            "no single GPU has 70 free units (largest 40; 80 free in total)",
            id="the captured event wording",
        ),
        pytest.param([30, 60], [70], True, "", id="fits on the emptier GPU"),
        pytest.param([0, 0], [150], True, "", id="1.5 GPUs: whole + half"),
        pytest.param(
            [10, 10, 0],
            [200],
            False,
            "needs 2 completely free GPUs and 1 is",
            id="two whole GPUs, one is partly used",
        ),
        pytest.param(
            [100, 100], [10], False, "needs 10 units, 0 free on healthy GPUs", id="full node"
        ),
    ],
)
def test_filter_table(used: list[int], app: list[int], passes: bool, reason: str) -> None:
    core = core_with(a=ledger(used, node="a"))
    result = filter_pod(core, pod(*app), "a")
    assert result["Error"] == ""
    if passes:
        assert result["NodeNames"] == ["a"]
        assert result["FailedNodes"] == {}
    else:
        assert result["NodeNames"] == []
        assert reason in result["FailedNodes"]["a"]


def test_a_node_without_a_ledger_fails_with_a_reason_the_user_can_act_on() -> None:
    core = core_with(a=None)
    result = filter_pod(core, pod(30), "a", "never-seen")
    # Preempting pods cannot give a node a ledger: the scheduler skips it in preemption.
    assert result["FailedAndUnresolvableNodes"] == {"a": NO_LEDGER, "never-seen": NO_LEDGER}
    assert result["FailedNodes"] == {}
    assert "metagpu agent has not reported this node's GPUs" in NO_LEDGER


def test_unhealthy_gpus_are_never_offered() -> None:
    core = core_with(a=ledger([0, 90], unhealthy=[0], node="a"))
    result = filter_pod(core, pod(30), "a")
    assert "1 GPU unhealthy" in result["FailedNodes"]["a"]


def test_a_ledger_for_another_resource_or_unreadable_is_a_reason() -> None:
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("a", "{not json")
    core.ledger.set_node(
        "b", ledger([0]).model_copy(update={"resource": "example.com/gpu"}).model_dump_json()
    )
    failed = filter_pod(core, pod(30), "a", "b")["FailedAndUnresolvableNodes"]
    assert "cannot be read" in failed["a"]
    assert "example.com/gpu" in failed["b"]


def test_the_init_container_fixture_shape_is_read_the_kubelets_way() -> None:
    # warm (init, 30) then proxy (init, 20: the 1.28 API server dropped restartPolicy) then main 50
    from tests.extender.builders import load_fixture

    args = load_fixture("filter-init-containers.json")
    asks = container_requests(args["Pod"], resource=RESOURCE)
    assert [(c.name, c.kind, c.units) for c in asks] == [
        ("warm", "init", 30),
        ("proxy", "init", 20),
        ("main", "app", 50),
    ]


def test_sidecars_are_told_apart_from_init_containers() -> None:
    asks = container_requests(pod(10, init=[20], sidecars=[5]), resource=RESOURCE)
    assert [(c.kind, c.units) for c in asks] == [("sidecar", 5), ("init", 20), ("app", 10)]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"containers": "x"}, "spec.containers must be a list", id="not a list"),
        pytest.param({"containers": [{"image": "x"}]}, "has no name", id="no name"),
        pytest.param(
            {"containers": [{"name": "c", "resources": {"limits": {RESOURCE: "0.5"}}}]},
            "is not a whole number of units",
            id="fractional quantity",
        ),
    ],
)
def test_unreadable_pods_get_an_error_naming_the_problem(spec: Any, message: str) -> None:
    with pytest.raises(PodSpecError, match=message):
        container_requests({"spec": spec}, resource=RESOURCE)
    core = core_with(a=ledger([0], node="a"))
    result = filter_pod(core, {"metadata": {"name": "p"}, "spec": spec}, "a")
    assert message in result["Error"]


# ------------------------------------------------------------------ policy
@pytest.mark.parametrize(
    ("pod_value", "ns_value", "expected", "warns"),
    [
        pytest.param(None, None, "binpack", False, id="default"),
        pytest.param("spread", None, "spread", False, id="pod"),
        pytest.param(None, "spread", "spread", False, id="namespace"),
        pytest.param("binpack", "spread", "binpack", False, id="pod wins"),
        pytest.param("tight", None, "binpack", True, id="invalid: default and a warning"),
    ],
)
def test_placement_policy_override(
    pod_value: str | None, ns_value: str | None, expected: str, warns: bool
) -> None:
    annotations = {"metagpu.io/placement-policy": pod_value} if pod_value else None
    ns = {"metagpu.io/placement-policy": ns_value} if ns_value else None
    policy, warning = placement_policy(
        pod(10, annotations=annotations), namespace_annotations=ns, default="binpack"
    )
    assert policy == expected
    assert (warning is not None) == warns


# ------------------------------------------------------------------ prioritize
def test_binpack_prefers_the_node_whose_gpu_fits_tightest_and_spread_the_opposite() -> None:
    core = core_with(
        tight=ledger([25, 0], node="tight"),  # 70 leaves 5 on GPU 0
        loose=ledger([0, 0], node="loose"),  # 70 leaves 30
    )
    args = parse_args({"Pod": pod(70), "NodeNames": ["tight", "loose"]})
    scores = {h["Host"]: h["Score"] for h in core.prioritize(args)}
    assert scores["tight"] > scores["loose"]
    assert all(0 <= s <= MAX_EXTENDER_PRIORITY for s in scores.values())
    spread = pod(70, annotations={"metagpu.io/placement-policy": "spread"}, uid="u2")
    args = parse_args({"Pod": spread, "NodeNames": ["tight", "loose"]})
    scores = {h["Host"]: h["Score"] for h in core.prioritize(args)}
    assert scores["loose"] > scores["tight"]


def test_a_node_the_pod_does_not_fit_scores_zero() -> None:
    core = core_with(full=ledger([90, 90], node="full"), none=None)
    args = parse_args({"Pod": pod(70), "NodeNames": ["full", "none"]})
    assert core.prioritize(args) == [{"Host": "full", "Score": 0}, {"Host": "none", "Score": 0}]


# ------------------------------------------------------------------ bind decision
def test_bind_records_place_pods_gpus_and_reserves_them() -> None:
    core = core_with(a=ledger([60, 30], node="a"))  # free: 40, 70
    ask = core.ask_of(pod(40, init=[30], uid="u1"))
    decision = core.decide_bind(ask, node="a", pod_uid="u1", namespace="ns", pod="p", now=0)
    assert not isinstance(decision, str)
    # binpack: the init container's 30 go to the tightest GPU (0); the app container
    # reuses them and takes its 10 more there too: one GPU, 40 units in all.
    assert [(c.container, c.kind, c.gpus) for c in decision.assignment.containers] == [
        ("init0", "init", {"GPU-a-0": 30}),
        ("c0", "app", {"GPU-a-0": 40}),
    ]
    assert decision.assignment.taken == {"GPU-a-0": 40}
    view = core.ledger.view("a")
    assert isinstance(view, NodeView)
    assert [g.free for g in view.gpus] == [0, 70]  # reserved at once
    second = core.decide_bind(
        core.ask_of(pod(70, uid="u2")), node="a", pod_uid="u2", namespace="ns", pod="q", now=0
    )
    assert not isinstance(second, str)
    assert second.assignment.taken == {"GPU-a-1": 70}
    third = core.decide_bind(
        core.ask_of(pod(10, uid="u3")), node="a", pod_uid="u3", namespace="ns", pod="r", now=0
    )
    assert third == 'container "c0" needs 10 units, 0 free on healthy GPUs'


def test_a_retried_bind_does_not_compete_with_its_own_reservation() -> None:
    core = core_with(a=ledger([30], node="a"))
    ask = core.ask_of(pod(70, uid="u1"))
    first = core.decide_bind(ask, node="a", pod_uid="u1", namespace="ns", pod="p", now=0)
    second = core.decide_bind(ask, node="a", pod_uid="u1", namespace="ns", pod="p", now=1)
    assert not isinstance(first, str)
    assert not isinstance(second, str)
    assert first.assignment.taken == second.assignment.taken


# ------------------------------------------------------------------ properties
units_per_gpu = st.sampled_from([10, 100])


@st.composite
def node_states(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int | None]]:
    upg = draw(units_per_gpu)
    n = draw(st.integers(1, 6))
    used = draw(st.lists(st.integers(0, upg), min_size=n, max_size=n))
    unhealthy = draw(st.lists(st.integers(0, n - 1), max_size=2))
    numa = draw(st.lists(st.sampled_from([None, 0, 1]), min_size=n, max_size=n))
    return upg, used, unhealthy, numa


@st.composite
def pods(draw: st.DrawFn, upg: int) -> dict[str, Any]:
    app = draw(st.lists(st.integers(0, 2 * upg), min_size=1, max_size=3))
    init = draw(st.lists(st.integers(0, upg), max_size=2))
    sidecars = draw(st.lists(st.integers(0, upg // 2), max_size=1))
    policy = draw(st.sampled_from(["binpack", "spread"]))
    return pod(
        *app,
        init=init,
        sidecars=sidecars,
        annotations={"metagpu.io/placement-policy": policy},
        uid=f"u-{draw(st.integers(0, 10**6))}",
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data(), state=node_states())
def test_filter_passes_iff_place_pod_fits_and_bind_chooses_what_place_pod_chooses(
    data: st.DataObject, state: tuple[int, list[int], list[int], list[int | None]]
) -> None:
    upg, used, unhealthy, numa = state
    node_ledger = ledger(used, units=upg, unhealthy=unhealthy, numa=numa, node="a")
    the_pod = data.draw(pods(upg))
    core = core_with(a=node_ledger)
    # A pod of another workload with the same sizes went first: its answer is shared,
    # and must come back with this pod's own container names.
    twin = json.loads(json.dumps(the_pod))
    twin["metadata"]["uid"] = "twin"
    for field in ("initContainers", "containers"):
        for c in twin["spec"].get(field, []):
            c["name"] = "twin-" + c["name"]
    filter_pod(core, twin, "a")
    ask = core.ask_of(the_pod)
    gpus = [
        GpuState(g.uuid, g.units - g.used, g.healthy, g.numa)
        for g in sorted(node_ledger.gpus, key=lambda g: g.index)
    ]
    expected = place_pod(ask.containers, gpus, units_per_gpu=upg, policy=ask.policy)
    note(f"expected={expected}")
    result = filter_pod(core, the_pod, "a")
    assert (result["NodeNames"] == ["a"]) == expected.fits
    if not expected.fits:
        assert result["FailedNodes"]["a"] == expected.refusal
    decision = core.decide_bind(
        ask, node="a", pod_uid=the_pod["metadata"]["uid"], namespace="ns", pod="p", now=0
    )
    if expected.fits:
        assert not isinstance(decision, str)
        assert {c.container: c.gpus for c in decision.assignment.containers} == {
            c.name: dict(c.gpus) for c in expected.containers
        }
        assert decision.assignment.taken == dict(expected.taken)
    else:
        assert isinstance(decision, str)
        assert expected.refusal is not None
        assert expected.refusal in decision


@settings(max_examples=100, deadline=None)
@given(data=st.data(), state=node_states())
def test_binds_in_a_row_never_overcommit_a_gpu(
    data: st.DataObject, state: tuple[int, list[int], list[int], list[int | None]]
) -> None:
    upg, used, unhealthy, numa = state
    core = core_with(a=ledger(used, units=upg, unhealthy=unhealthy, numa=numa, node="a"))
    held = {f"GPU-a-{i}": n for i, n in enumerate(used)}
    for k in range(data.draw(st.integers(1, 8))):
        the_pod = data.draw(pods(upg))
        ask = core.ask_of(the_pod)
        decision = core.decide_bind(ask, node="a", pod_uid=f"k{k}", namespace="ns", pod="p", now=0)
        if isinstance(decision, str):
            continue
        for gpu, n in decision.assignment.taken.items():
            held[gpu] += n
            assert held[gpu] <= upg, f"{gpu} over-committed"
            assert int(gpu.rsplit("-", 1)[1]) not in unhealthy


def test_pods_of_the_same_sizes_share_answers_under_their_own_names() -> None:
    core = core_with(a=ledger([40, 40], node="a"), b=ledger([0, 20], node="b"))
    first = pod(70, init=[10], name="train", uid="u1")
    other = pod(70, init=[10], name="serve", uid="u2")
    other["spec"]["containers"][0]["name"] = "model"
    other["spec"]["initContainers"][0]["name"] = "warmup"
    one = filter_pod(core, first, "a", "b")
    misses = core.memo.misses
    two = filter_pod(core, other, "a", "b")
    assert core.memo.misses == misses  # answered from the first pod's placements
    assert one["NodeNames"] == two["NodeNames"] == ["b"]
    assert one["FailedNodes"]["a"] == two["FailedNodes"]["a"].replace("model", "c0")
    decision = core.decide_bind(
        core.ask_of(other), node="b", pod_uid="u2", namespace="ns", pod="serve", now=0
    )
    assert not isinstance(decision, str)
    assert [c.container for c in decision.assignment.containers] == ["warmup", "model"]


def test_the_memo_answers_equal_nodes_once() -> None:
    nodes = {f"n{i}": ledger([10, 20], node=f"n{i}") for i in range(50)}
    core = core_with(node_by_node=True, **nodes)
    memo = core.memo
    assert isinstance(memo, PlacementMemo)
    filter_pod(core, pod(30), *[f"n{i}" for i in range(50)])
    assert memo.misses == 1
    assert memo.hits == 49


def test_a_heartbeat_with_the_same_ledger_changes_nothing() -> None:
    led = Ledger(resource=RESOURCE)
    text = ledger([10], node="a").model_dump_json()
    led.set_node("a", text)
    view = led.view("a")
    led.set_node("a", text)  # a Node status update: same annotation
    assert led.view("a") is view
    led.set_node("a", None)  # the annotation is gone
    assert isinstance(led.view("a"), str)


def test_views_rebuild_when_a_report_or_assumption_changes() -> None:
    led = Ledger(resource=RESOURCE)
    led.set_node("a", ledger([0], node="a").model_dump_json())
    first = led.view("a")
    assert isinstance(first, NodeView)
    assert led.view("a") is first
    led.set_node("a", ledger([50], node="a").model_dump_json())
    second = led.view("a")
    assert isinstance(second, NodeView)
    assert second.gpus[0].free == 50
