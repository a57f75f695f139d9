"""Node label values and the patch that changes only what changed (pure)."""

from __future__ import annotations

import pytest

from plugin.agent.accounting import Allocation, build_snapshot
from plugin.agent.containers import PodIndex
from plugin.agent.labels import desired_labels, label_patch, label_value
from plugin.api.resources import (
    NODE_LABEL_ENFORCES,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_LARGEST_FREE_UNITS,
    NODE_LABEL_UNITS_PER_GPU,
)
from plugin.gpu.backend import GpuInfo
from plugin.gpu.mps import MpsNode, MpsStatus
from tests.agent.builders import gpu, gpu_uuid, key, reading

R = "cnvrg.io/metagpu"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", id="spaces"),
        pytest.param("Tesla T4", "Tesla-T4", id="short"),
        pytest.param("NVIDIA H100 80GB HBM3 (PCIe)", "NVIDIA-H100-80GB-HBM3-PCIe", id="parens"),
        pytest.param("x" * 80, "x" * 63, id="truncated"),
        pytest.param("  GPU  ", "GPU", id="trimmed"),
    ],
)
def test_label_value(text: str, expected: str) -> None:
    assert label_value(text) == expected


def labels_for(
    gpus: list[GpuInfo], allocations: list[Allocation], *, mps: MpsNode | None = None
) -> dict[str, str]:
    snap = build_snapshot(
        [reading(g) for g in gpus],
        allocations,
        {},
        directory=PodIndex(),
        units_per_gpu=100,
        gpu_resources={g.uuid: R for g in gpus if not g.mig_enabled},
        resources=[R],
        taken_at=0,
        mps=mps,
    )
    return desired_labels(snap)


def units(gpu_index: int, n: int, pod: str = "a") -> Allocation:
    return Allocation(key(pod), R, tuple(f"{gpu_uuid(gpu_index)}::{u}" for u in range(n)))


def test_largest_free_units_follows_allocations() -> None:
    gpus = [gpu(0), gpu(1)]
    assert labels_for(gpus, [])[NODE_LABEL_LARGEST_FREE_UNITS] == "100"
    assert labels_for(gpus, [units(0, 100)])[NODE_LABEL_LARGEST_FREE_UNITS] == "100"
    assert (
        labels_for(gpus, [units(0, 100), units(1, 30, "b")])[NODE_LABEL_LARGEST_FREE_UNITS] == "70"
    )
    assert (
        labels_for(gpus, [units(0, 60), units(1, 30, "b")])[NODE_LABEL_LARGEST_FREE_UNITS] == "70"
    )
    assert (
        labels_for(gpus, [units(0, 100), units(1, 100, "b")])[NODE_LABEL_LARGEST_FREE_UNITS] == "0"
    )


def test_homogeneous_node() -> None:
    assert labels_for([gpu(0), gpu(1)], []) == {
        NODE_LABEL_GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB",
        NODE_LABEL_GPU_COUNT: "2",
        NODE_LABEL_GPU_MEMORY_MIB: "81920",
        NODE_LABEL_UNITS_PER_GPU: "100",
        NODE_LABEL_LARGEST_FREE_UNITS: "100",
        NODE_LABEL_ENFORCES: "",
    }


@pytest.mark.parametrize(
    ("mps", "value"),
    [
        pytest.param(None, "", id="no-board-section-nothing"),
        pytest.param(MpsNode(mode="unsupervised"), "", id="someone-elses-daemon-advice-only"),
        pytest.param(
            MpsNode(mode="supervised", status=MpsStatus(state="up")),
            "memory.fixed",
            id="supervised",
        ),
        pytest.param(
            MpsNode(mode="supervised", status=MpsStatus(state="down", reason="gone")),
            "memory.fixed",
            id="supervised-down-admits-nobody",
        ),
    ],
)
def test_the_node_says_what_it_enforces(mps: MpsNode | None, value: str) -> None:
    """Issue 28: a valid label value (a comma is not), empty for nothing."""
    got = labels_for([gpu(0)], [], mps=mps)[NODE_LABEL_ENFORCES]
    assert got == value
    assert label_value(got) == got


def test_mixed_node_reports_smallest_memory() -> None:
    got = labels_for([gpu(0), gpu(1, name="Tesla T4", memory_mib=15360)], [])
    assert got[NODE_LABEL_GPU_PRODUCT] == "mixed"
    assert got[NODE_LABEL_GPU_MEMORY_MIB] == "15360"


def test_mig_gpus_do_not_count() -> None:
    got = labels_for([gpu(0, mig_enabled=True)], [])
    assert got[NODE_LABEL_GPU_COUNT] == "0"
    assert NODE_LABEL_GPU_PRODUCT not in got
    assert NODE_LABEL_GPU_MEMORY_MIB not in got


@pytest.mark.parametrize(
    ("current", "desired", "patch"),
    [
        pytest.param(
            {NODE_LABEL_GPU_COUNT: "2", "kubernetes.io/os": "linux"},
            {NODE_LABEL_GPU_COUNT: "2"},
            {},
            id="unchanged-no-patch",
        ),
        pytest.param(
            {NODE_LABEL_LARGEST_FREE_UNITS: "100"},
            {NODE_LABEL_LARGEST_FREE_UNITS: "70"},
            {NODE_LABEL_LARGEST_FREE_UNITS: "70"},
            id="changed-value",
        ),
        pytest.param(
            {NODE_LABEL_GPU_PRODUCT: "Tesla-T4", "team": "x"},
            {},
            {NODE_LABEL_GPU_PRODUCT: None},
            id="removes-own-stale-label-keeps-others",
        ),
    ],
)
def test_label_patch(
    current: dict[str, str], desired: dict[str, str], patch: dict[str, str | None]
) -> None:
    assert label_patch(current, desired) == patch
