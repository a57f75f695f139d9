"""Which of our GPUs another resource also hands out: one owner per physical GPU (pure).

The kubelet counts every extended resource on its own: ``nvidia.com/gpu: 4``
and ``cnvrg.io/metagpu: 400`` are unrelated numbers to it, so a node where
NVIDIA's device plugin and metagpu both serve a GPU can give one pod the whole
GPU and another pod half of it. Only the kubelet's PodResources API
(``GetAllocatableResources``, ``List``) shows both at once; this module reads
its answer, in upstream shapes, and says which physical GPUs another resource
advertises or has allocated.

How other plugins name a GPU (looked up in NVIDIA's k8s-device-plugin,
``internal/rm/devices.go`` and ``device_map.go``):

* ``--device-id-strategy=uuid`` (its default): the GPU UUID ``GPU-<uuid>``;
  a MIG device's UUID, ``MIG-<uuid>`` (driver R470 and later) or
  ``MIG-GPU-<gpu uuid>/<gi>/<ci>`` (older drivers);
* ``--device-id-strategy=index``: the GPU's index ``0``, ``1``; a MIG device
  ``<gpu index>:<mig index>`` (NVIDIA's ``IsMigDevice`` tests for the ``:``);
* time-slicing and MPS replicas: any of the above plus ``::<replica>``
  (``NewAnnotatedID``), whether the resource is renamed (``nvidia.com/gpu.shared``
  with ``renameByDefault``) or not;
* MIG resources under the ``mixed`` strategy: ``nvidia.com/mig-1g.10gb`` and
  the like, with MIG IDs as above.

A GPU UUID is a 128-bit random name, so an ID that *contains* one of our
GPUs' UUIDs is that GPU whatever plugin wrote it (which also covers
third-party sharing plugins that append their own suffixes). Bare indexes are
not unique across vendors (another plugin's device ``0`` is not our GPU 0), so
they are read only from resources in NVIDIA's domain, ``nvidia.com/…``: NVIDIA's
plugin prefixes every resource name it serves with it (``NewResourceName``).

There is no setting that turns this off: no plugin that does not know about
metagpu can share a GPU with it safely.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from plugin.api.gpus import GpuInfo
from plugin.api.resources import REPLICA_SEPARATOR

NVIDIA_DOMAIN: Final = "nvidia.com/"
"""Resources whose bare index IDs (``0``, ``0:1``) name NVIDIA GPUs on this node."""

DOCS_HINT: Final = "docs/install.md#one-owner-per-gpu"

Shape = Literal["gpu-uuid", "gpu-index", "mig-uuid", "mig-index", "replica"]
"""How the other resource named the GPU; ``replica``: a time-sliced or MPS
replica (``<id>::<n>``) of any of the others."""

_INDEX = re.compile(r"0|[1-9][0-9]{0,3}", re.ASCII)
_MIG_INDEX = re.compile(r"(0|[1-9][0-9]{0,3}):(0|[1-9][0-9]{0,3})", re.ASCII)


# ------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class ResourceDevices:
    """One ``ContainerDevices`` of ``GetAllocatableResources``: devices the kubelet
    knows for a resource, assigned or not (the kubelet sends one per device)."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class AssignedDevices:
    """One ``ContainerDevices`` of a container in ``List``: devices it holds."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


# ------------------------------------------------------------------ outputs
@dataclass(frozen=True)
class ForeignDevice:
    """A device of another resource that is (part of) one of our GPUs."""

    resource: str
    device_id: str
    shape: Shape


@dataclass(frozen=True)
class ForeignHolder:
    """A container that holds a device of another resource on one of our GPUs."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container} ({self.resource} {self.device_id})"


@dataclass(frozen=True)
class GpuClaim:
    """One of our GPUs that another resource advertises or has handed out."""

    uuid: str
    index: int
    advertised: tuple[ForeignDevice, ...] = ()
    holders: tuple[ForeignHolder, ...] = ()

    @property
    def resources(self) -> tuple[str, ...]:
        """The other resources, sorted."""
        names = {d.resource for d in self.advertised} | {h.resource for h in self.holders}
        return tuple(sorted(names))

    @property
    def held(self) -> bool:
        """A container holds part of this GPU through another resource now."""
        return bool(self.holders)

    def reason(self) -> str:
        """The Unhealthy reason: which resource, as what, and what to change."""
        parts: list[str] = []
        for resource in self.resources:
            ids = sorted(
                {d.device_id for d in self.advertised if d.resource == resource}
                | {h.device_id for h in self.holders if h.resource == resource}
            )
            shapes = sorted(
                {d.shape for d in self.advertised if d.resource == resource}
                | {_shape_of(h.device_id) for h in self.holders if h.resource == resource}
            )
            shown = ", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
            parts.append(f"{resource} ({', '.join(shapes)}: {shown})")
        held = f"; held now by {len(self.holders)} container(s)" if self.holders else ""
        return (
            f"GPU {self.index} ({self.uuid}) is also handed out by {'; '.join(parts)}{held}. "
            "metagpu never shares a GPU another device plugin serves: give this GPU to one "
            f"plugin only (see {DOCS_HINT})"
        )


