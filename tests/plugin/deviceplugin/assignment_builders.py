"""Pods bound to a node with the scheduler extender's assignment, as the API server returns them."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS, ContainerAssignment, PodAssignment


def assigned_pod(
    name: str,
    containers: Sequence[tuple[str, str, int, dict[str, int]]],
    *,
    created: str = "2026-11-25T10:00:00Z",
    node: str = "node-a",
    namespace: str = "ml",
    phase: str = "Pending",
    admitted: bool = False,
) -> dict[str, Any]:
    """``containers``: ``(name, kind, units, {gpu id: units})`` in allocation order."""
    assignment = PodAssignment(
        node=node,
        containers=tuple(
            ContainerAssignment(container=c, kind=kind, units=units, gpus=gpus)  # type: ignore[arg-type]
            for c, kind, units, gpus in containers
        ),
    )
    uid = hashlib.md5(f"{namespace}/{name}".encode()).hexdigest()
    status: dict[str, Any] = {"phase": phase}
    if admitted:
        status["containerStatuses"] = [
            {"name": c, "state": {"waiting": {"reason": "ContainerCreating"}}}
            for c, kind, _, _ in containers
            if kind == "app"
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"{uid[:8]}-{uid[8:12]}-{uid[12:16]}-{uid[16:20]}-{uid[20:]}",
            "creationTimestamp": created,
            "annotations": {ANNOTATION_ASSIGNED_GPUS: assignment.model_dump_json()},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": c, "image": "x"} for c, kind, _, _ in containers if kind == "app"
            ],
        },
        "status": status,
    }
