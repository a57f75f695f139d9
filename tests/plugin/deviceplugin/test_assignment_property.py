"""The extender's decision and the plugin agree through the real kubelet protocol.

40 random pods of mixed fractions are bound to a 2-GPU node with the shared
decision (:func:`plugin.placement.pod.place_pod` on the node's current counts;
a pod it refuses is skipped, as the extender's filter would), each recording its
:class:`~plugin.api.scheduling.PodAssignment`. The plugin sees the assignments
through its book (the interface its pod watch fills; the watch itself is tested
against the fake API server in ``test_assignment_watch.py``). The simulated
kubelet then admits the pods over real gRPC (GetPreferredAllocation, Allocate)
in bind order and in a shuffled order: no container ever gets a split fraction,
no GPU gives out more than its units.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from metagpu.kubelet_sim import KubeletSim, KubeletSimError
from plugin.deviceplugin.assignments import AssignmentBook
from plugin.placement.pod import ContainerRequest, GpuState, PodPlacement, place_pod
from plugin.placement.refusals import ContainerKind
from plugin.placement.units import is_fraction_split
from tests.plugin.builders import uuid_for
from tests.plugin.conftest import kubelet_and_plugin
from tests.plugin.deviceplugin.assignment_builders import assigned_pod

R = "cnvrg.io/metagpu"
U = 100
GPUS = [uuid_for(0), uuid_for(1)]


def random_units(rng: random.Random, *, low: int, high: int) -> int:
    """Mostly a fraction of ``low``-``high`` units; one GPU one time in ten, 1.5 GPUs one in
    twenty."""
    roll = rng.random()
    if roll < 0.1:
        return 100
    if roll < 0.15:
        return 150
    return rng.randint(low, high)


def random_pod(rng: random.Random, n: int) -> list[ContainerRequest]:
    """Mostly one fraction of 0.1-0.75; some whole and 1.5 GPUs; some with init containers."""

    def units() -> int:
        return random_units(rng, low=10, high=75)

    containers: list[ContainerRequest] = []
    if rng.random() < 0.25:
        containers.append(ContainerRequest(f"init-{n}", "init", rng.randint(10, 60)))
    for c in range(1 if rng.random() < 0.8 else 2):
        containers.append(ContainerRequest(f"main-{c}", "app", units()))
    return containers


Bound = tuple[dict[str, Any], list[ContainerRequest], PodPlacement]


def counts(ids: list[str] | set[str]) -> dict[str, int]:
    return dict(Counter(i.rsplit("::", 1)[0] for i in ids))


async def bind_and_admit(
    kubelet: KubeletSim,
    book: AssignmentBook,
    *,
    seed: int,
    shuffle: bool,
    target: int = 40,
    gpus: Sequence[str] = GPUS,
    make_pod: Callable[[random.Random, int], list[ContainerRequest]] = random_pod,
) -> tuple[int, list[str]]:
    """Bind ``target`` random pods in rounds and let the kubelet admit each round.

    A round binds pods the extender's way until the node refuses three in a row:
    ``place_pod`` on the node's free units (what the kubelet really allocated, as
    the agent's ledger reports it, minus what this round already booked); a pod
    it refuses is skipped, as the extender's filter would. The kubelet then admits
    the round in bind order or shuffled. Then about half of the pods on the node
    end (their devices go back, the pod is deleted), and the next round binds.

    Returns how many pods were bound and the ones the plugin refused; asserts
    after each admission that no container got a split fraction, that no GPU
    gave out more than its units, and in bind order that every container got
    exactly its assignment.
    """
    rng = random.Random(seed)
    conn = kubelet.plugins[R]
    alive: dict[str, tuple[dict[str, Any], set[str]]] = {}
    bound = 0
    refused: list[str] = []
    n = 0
    while bound < target:
        booked: Counter[str] = Counter()
        round_pods: list[Bound] = []
        misses = 0
        while misses < 3 and bound < target:
            containers = make_pod(rng, n)
            n += 1
            held = counts(conn.allocated)
            placement = place_pod(
                containers,
                [GpuState(g, U - held.get(g, 0) - booked[g]) for g in gpus],
                units_per_gpu=U,
                policy="binpack",
            )
            if not placement.fits:
                misses += 1
                continue
            misses = 0
            booked.update(placement.taken)
            pod = assigned_pod(
                f"pod-{n:03d}",
                [(c.name, c.kind, c.units, dict(c.gpus)) for c in placement.containers],
                created=f"2026-11-25T10:{n // 60:02d}:{n % 60:02d}Z",
            )
            book.apply("ADDED", pod)
            round_pods.append((pod, containers, placement))
            bound += 1
        order = list(round_pods)
        if shuffle:
            rng.shuffle(order)
        for pod, containers, placement in order:
            name = pod["metadata"]["name"]
            try:
                admitted = await kubelet.admit_pod(
                    R, [(c.name, c.kind, c.units) for c in containers]
                )
            except KubeletSimError as exc:
                refused.append(f"{name}: {exc}")
                book.apply("DELETED", pod)
                continue
            devices: set[str] = set()
            for cname, ids, response in admitted:
                per_gpu = counts(ids)
                assert not is_fraction_split(per_gpu.values(), units_per_gpu=U), (name, per_gpu)
                assert response.envs["METAGPU_UNITS"] == str(len(ids))
                if not shuffle:
                    wanted = next(c for c in placement.containers if c.name == cname)
                    assert per_gpu == dict(wanted.gpus), (name, cname)
                devices.update(ids)
            alive[name] = (pod, devices)
            held = counts(conn.allocated)
            assert all(v <= U for v in held.values()), held  # no GPU over-committed
            assert len(conn.allocated) == sum(len(d) for _, d in alive.values())  # none twice
        for name in sorted(alive):
            if rng.random() < 0.5:
                pod, devices = alive.pop(name)
                kubelet.release(R, sorted(devices))
                book.apply("DELETED", pod)
    return bound, refused


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_bind_order_every_container_gets_exactly_its_assignment(
    short_tmp_path: Path, seed: int
) -> None:
    async with kubelet_and_plugin(short_tmp_path, gpu_count=2) as (kubelet, plugin):
        await kubelet.wait_registered(R)
        bound, refused = await bind_and_admit(
            kubelet, plugin.supervisor.book, seed=seed, shuffle=False
        )
    assert (bound, refused) == (40, [])


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_shuffled_order_never_splits_nor_overcommits(short_tmp_path: Path, seed: int) -> None:
    async with kubelet_and_plugin(
        short_tmp_path, gpu_count=2, config={"placement": {"extender": True}}
    ) as (kubelet, plugin):
        await kubelet.wait_registered(R)
        bound, refused = await bind_and_admit(
            kubelet, plugin.supervisor.book, seed=seed, shuffle=True
        )
    # Same-sized pending containers are interchangeable: a pod may get another's
    # GPU, never a split; the extender booked every unit, so every pod fits.
    assert (bound, refused) == (40, [])


def random_multi_container_pod(rng: random.Random, n: int) -> list[ContainerRequest]:
    """Pods whose containers' GPUs depend on each other (issue 27): init containers reused
    by the next, sidecars keeping theirs, app containers, shares and whole GPUs."""

    def units() -> int:
        return random_units(rng, low=5, high=70)

    containers: list[ContainerRequest] = []
    for i in range(rng.choice([0, 1, 1, 2])):
        kind: ContainerKind = "sidecar" if rng.random() < 0.3 else "init"
        containers.append(ContainerRequest(f"{kind}-{i}", kind, units()))
    for c in range(1 if rng.random() < 0.7 else 2):
        containers.append(ContainerRequest(f"main-{c}", "app", units()))
    return containers


@pytest.mark.parametrize("seed", [11, 12, 13])
async def test_whole_pod_plans_are_honoured_container_by_container(
    short_tmp_path: Path, seed: int
) -> None:
    """Plans that move an earlier container's share for a later one's sake (the whole-pod
    search), bound on four GPUs and admitted in bind order: every container gets exactly
    its assignment, init containers included, and no fraction is split."""
    gpus = [uuid_for(i) for i in range(4)]
    async with kubelet_and_plugin(short_tmp_path, gpu_count=4) as (kubelet, plugin):
        await kubelet.wait_registered(R)
        bound, refused = await bind_and_admit(
            kubelet,
            plugin.supervisor.book,
            seed=seed,
            shuffle=False,
            gpus=gpus,
            make_pod=random_multi_container_pod,
        )
    assert (bound, refused) == (40, [])


async def test_the_issues_init_reuse_pod_runs_with_the_app_on_one_gpu(
    short_tmp_path: Path,
) -> None:
    """Issue 27, as seen on a real cluster: GPU 0 at 60 units used, GPU 1 empty; an init
    container of 30 then an app container of 50. Placed, bound, and admitted by the
    kubelet over real gRPC: both on GPU 1, the app's 50 holding the init's 30."""
    async with kubelet_and_plugin(short_tmp_path, gpu_count=2) as (kubelet, plugin):
        await kubelet.wait_registered(R)
        book = plugin.supervisor.book
        filler = place_pod(
            [ContainerRequest("main", "app", 60)],
            [GpuState(g, U) for g in GPUS],
            units_per_gpu=U,
            policy="binpack",
        )
        book.apply(
            "ADDED",
            assigned_pod(
                "filler", [("main", "app", 60, dict(filler.containers[0].gpus))], created="1"
            ),
        )
        await kubelet.admit_pod(R, [("main", "app", 60)])
        held = counts(kubelet.plugins[R].allocated)
        assert held == {GPUS[0]: 60}
        pod = [ContainerRequest("warm", "init", 30), ContainerRequest("main", "app", 50)]
        placement = place_pod(
            pod, [GpuState(g, U - held.get(g, 0)) for g in GPUS], units_per_gpu=U, policy="binpack"
        )
        assert placement.refusal is None
        assert [dict(c.gpus) for c in placement.containers] == [{GPUS[1]: 30}, {GPUS[1]: 50}]
        book.apply(
            "ADDED",
            assigned_pod(
                "reuse",
                [(c.name, c.kind, c.units, dict(c.gpus)) for c in placement.containers],
                created="2",
            ),
        )
        admitted = await kubelet.admit_pod(R, [("warm", "init", 30), ("main", "app", 50)])
    assert [(name, counts(ids)) for name, ids, _ in admitted] == [
        ("warm", {GPUS[1]: 30}),
        ("main", {GPUS[1]: 50}),
    ]


def test_the_issues_reproduction_is_refused_by_the_filter_not_split() -> None:
    """Two pods of 60, then one of 70, on two GPUs: the third has 80 free units in
    total but no GPU with 70, so the extender's filter (place_pod) refuses the node."""
    free = dict.fromkeys(GPUS, U)
    for name in ("a", "b"):
        placement = place_pod(
            [ContainerRequest("main", "app", 60)],
            [GpuState(g, free[g]) for g in GPUS],
            units_per_gpu=U,
            policy="binpack",
        )
        assert placement.fits, name
        for g, taken in placement.taken.items():
            free[g] -= taken
    third = place_pod(
        [ContainerRequest("main", "app", 70)],
        [GpuState(g, free[g]) for g in GPUS],
        units_per_gpu=U,
        policy="binpack",
    )
    assert not third.fits
    assert third.refusal == "no single GPU has 70 free units (largest 40; 80 free in total)"


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        pytest.param({"allow_split_fraction": False}, True, id="allow-false-refuses"),
        pytest.param({"placement": {"extender": True}}, True, id="extender-refuses"),
        pytest.param({}, False, id="default-without-extender-splits-as-before"),
    ],
)
async def test_the_issues_reproduction_without_the_extender_at_the_plugin(
    short_tmp_path: Path, config: dict[str, Any], refused: bool
) -> None:
    """Without the extender the default scheduler sends the 70 anyway: the plugin's
    Allocate refuses the split (over real gRPC) unless splits are allowed."""
    async with kubelet_and_plugin(short_tmp_path, gpu_count=2, config=config) as (kubelet, _):
        await kubelet.wait_registered(R)
        for name in ("a", "b"):
            ((_, ids, _),) = await kubelet.admit_pod(R, [("main", "app", 60)])
            assert len(counts(ids)) == 1, name
        if refused:
            with pytest.raises(KubeletSimError) as info:
                await kubelet.admit_pod(R, [("main", "app", 70)])
            message = str(info.value)
            assert "refusing to split a fraction" in message
            assert f"40 on GPU {GPUS[0]}" in message
            assert f"30 on GPU {GPUS[1]}" in message
            assert len(kubelet.plugins[R].allocated) == 120  # the refused pod holds nothing
        else:
            ((_, ids, _response),) = await kubelet.admit_pod(R, [("main", "app", 70)])
            assert sorted(counts(ids).values()) == [30, 40]  # today's behaviour, logged