@dataclass(frozen=True)
class Ownership:
    """Every claim another resource has on our GPUs, by GPU UUID."""

    claims: Mapping[str, GpuClaim] = field(default_factory=dict)

    def reasons(self) -> dict[str, str]:
        """GPU UUID → Unhealthy reason, for the health board."""
        return {uuid: claim.reason() for uuid, claim in self.claims.items()}

    def claim(self, uuid: str) -> GpuClaim | None:
        return self.claims.get(uuid)


NO_CLAIMS: Final = Ownership()


# ----------------------------------------------------------------- the core
def resolve_device(device_id: str, resource: str, gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """The physical GPU (of ``gpus``) that device ``device_id`` of ``resource`` is on,
    or None when it is none of them (or its name cannot tell)."""
    base, sep, replica = device_id.rpartition(REPLICA_SEPARATOR)
    if sep and base and replica.isascii() and replica.isdigit():
        device_id = base
    lowered = device_id.lower()
    for gpu in gpus:
        uuid = gpu.uuid.lower()
        if uuid.startswith("gpu-") and uuid in lowered:
            return gpu
        if any(mig.lower() == lowered for mig in gpu.mig_devices):
            return gpu
    if not resource.startswith(NVIDIA_DOMAIN):
        return None
    index: int | None = None
    if _INDEX.fullmatch(device_id):
        index = int(device_id)
    elif (m := _MIG_INDEX.fullmatch(device_id)) is not None:
        index = int(m.group(1))
    if index is None:
        return None
    return next((g for g in gpus if g.index == index), None)


def find_foreign_claims(
    gpus: Sequence[GpuInfo],
    allocatable: Iterable[ResourceDevices],
    assigned: Iterable[AssignedDevices],
    *,
    own_resources: Collection[str],
) -> Ownership:
    """Which of ``gpus`` resources other than ``own_resources`` advertise or hold.

    ``allocatable`` and ``assigned`` are the kubelet's ``GetAllocatableResources``
    and ``List`` answers; devices of ``own_resources`` (metagpu's own) are
    skipped, as are devices that are none of ``gpus``.
    """
    own = set(own_resources)
    advertised: dict[str, dict[tuple[str, str], ForeignDevice]] = defaultdict(dict)
    holders: dict[str, dict[tuple[str, ...], ForeignHolder]] = defaultdict(dict)
    by_uuid = {g.uuid: g for g in gpus}
    for entry in allocatable:
        if entry.resource_name in own:
            continue
        for device_id in entry.device_ids:
            gpu = resolve_device(device_id, entry.resource_name, gpus)
            if gpu is not None:
                advertised[gpu.uuid][(entry.resource_name, device_id)] = ForeignDevice(
                    entry.resource_name, device_id, _shape_of(device_id)
                )
    for held in assigned:
        if held.resource_name in own:
            continue
        for device_id in held.device_ids:
            gpu = resolve_device(device_id, held.resource_name, gpus)
            if gpu is not None:
                holder = ForeignHolder(
                    held.namespace, held.pod, held.container, held.resource_name, device_id
                )
                key = (held.namespace, held.pod, held.container, held.resource_name, device_id)
                holders[gpu.uuid][key] = holder
    claims: dict[str, GpuClaim] = {}
    for uuid in sorted(advertised.keys() | holders.keys(), key=lambda u: by_uuid[u].index):
        claims[uuid] = GpuClaim(
            uuid=uuid,
            index=by_uuid[uuid].index,
            advertised=tuple(sorted(advertised[uuid].values(), key=_device_order)),
            holders=tuple(sorted(holders[uuid].values(), key=_holder_order)),
        )
    return Ownership(claims)


def _shape_of(device_id: str) -> Shape:
    base, sep, replica = device_id.rpartition(REPLICA_SEPARATOR)
    if sep and base and replica.isdigit():
        return "replica"
    if device_id.upper().startswith("MIG-"):
        return "mig-uuid"
    if _MIG_INDEX.fullmatch(device_id):
        return "mig-index"
    if _INDEX.fullmatch(device_id):
        return "gpu-index"
    return "gpu-uuid"


def _device_order(d: ForeignDevice) -> tuple[str, str]:
    return d.resource, d.device_id


def _holder_order(h: ForeignHolder) -> tuple[str, ...]:
    return h.namespace, h.pod, h.container, h.resource, h.device_id
