"""The scheduling contract's wire shapes: what the agent, extender and plugin exchange."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from plugin.api.scheduling import (
    ContainerAssignment,
    GpuHolder,
    GpuLedgerEntry,
    NodeLedger,
    PodAssignment,
)


def test_ledger_round_trips_through_its_json() -> None:
    ledger = NodeLedger(
        resource="cnvrg.io/metagpu",
        units_per_gpu=100,
        gpus=(
            GpuLedgerEntry(
                uuid="GPU-a",
                index=0,
                units=100,
                holders=(
                    GpuHolder(pod_uid="u1", namespace="ns", pod="p", container="c", units=60),
                ),
            ),
            GpuLedgerEntry(uuid="GPU-b", index=1, units=100, healthy=False, reason="XID 79"),
        ),
        observed_at="2026-11-25T09:00:00Z",
    )
    text = ledger.model_dump_json()
    assert NodeLedger.model_validate_json(text) == ledger
    assert [g.used for g in ledger.gpus] == [60, 0]


def test_assignment_round_trips_through_its_json() -> None:
    assignment = PodAssignment(
        node="node-a",
        containers=(
            ContainerAssignment(container="warmup", kind="init", units=30, gpus={"GPU-a": 30}),
            ContainerAssignment(container="train", units=150, gpus={"GPU-a": 50, "GPU-b": 100}),
        ),
    )
    assert PodAssignment.model_validate_json(assignment.model_dump_json()) == assignment


@pytest.mark.parametrize(
    "text",
    [
        '{"version": "v2", "resource": "r", "units_per_gpu": 100}',
        '{"resource": "r", "units_per_gpu": 0}',
        '{"resource": "r", "units_per_gpu": 100, "surprise": 1}',
    ],
)
def test_a_ledger_from_another_version_or_with_typos_is_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        NodeLedger.model_validate_json(text)
