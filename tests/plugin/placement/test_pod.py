"""place_pod: a pod's containers on a node's GPUs, replayed the kubelet's way (KUBELET-FACTS)."""

from __future__ import annotations

import pytest

from plugin.placement.pod import ContainerRequest, GpuState, place_pod, pod_units


def gpus(*free: int, unhealthy: tuple[int, ...] = ()) -> list[GpuState]:
    return [GpuState(f"GPU-{i}", n, healthy=i not in unhealthy) for i, n in enumerate(free)]


def app(units: int, name: str = "main") -> ContainerRequest:
    return ContainerRequest(name, "app", units)


def test_a_fraction_goes_to_the_tightest_gpu_that_holds_it() -> None:
    placed = place_pod([app(30)], gpus(100, 40, 70), units_per_gpu=100, policy="binpack")
    assert placed.fits
    assert placed.containers[0].gpus == {"GPU-1": 30}
    assert placed.taken == {"GPU-1": 30}


def test_the_issue_example_is_refused_with_the_reason() -> None:
    """Two GPUs with 40 free each: 70 units fit in total but on no single GPU."""
    placed = place_pod([app(70)], gpus(40, 40), units_per_gpu=100, policy="binpack")
    assert not placed.fits
    assert placed.refusal == "no single GPU has 70 free units (largest 40; 80 free in total)"


def test_unhealthy_gpus_offer_nothing() -> None:
    placed = place_pod([app(50)], gpus(100, 20, unhealthy=(0,)), units_per_gpu=100, policy="spread")
    assert (
        placed.refusal
        == 'container "main" needs 50 units, 20 free on healthy GPUs; 1 GPU unhealthy'
    )


def test_whole_gpus_need_completely_free_gpus() -> None:
    placed = place_pod([app(150)], gpus(90, 90, 100), units_per_gpu=100, policy="binpack")
    assert placed.fits
    assert placed.containers[0].gpus == {"GPU-0": 50, "GPU-2": 100}
    refused = place_pod([app(200)], gpus(90, 90, 100), units_per_gpu=100, policy="binpack")
    assert refused.refusal is not None
    assert "needs 2 completely free GPUs and 1 is" in refused.refusal


def test_an_init_containers_units_are_reused_by_the_next_container() -> None:
    """Init 30 on GPU-1, then main 50: main takes the 30 and 20 more on the same GPU."""
    pod = [ContainerRequest("warmup", "init", 30), app(50)]
    placed = place_pod(pod, gpus(100, 60), units_per_gpu=100, policy="binpack")
    assert placed.fits
    assert [c.gpus for c in placed.containers] == [{"GPU-1": 30}, {"GPU-1": 50}]
    assert placed.taken == {"GPU-1": 50}
    assert pod_units(pod) == 50


def test_an_init_share_moves_to_where_the_next_containers_whole_share_fits() -> None:
    """Issue 27, seen on a real cluster: GPU 0 at 60 used, GPU 1 empty; init 30, app 50.

    Binpack alone puts the 30 on GPU 0 (the tightest), where the app container, which
    the kubelet hands those 30, has no room for its 20 more. The whole-pod plan puts
    the init container's 30 on GPU 1, and the app's 50 there with them."""
    pod = [ContainerRequest("warmup", "init", 30), app(50)]
    placed = place_pod(pod, gpus(40, 100), units_per_gpu=100, policy="binpack")
    assert placed.fits
    assert [c.gpus for c in placed.containers] == [{"GPU-1": 30}, {"GPU-1": 50}]
    assert placed.taken == {"GPU-1": 50}


def test_the_policys_own_plan_is_kept_when_it_fits() -> None:
    """Init 30 and app 50 fit on the tightest GPU with 60 free: binpack's choice stands."""
    pod = [ContainerRequest("warmup", "init", 30), app(50)]
    placed = place_pod(pod, gpus(100, 60), units_per_gpu=100, policy="binpack")
    assert [c.gpus for c in placed.containers] == [{"GPU-1": 30}, {"GPU-1": 50}]


def test_reuse_with_no_gpu_for_the_whole_share_is_refused_with_the_replays_reason() -> None:
    """No GPU holds 50: whatever GPU the init's 30 go to, the app cannot stay there."""
    pod = [ContainerRequest("warmup", "init", 30), app(50)]
    placed = place_pod(pod, gpus(45, 35), units_per_gpu=100, policy="binpack")
    assert placed.refusal == (
        'container "main": the GPU holding its 30 reused units has no room for 20 more '
        "(largest free 45; 50 free in total)"
    )


def test_a_sidecar_keeps_its_units_and_the_app_takes_its_own() -> None:
    pod = [ContainerRequest("log", "sidecar", 20), app(50)]
    placed = place_pod(pod, gpus(100, 100), units_per_gpu=100, policy="binpack")
    assert placed.fits
    assert sum(placed.taken.values()) == 70
    assert pod_units(pod) == 70


def test_reused_units_over_several_gpus_taken_in_part_are_refused() -> None:
    pod = [ContainerRequest("warmup", "init", 150), app(50)]
    placed = place_pod(pod, gpus(100, 100), units_per_gpu=100, policy="binpack")
    assert placed.refusal is not None
    assert "in no fixed order" in placed.refusal


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ([app(30), app(20, "b")], 50),
        ([ContainerRequest("i", "init", 80), app(30)], 80),
        ([ContainerRequest("s", "sidecar", 10), ContainerRequest("i", "init", 80), app(30)], 90),
        ([ContainerRequest("i", "init", 80), ContainerRequest("s", "sidecar", 10), app(30)], 80),
    ],
)
def test_pod_units_counts_like_the_scheduler(pod: list[ContainerRequest], expected: int) -> None:
    assert pod_units(pod) == expected
