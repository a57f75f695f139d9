"""The node's GPU ledger: who holds what on each GPU, for the scheduler extender (pure).

Built from one cycle's :class:`~plugin.agent.accounting.Snapshot`: every GPU
that backs the ledger's resource, with its capacity (``units_per_gpu``), its
health and the containers the kubelet allocated units of it to (PodResources,
the source of truth). The adapter (:class:`plugin.agent.kube.LedgerPublisher`)
writes it to the Node annotation ``metagpu.io/gpu-ledger``
(:class:`plugin.api.scheduling.NodeLedger`) only when :func:`ledger_key` changed.

GPU IDs are the IDs the device plugin advertises (``device_id_strategy``: the
UUID, or the NVML index), because the extender's assignments name GPUs that
way and the plugin matches them against its meta-device IDs.

Size is bounded (:func:`encode_ledger`): a holder costs about 150 bytes, and a
node of 16 GPUs × 1000 units could in theory hold 16,000 of them, far over an
object's 256 KiB annotation budget. Past ``max_bytes`` the holders of each GPU
are merged per pod, and past that into one aggregate holder per GPU: the units
used per GPU (what placement needs) stay exact, only who holds them is lost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Final

from plugin.agent.accounting import GpuView, Snapshot
from plugin.api.config import DeviceIdStrategy
from plugin.api.scheduling import (
    ANNOTATION_GPU_LEDGER,
    ANNOTATION_LEDGER_REFRESH,
    GpuHolder,
    GpuLedgerEntry,
    NodeLedger,
)

OWNED_ANNOTATIONS: Final = (ANNOTATION_GPU_LEDGER, ANNOTATION_LEDGER_REFRESH)
"""Node annotations the agent writes (:class:`plugin.agent.kube.LedgerPublisher`); with
:data:`plugin.agent.labels.OWNED_LABELS`, what ``metagpu cleanup`` removes at uninstall."""

DEFAULT_LEDGER_MAX_BYTES: Final = 64 * 1024
"""A quarter of the 256 KiB the API server allows for all of an object's annotations."""

AGGREGATE_POD_UID: Final = "metagpu.io/aggregated"
"""The ``pod_uid`` of the single holder a GPU's holders collapse into past the size
bound. Never a real UID (those are UUIDs, with no ``/``)."""

PodUidLookup = Callable[[str, str], str | None]
"""``(namespace, pod) -> uid`` from the agent's pod watch, or None when unknown."""


def gpu_health(gpu: GpuView) -> tuple[bool, str]:
    """Whether the extender may place units on ``gpu``, and why not.

    The one place the ledger decides health. ``GpuView.healthy`` and
    ``problem`` follow the device plugin's health board (XID/ECC events, lost
    GPUs, recovery checks), which the plugin publishes and the agent reads each
    cycle (:mod:`plugin.gpu.health_file`); before any board exists they are the
    agent's own notion (discovered and read this cycle). So the extender never
    offers a GPU the plugin has withdrawn.
    """
    if gpu.claim is not None:
        # Another device plugin hands this GPU out: never offer it (issue 20),
        # even before the plugin's board says so.
        return False, gpu.claim.reason()
    if gpu.healthy:
        return True, ""
    return False, gpu.problem or "the GPU could not be read"


def build_ledger(
    snapshot: Snapshot,
    *,
    resource: str,
    id_strategy: DeviceIdStrategy,
    pod_uid: PodUidLookup,
    observed_at: str = "",
) -> NodeLedger:
    """The ledger of ``resource``'s GPUs in ``snapshot``, in NVML order.

    A holder's ``pod_uid`` comes from the pod watch; a pod the watch has not
    seen yet gets ``<namespace>/<pod>`` (never a valid UID, so a reader can
    tell), rather than being left out: its units are really taken.
    """
    holders: dict[str, list[GpuHolder]] = defaultdict(list)
    for share in snapshot.shares:
        if share.resource != resource or share.units <= 0:
            continue
        key = share.key
        uid = share.pod_uid or pod_uid(key.namespace, key.pod) or f"{key.namespace}/{key.pod}"
        holders[share.gpu_uuid].append(
            GpuHolder(
                pod_uid=uid,
                namespace=key.namespace,
                pod=key.pod,
                container=key.container,
                units=share.units,
            )
        )
    entries: list[GpuLedgerEntry] = []
    for gpu in sorted(snapshot.gpus, key=lambda g: g.index):
        if gpu.resource != resource or gpu.units_total <= 0:
            continue
        healthy, reason = gpu_health(gpu)
        entries.append(
            GpuLedgerEntry(
                uuid=gpu.uuid if id_strategy == "uuid" else str(gpu.index),
                index=gpu.index,
                numa=gpu.numa_node,
                units=gpu.units_total,
                healthy=healthy,
                reason=reason,
                holders=tuple(
                    sorted(
                        holders.get(gpu.uuid, ()), key=lambda h: (h.namespace, h.pod, h.container)
                    )
                ),
            )
        )
    return NodeLedger(
        resource=resource,
        units_per_gpu=snapshot.units_per_gpu,
        gpus=tuple(entries),
        observed_at=observed_at,
        enforces=snapshot.enforces if entries else (),
    )


def ledger_key(ledger: NodeLedger) -> Any:
    """What must change for the ledger to be written again: everything but the time."""
    return ledger.model_dump(exclude={"observed_at"})


def encode_ledger(ledger: NodeLedger, *, max_bytes: int = DEFAULT_LEDGER_MAX_BYTES) -> str:
    """Compact JSON of ``ledger`` in at most ``max_bytes`` (see the module docstring).

    Raises ValueError when even one aggregate holder per GPU does not fit, which
    takes a ``max_bytes`` below a few hundred bytes per GPU.
    """
    # ``enforces`` only where a node enforces something: an extender of an earlier
    # release refuses fields it does not know, and would lose every node otherwise.
    exclude = None if ledger.enforces else {"enforces"}
    for compact in (_as_is, _per_pod, _aggregate):
        text = compact(ledger).model_dump_json(exclude=exclude)
        if len(text.encode()) <= max_bytes:
            return text
    raise ValueError(
        f"the GPU ledger of {len(ledger.gpus)} GPUs needs more than ledger_max_bytes="
        f"{max_bytes} even with one holder per GPU; raise agent.ledger_max_bytes"
    )


def _as_is(ledger: NodeLedger) -> NodeLedger:
    return ledger


def _per_pod(ledger: NodeLedger) -> NodeLedger:
    """One holder per pod and GPU (containers joined with ``+``)."""
    gpus = []
    for gpu in ledger.gpus:
        merged: dict[str, GpuHolder] = {}
        for h in gpu.holders:
            seen = merged.get(h.pod_uid)
            merged[h.pod_uid] = (
                h
                if seen is None
                else seen.model_copy(
                    update={
                        "container": f"{seen.container}+{h.container}",
                        "units": seen.units + h.units,
                    }
                )
            )
        gpus.append(gpu.model_copy(update={"holders": tuple(merged.values())}))
    return ledger.model_copy(update={"gpus": tuple(gpus)})


def _aggregate(ledger: NodeLedger) -> NodeLedger:
    """One holder per GPU carrying all its used units."""
    gpus = [
        gpu.model_copy(
            update={
                "holders": (
                    GpuHolder(
                        pod_uid=AGGREGATE_POD_UID,
                        namespace="",
                        pod="",
                        container="",
                        units=gpu.used,
                    ),
                )
                if gpu.used
                else ()
            }
        )
        for gpu in ledger.gpus
    ]
    return ledger.model_copy(update={"gpus": tuple(gpus)})
