"""Meta-devices: what one advertised resource is made of (pure; no gRPC, no NVML).

After NVIDIA's ``internal/rm/devices.go``: the plugin advertises
``units_per_gpu`` meta-devices per physical GPU, each named
``<gpu-id>::<unit>`` (:func:`plugin.api.resources.format_replica_id`). The
name carries the GPU, so ``Allocate`` can map any set of meta-devices back to
GPUs without remembering what it handed out before: everything the plugin
needs is in the IDs and the :class:`DeviceTable` built at start-up.

Which GPUs back which resource comes from ``resources[].gpus`` in the config
(:func:`select_gpus`). MIG-enabled GPUs are skipped with a warning: their
compute and memory are already partitioned by the hardware, so a share of
"the whole GPU" would promise resources that belong to MIG instances.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from plugin.api.config import DeviceIdStrategy, ResourceConfig, selector_key
from plugin.api.gpus import GpuInfo
from plugin.api.resources import (
    DeviceId,
    ReplicaId,
    ResourceName,
    format_replica_id,
)
from plugin.placement.row_index import RowIndex

DEVICE_ORDER: Final = attrgetter("gpu.position", "unit")
"""Sort key for meta-devices: by GPU (NVML order), then unit; the order of
``DeviceTable.devices`` and of every list handed to a container."""

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
"""The two values of ``Device.health`` the kubelet understands (``constants.go``)."""


class DeviceError(Exception):
    """Root of the device domain's errors; the servicer maps them to gRPC codes."""


class UnknownDeviceError(DeviceError):
    """A meta-device ID this plugin does not advertise (NVIDIA: ``unknown device: X``)."""

    def __init__(self, device_id: str, *, resource: str) -> None:
        super().__init__(f"unknown device: {device_id} (not a {resource} meta-device on this node)")
        self.device_id = device_id


class GpuSelectionError(DeviceError):
    """The config selects one GPU twice: for two resources, or twice in one (e.g. by
    index and by UUID). A config problem, so retrying cannot fix it."""


@dataclass(frozen=True)
class Gpu:
    """A physical GPU as one resource exposes it."""

    device_id: DeviceId
    """What the container runtime is told (``NVIDIA_VISIBLE_DEVICES``): UUID or index."""
    position: int
    """Order within the resource (NVML index order); ``NVIDIA_VISIBLE_DEVICES``
    lists GPUs in this order so the same allocation always gives the same string."""
    info: GpuInfo

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def numa_node(self) -> int | None:
        return self.info.numa_node

    @property
    def memory_mib(self) -> int:
        return self.info.memory_mib


@dataclass(frozen=True)
class MetaDevice:
    """One advertised unit of one GPU."""

    id: ReplicaId
    gpu: Gpu
    unit: int


def gpu_device_id(info: GpuInfo, strategy: DeviceIdStrategy) -> DeviceId:
    """Name a GPU for the container runtime per ``device_id_strategy``."""
    return DeviceId(info.uuid if strategy == "uuid" else str(info.index))


@dataclass(frozen=True)
class ResourceSelection:
    """The GPUs one resource will advertise."""

    config: ResourceConfig
    gpus: tuple[GpuInfo, ...]

    @property
    def name(self) -> ResourceName:
        return ResourceName(self.config.name)


@dataclass(frozen=True)
class Selection:
    """Result of matching discovered GPUs against ``resources[].gpus``."""

    resources: tuple[ResourceSelection, ...]
    warnings: tuple[str, ...]
    """Things an operator should see (skipped MIG GPUs, selectors matching no GPU);
    the caller logs them. Data rather than log calls so tests can assert them."""


