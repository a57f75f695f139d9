"""Builders for extender tests: node ledgers, pods, and the pod shapes the scheduler sends."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plugin.api.scheduling import ANNOTATION_GPU_LEDGER, GpuHolder, GpuLedgerEntry, NodeLedger
from tests.conftest import REPO_ROOT

RESOURCE = "cnvrg.io/metagpu"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "scheduler-extender"


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def fixture_path(name: str) -> Path:
    return FIXTURES / name


def ledger(
    used: Sequence[int],
    *,
    units: int = 100,
    unhealthy: Sequence[int] = (),
    numa: Sequence[int | None] | None = None,
    node: str = "n",
    holder_uids: Sequence[str] | None = None,
) -> NodeLedger:
    """A node whose GPU ``i`` has ``used[i]`` units held (one holder each)."""
    gpus = []
    for i, n in enumerate(used):
        uid = holder_uids[i] if holder_uids is not None else f"{node}-holder-{i}"
        holders = (
            (GpuHolder(pod_uid=uid, namespace="ns", pod=f"h{i}", container="c", units=n),)
            if n
            else ()
        )
        gpus.append(
            GpuLedgerEntry(
                uuid=f"GPU-{node}-{i}",
                index=i,
                units=units,
                healthy=i not in unhealthy,
                reason="XID 79" if i in unhealthy else "",
                numa=numa[i] if numa is not None else None,
                holders=holders,
            )
        )
    return NodeLedger(resource=RESOURCE, units_per_gpu=units, gpus=tuple(gpus))


def pod(
    *app: int,
    init: Sequence[int] = (),
    sidecars: Sequence[int] = (),
    name: str = "p",
    namespace: str = "ns",
    uid: str = "uid-p",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod with app containers of ``app`` units (init containers and sidecars first)."""

    def container(cname: str, units: int, **more: Any) -> dict[str, Any]:
        res = {"limits": {RESOURCE: str(units)}, "requests": {RESOURCE: str(units)}}
        return {"name": cname, "image": "busybox", "resources": res if units else {}, **more}

    init_containers = [
        container(f"side{i}", u, restartPolicy="Always") for i, u in enumerate(sidecars)
    ]
    init_containers += [container(f"init{i}", u) for i, u in enumerate(init)]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {
        "schedulerName": "metagpu-scheduler",
        "containers": [container(f"c{i}", u) for i, u in enumerate(app)],
    }
    if init_containers:
        spec["initContainers"] = init_containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def node_object(name: str, node_ledger: NodeLedger | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if node_ledger is not None:
        meta["annotations"] = {ANNOTATION_GPU_LEDGER: node_ledger.model_dump_json()}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}
