"""Whole-pod plans (issue 27): a node is refused only when no plan the kubelet would honour exists.

The reference here is an exhaustive search written from the kubelet's rules
(``../shared/KUBELET-FACTS.md`` section 1) and nothing of the placement code:
every container, in the kubelet's order, first takes its pod's reusable units
(a regular init container's, for the containers after it), then any
distribution of the rest over the GPUs' free units; a container may end with
at most one GPU partly used (a fraction never split). Taking only part of
reusable units that lie on several GPUs is not a plan: the kubelet picks them
from an unordered set, so no assignment made in advance can be honoured.

On random small nodes (up to 4 GPUs, shares already held) and pods (init,
sidecar and app containers, shares and whole GPUs):

* place_pod fits iff the reference finds a plan, and its plan is one the
  reference accepts;
* the extender's filter over many nodes at once (the arrays) passes exactly
  the nodes the reference has a plan for.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.extender.service import ExtenderCore
from plugin.placement.fleet import fleet_of
from plugin.placement.fleet.packing import two_items_fit
from plugin.placement.fleet.replay import rows_until_spent
from plugin.placement.plan_search import SearchBudget, independent_items
from plugin.placement.pod import ContainerRequest, GpuState, place_pod
from plugin.placement.refusals import ContainerKind
from tests.extender.builders import RESOURCE, ledger

Ask = tuple[tuple[ContainerKind, int], ...]


def reference_has_plan(asks: Ask, free: Sequence[int], upg: int) -> bool:
    """Whether any plan exists, by trying every distribution of every container."""

    @cache
    def search(index: int, free: tuple[int, ...], reusable: tuple[int, ...]) -> bool:
        if index == len(asks):
            return True
        kind, units = asks[index]
        if units == 0:
            return search(index + 1, free, reusable)
        total = sum(reusable)
        if units < total and sum(1 for n in reusable if n) > 1:
            return False
        held = list(reusable) if units >= total else [units if n else 0 for n in reusable]
        left = [r - h for r, h in zip(reusable, held, strict=True)]
        for take in distributions(units - sum(held), free):
            mine = [h + t for h, t in zip(held, take, strict=True)]
            if sum(1 for n in mine if 0 < n < upg) > 1:
                continue
            after = tuple(f - t for f, t in zip(free, take, strict=True))
            kept = tuple(r + m for r, m in zip(left, mine, strict=True)) if kind == "init" else left
            if search(index + 1, after, tuple(kept)):
                return True
        return False

    return search(0, tuple(free), (0,) * len(free))


def distributions(need: int, free: Sequence[int]) -> list[tuple[int, ...]]:
    """Every way of taking ``need`` units from GPUs with ``free`` units."""
    if not free:
        return [()] if need == 0 else []
    out: list[tuple[int, ...]] = []
    for first in range(min(need, free[0]) + 1):
        out.extend((first, *rest) for rest in distributions(need - first, free[1:]))
    return out


def reference_taken(
    asks: Ask, free: Sequence[int], upg: int, plan: Sequence[dict[int, int]]
) -> dict[int, int] | None:
    """The units ``plan`` (each asking container's units per GPU) takes from each GPU,
    or None when the kubelet would not honour it on ``free``."""
    start = list(free)
    free = list(free)
    reusable = [0] * len(free)
    placed = iter(plan)
    for kind, units in asks:
        if units == 0:
            continue
        gpus = next(placed)
        mine = [gpus.get(pos, 0) for pos in range(len(free))]
        total = sum(reusable)
        if units < total and sum(1 for n in reusable if n) > 1:
            return None
        held = list(reusable) if units >= total else [units if n else 0 for n in reusable]
        take = [m - h for m, h in zip(mine, held, strict=True)]
        if sum(mine) != units or any(t < 0 or t > f for t, f in zip(take, free, strict=True)):
            return None
        if sum(1 for n in mine if 0 < n < upg) > 1:
            return None
        free = [f - t for f, t in zip(free, take, strict=True)]
        reusable = [r - h for r, h in zip(reusable, held, strict=True)]
        if kind == "init":
            reusable = [r + m for r, m in zip(reusable, mine, strict=True)]
    return {pos: a - b for pos, (a, b) in enumerate(zip(start, free, strict=True)) if a != b}


UPG = st.sampled_from([4, 5, 6])


@st.composite
def pods(draw: st.DrawFn, upg: int) -> Ask:
    """Up to 4 containers, init containers first; shares and up to two whole GPUs."""
    units = st.integers(min_value=0, max_value=2 * upg + upg // 2)
    inits = draw(
        st.lists(st.tuples(st.sampled_from(["init", "sidecar"]), units), min_size=0, max_size=2)
    )
    apps = draw(st.lists(units.map(lambda n: ("app", n)), min_size=1, max_size=2))
    return tuple((kind, n) for kind, n in [*inits, *apps])  # type: ignore[misc]


@st.composite
def nodes(draw: st.DrawFn, upg: int) -> list[int]:
    return draw(st.lists(st.integers(min_value=0, max_value=upg), min_size=1, max_size=4))


def requests(asks: Ask) -> list[ContainerRequest]:
    return [ContainerRequest(f"c{n}", kind, units) for n, (kind, units) in enumerate(asks)]


@settings(max_examples=400, deadline=None)
@given(data=st.data(), upg=UPG, policy=st.sampled_from(["binpack", "spread"]))
def test_place_pod_fits_iff_a_plan_exists_and_its_plan_is_honoured(
    data: st.DataObject, upg: int, policy: str
) -> None:
    asks = data.draw(pods(upg))
    free = data.draw(nodes(upg))
    placed = place_pod(
        requests(asks),
        [GpuState(f"G{pos}", n) for pos, n in enumerate(free)],
        units_per_gpu=upg,
        policy=policy,  # type: ignore[arg-type]
    )
    assert placed.fits == reference_has_plan(asks, free, upg), placed.refusal
    if placed.fits:
        plan = [{int(gpu[1:]): n for gpu, n in c.gpus.items()} for c in placed.containers]
        taken = reference_taken(asks, free, upg, plan)
        assert taken is not None, plan
        assert {int(gpu[1:]): n for gpu, n in placed.taken.items()} == taken


def pod_of(asks: Ask) -> dict[str, Any]:
    """A pod whose containers are ``asks`` in that order (init containers and sidecars
    as init containers, in place)."""

    def container(n: int, units: int, **more: Any) -> dict[str, Any]:
        res = {"limits": {RESOURCE: str(units)}, "requests": {RESOURCE: str(units)}}
        return {"name": f"c{n}", "image": "busybox", "resources": res if units else {}, **more}

    inits = [
        container(n, units, **({"restartPolicy": "Always"} if kind == "sidecar" else {}))
        for n, (kind, units) in enumerate(asks)
        if kind != "app"
    ]
    apps = [container(n, units) for n, (kind, units) in enumerate(asks) if kind == "app"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {"schedulerName": "metagpu-scheduler", "initContainers": inits, "containers": apps},
    }


@settings(max_examples=100, deadline=None)
@given(data=st.data(), policy=st.sampled_from(["binpack", "spread"]))
def test_the_extenders_filter_passes_exactly_the_nodes_with_a_plan(
    data: st.DataObject, policy: str
) -> None:
    """Twelve nodes of one GPU size (the arrays' path), one pod: filter vs the reference."""
    upg = 100
    small = data.draw(pods(5))
    asks = tuple((kind, n * 20) for kind, n in small)
    used = data.draw(
        st.lists(
            st.lists(st.integers(min_value=0, max_value=5).map(lambda n: n * 20), max_size=4),
            min_size=12,
            max_size=12,
        )
    )
    core = ExtenderCore(resource=RESOURCE, default_policy=policy)  # type: ignore[arg-type]
    names = [f"n{row}" for row in range(len(used))]
    for name, node_used in zip(names, used, strict=True):
        core.ledger.set_node(name, ledger(node_used or [0], node=name).model_dump_json())
    ask = core.ask_of(pod_of(asks))
    assert [(c.kind, c.units) for c in ask.containers] == list(asks)
    assert core.bulk is not None
    outcome = core.bulk.filter(ask, names)
    assert outcome is not None
    expected = [
        name
        for name, node_used in zip(names, used, strict=True)
        # (the reference on the same node in steps of 20 units: the same plans, fewer tries)
        if reference_has_plan(small, [(upg - n) // 20 for n in (node_used or [0])], upg // 20)
    ]
    assert list(outcome.passed) == expected


@settings(max_examples=400, deadline=None)
@given(data=st.data(), upg=UPG)
def test_two_independent_items_fit_exactly_when_a_plan_exists(
    data: st.DataObject, upg: int
) -> None:
    """The arrays' exact check for two items (:mod:`plugin.placement.fleet.packing`), which
    spares the search the nodes without a plan, against the reference on each row."""
    units = st.integers(min_value=1, max_value=2 * upg + upg // 2)
    first, second = data.draw(units), data.draw(units)
    rows = data.draw(st.lists(nodes(upg), min_size=1, max_size=6))
    width = max(len(r) for r in rows)
    free = np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    fits = two_items_fit(free, np.full(len(rows), upg, dtype=np.int64), first, second)
    expected = [reference_has_plan((("sidecar", first), ("app", second)), row, upg) for row in rows]
    assert fits.tolist() == expected


def test_independent_items_reduce_chains_to_their_last_container() -> None:
    assert independent_items((("init", 30), ("app", 50))) == [50]
    assert independent_items((("sidecar", 10), ("init", 150), ("app", 170))) == [10, 170]
    assert independent_items((("init", 150), ("app", 170), ("app", 30))) == [170, 30]
    # an init container whose units the next takes only in part: not independent
    assert independent_items((("init", 150), ("app", 50))) is None


def test_a_spent_search_budget_leaves_the_replays_refusal() -> None:
    """Only the search places this pod: the second init container reuses part of the
    first's 2 units, so neither is raised for the app; binpack puts the 2 on the GPU
    with 2 free, where the app's 3 cannot follow. With the decision's budget spent the
    node keeps the replay's reason; with budget left, all three go to the other GPU."""
    asks: Ask = (("init", 2), ("init", 1), ("app", 3))
    gpus = [GpuState("G0", 2), GpuState("G1", 3)]
    spent = place_pod(
        requests(asks), gpus, units_per_gpu=6, policy="binpack", budget=SearchBudget(left=0)
    )
    fresh = place_pod(requests(asks), gpus, units_per_gpu=6, policy="binpack")
    assert [dict(c.gpus) for c in fresh.containers] == [{"G1": 2}, {"G1": 1}, {"G1": 3}]
    assert spent.refusal == (
        'container "c2": the GPU holding its 2 reused units has no room for 1 more '
        "(largest free 3; 3 free in total)"
    )


def test_rows_past_a_spent_budget_are_not_decided() -> None:
    """A pod whose searches spend the decision's budget stops costing: the rows after it
    are left to the caller, which keeps the replay's refusal there (fleet.searched)."""
    fleet = fleet_of([(6, [GpuState(f"G{g}", 2) for g in range(4)]) for _ in range(40)])
    pod = requests((("init", 2), ("init", 1), ("app", 3)))
    budget = SearchBudget(left=50)
    placed, decided = rows_until_spent(fleet, pod, "binpack", budget=budget)
    assert budget.left <= 0
    assert 0 < decided < 40
    assert not placed.fits[:decided].any()