def select_gpus(gpus: Sequence[GpuInfo], resources: Sequence[ResourceConfig]) -> Selection:
    """Assign discovered GPUs to resources.

    A selector is a GPU index (an int, or a string of digits because env vars
    are strings) or a UUID (case-insensitive), see
    :func:`~plugin.api.config.selector_key`. Selectors that match nothing are
    warnings, not errors: one config serves every node of the DaemonSet.
    Raises :class:`GpuSelectionError` when one GPU would back two resources, or
    is selected twice by one (by index and by UUID: only discovery can tell).
    """
    warnings: list[str] = []
    usable: list[GpuInfo] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.mig_enabled:
            warnings.append(
                f"GPU {gpu.index} ({gpu.uuid}, {gpu.name}) has MIG mode enabled and is not "
                "advertised: a MIG GPU is already partitioned by the hardware and cannot be "
                "shared as a whole; disable MIG on it or expose its instances with NVIDIA's "
                "device plugin"
            )
            continue
        usable.append(gpu)
    by_index = {g.index: g for g in usable}
    by_uuid = {g.uuid.lower(): g for g in usable}
    mig_by_index = {g.index: g for g in gpus if g.mig_enabled}
    mig_by_uuid = {g.uuid.lower(): g for g in gpus if g.mig_enabled}
    owner: dict[str, str] = {}
    selected: list[ResourceSelection] = []
    for resource in resources:
        chosen: list[GpuInfo] = []
        if resource.gpus == "all":
            chosen = list(usable)
        else:
            picked_by: dict[str, int | str] = {}
            for item in resource.gpus:
                match = _match(item, by_index=by_index, by_uuid=by_uuid)
                if match is None:
                    if _match(item, by_index=mig_by_index, by_uuid=mig_by_uuid) is None:
                        warnings.append(
                            f"resource {resource.name}: no GPU {item!r} on this node; skipped"
                        )
                    continue
                if match.uuid in picked_by:
                    raise GpuSelectionError(
                        f"resource {resource.name} selects GPU {match.index} ({match.uuid}) "
                        f"twice, as {picked_by[match.uuid]!r} and as {item!r}; list each GPU once"
                    )
                picked_by[match.uuid] = item
                chosen.append(match)
        for gpu in chosen:
            first = owner.setdefault(gpu.uuid, resource.name)
            if first != resource.name:
                raise GpuSelectionError(
                    f"GPU {gpu.index} ({gpu.uuid}) is selected by both {first} and "
                    f"{resource.name}; a GPU may back at most one resource"
                )
        chosen.sort(key=lambda g: g.index)
        selected.append(ResourceSelection(config=resource, gpus=tuple(chosen)))
    return Selection(resources=tuple(selected), warnings=tuple(warnings))


def _match(
    item: int | str, *, by_index: Mapping[int, GpuInfo], by_uuid: Mapping[str, GpuInfo]
) -> GpuInfo | None:
    key = selector_key(item)
    return by_index.get(key) if isinstance(key, int) else by_uuid.get(key)


class DeviceTable:
    """Every meta-device of one resource, indexed for O(1) lookups.

    Built once per start from the selected GPUs; immutable afterwards. With
    16 GPUs × 1000 units that is 16,000 entries, a few MiB, built in tens of
    milliseconds, which buys dictionary lookups on every gRPC call.
    """

    def __init__(
        self,
        resource: ResourceName,
        gpus: Sequence[GpuInfo],
        *,
        units_per_gpu: int,
        id_strategy: DeviceIdStrategy,
    ) -> None:
        if units_per_gpu < 1:
            raise ValueError(f"units_per_gpu must be >= 1: {units_per_gpu}")
        self.resource = resource
        self.units_per_gpu = units_per_gpu
        self.id_strategy: DeviceIdStrategy = id_strategy
        ordered = sorted(gpus, key=lambda g: g.index)
        self.gpus: tuple[Gpu, ...] = tuple(
            Gpu(device_id=gpu_device_id(info, id_strategy), position=pos, info=info)
            for pos, info in enumerate(ordered)
        )
        ids = [g.device_id for g in self.gpus]
        if len(set(ids)) != len(ids):
            raise GpuSelectionError(f"two GPUs share a device ID under {id_strategy}: {ids}")
        self._uuids = frozenset(g.uuid for g in self.gpus)
        self.devices: tuple[MetaDevice, ...] = tuple(
            MetaDevice(id=format_replica_id(g.device_id, unit), gpu=g, unit=unit)
            for g in self.gpus
            for unit in range(units_per_gpu)
        )
        self.by_id: Mapping[str, MetaDevice] = {d.id: d for d in self.devices}
        """Meta-device ID → device: every ``Allocate`` call checks its IDs here, exactly."""
        self.rows = RowIndex([d.id for d in self.devices])
        """Meta-device IDs → rows of ``devices`` (``position × units_per_gpu + unit``)
        in bulk: the allocator maps a whole request with one call."""
        self.ids_by_gpu: tuple[tuple[ReplicaId, ...], ...] = tuple(
            tuple(d.id for d in self.devices[pos * units_per_gpu : (pos + 1) * units_per_gpu])
            for pos in range(len(self.gpus))
        )
        """Per GPU position, its meta-device IDs in unit order."""

    def __len__(self) -> int:
        return len(self.devices)

    def lookup_all(self, device_ids: Iterable[str]) -> list[MetaDevice]:
        """Every named meta-device, duplicates dropped, in the order given.

        Fails on the first unknown ID, naming it, so nothing is half-applied."""
        found: dict[str, MetaDevice] = {}
        by_id = self.by_id
        for device_id in device_ids:
            device = by_id.get(device_id)
            if device is None:
                raise UnknownDeviceError(device_id, resource=self.resource)
            found[device_id] = device
        return list(found.values())

    @property
    def uuids(self) -> frozenset[str]:
        """The UUIDs of the GPUs backing this resource."""
        return self._uuids
