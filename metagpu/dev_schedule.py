"""``schedule 0.7`` at the ``metagpu dev`` prompt: the scheduler extender's decision (pure).

The embedded default has one simulated node. Its GPU ledger is built from what
the simulated kubelet holds (the plugin's meta-devices, allocated or free,
healthy or not), exactly the shape the node agent publishes
(:class:`plugin.api.scheduling.NodeLedger`), and the decision is the
extender's own core (:class:`plugin.extender.service.ExtenderCore`): filter,
then bind's GPU choice, or the refusal a user would see in ``kubectl describe
pod``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from plugin.api.config import AllocationPolicy
from plugin.api.scheduling import GpuHolder, GpuLedgerEntry, NodeLedger
from plugin.extender.protocol import parse_args
from plugin.extender.service import ExtenderCore

DEV_NODE: Final = "metagpu-dev"


@dataclass(frozen=True)
class GpuRow:
    """One simulated GPU as the kubelet sees it."""

    device_id: str
    """The GPU part of its meta-device IDs (UUID or index, per device_id_strategy)."""
    index: int
    units: int
    allocated: Mapping[int, int]
    """Allocation number → units it holds here."""
    healthy: bool
    numa: int | None = None


@dataclass(frozen=True)
class Decision:
    free: tuple[tuple[int, str, int, bool], ...]
    """(index, device id, free units, healthy) per GPU, as the extender sees them."""
    gpus: Mapping[str, int] | None
    """Device id → units the container gets; None when refused."""
    refusal: str | None


def node_ledger(rows: Sequence[GpuRow], *, resource: str, units_per_gpu: int) -> NodeLedger:
    """The ledger the node agent would publish for these GPUs."""
    return NodeLedger(
        resource=resource,
        units_per_gpu=units_per_gpu,
        gpus=tuple(
            GpuLedgerEntry(
                uuid=row.device_id,
                index=row.index,
                units=row.units,
                healthy=row.healthy,
                numa=row.numa,
                reason="" if row.healthy else "unhealthy meta-devices",
                holders=tuple(
                    GpuHolder(
                        pod_uid=f"dev-allocation-{number}",
                        namespace="dev",
                        pod=f"allocation-{number}",
                        container="main",
                        units=units,
                    )
                    for number, units in sorted(row.allocated.items())
                    if units
                ),
            )
            for row in rows
        ),
    )


def decide(
    rows: Sequence[GpuRow],
    units: int,
    *,
    resource: str,
    units_per_gpu: int,
    policy: AllocationPolicy,
    request_number: int,
) -> Decision:
    """Filter the one node for a one-container pod of ``units``, then bind's choice."""
    core = ExtenderCore(resource=resource, default_policy=policy)
    ledger = node_ledger(rows, resource=resource, units_per_gpu=units_per_gpu)
    core.ledger.set_node(DEV_NODE, ledger.model_dump_json())
    uid = f"dev-request-{request_number}"
    pod: dict[str, Any] = {
        "metadata": {"name": f"schedule-{request_number}", "namespace": "dev", "uid": uid},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {resource: str(units)}}},
            ]
        },
    }
    view = core.ledger.view(DEV_NODE)
    free = tuple(
        (row.index, g.id, g.free, g.healthy)
        for row, g in zip(rows, view.gpus if not isinstance(view, str) else (), strict=False)
    )
    result = core.filter(parse_args({"Pod": pod, "NodeNames": [DEV_NODE]}))
    if result["Error"]:
        return Decision(free, None, result["Error"])
    failed = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    if DEV_NODE in failed:
        return Decision(free, None, failed[DEV_NODE])
    bound = core.decide_bind(
        core.ask_of(pod), node=DEV_NODE, pod_uid=uid, namespace="dev", pod="p", now=0.0
    )
    if isinstance(bound, str):
        return Decision(free, None, bound)
    return Decision(free, dict(bound.assignment.containers[0].gpus), None)
