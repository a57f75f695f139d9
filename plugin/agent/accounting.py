"""Who holds which share of which GPU, and what they use: the agent's one join.

Pure. Inputs, each gathered by an adapter:

* GPU readings (:class:`GpuReading`) from the :class:`~plugin.gpu.backend.GpuBackend`;
* allocations (:class:`Allocation`) from the kubelet's PodResources API: which
  container holds which meta-devices ``<gpu>::<n>`` (device plugin), or which
  whole shares (:class:`ShareGrant`: a DRA claim's GPU, units and memory limit,
  read back from its CDI spec by :mod:`plugin.agent.dra_shares`);
* process owners: PID → container ID from ``/proc/<pid>/cgroup``;
* the pod index: container ID → namespace/pod/container;
* other resources' claims on the same physical GPUs
  (:class:`~plugin.placement.ownership.Ownership`, from the same PodResources
  answer): a GPU that another device plugin advertises or has handed out has no
  free units, and each of our shares on it is a :class:`Conflict`.

Output: a frozen :class:`Snapshot` that enforcement, metrics, node labels and
the mgctl API all read, so they can never disagree about the same cycle.

A container's memory limit on a GPU is ``units / units_per_gpu × GPU memory``
(floored to whole MiB): 25 units of 100 on an 80 GiB GPU allow 20 GiB; its SM
cap under ``fixed`` is its share in whole percent. Both are
:mod:`plugin.api.limits`, the one formula that also sets the container's
``METAGPU_MEMORY_LIMIT_MB`` and MPS limits, so the limits a container is told,
shown (mgctl, metrics) and held to never differ. Whether the node enforces
them is the plugin's word (its board's ``mps`` section, :attr:`Snapshot.mps`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from plugin.agent.cgroups import ContainerId
from plugin.agent.containers import ContainerDirectory, ContainerKey, ContainerRef
from plugin.api.limits import Enforced, Policy, thread_percentage
from plugin.api.limits import memory_limit_mib as memory_limit_mib  # noqa: PLC0414 - re-exported
from plugin.api.resources import COMPUTE_POLICIES, ReplicaIdError, parse_replica_id
from plugin.gpu.backend import GpuInfo, GpuProcess, GpuUsage
from plugin.gpu.health import GpuHealth
from plugin.gpu.mps import MpsNode
from plugin.placement.ownership import NO_CLAIMS, ForeignHolder, GpuClaim, Ownership

MIB: Final = 1024 * 1024

Source = Literal["gpus", "podresources", "pods"]


@dataclass(frozen=True)
class GpuReading:
    """One GPU as read this cycle. ``usage``/``processes`` are None when the read failed."""

    info: GpuInfo
    usage: GpuUsage | None
    processes: tuple[GpuProcess, ...] | None
    error: str | None = None
    """Why a read failed (the backend's message), for logs, metrics and mgctl."""


@dataclass(frozen=True)
class ShareGrant:
    """A share handed out whole, with its own limits: one DRA claim device of one GPU.

    A device-plugin share is N meta-devices and its memory limit follows from N
    (:func:`memory_limit_mib`); a DRA share comes with the memory the scheduler
    charged it (which may be asked for apart from units), so it carries its limit."""

    gpu_id: str
    """The GPU's UUID (``NVIDIA_VISIBLE_DEVICES`` of the share's CDI spec)."""
    share: str
    """The share's CDI device ID: one share, however many containers hold it (a
    claim may be shared by the containers of a pod), counts once into its GPU."""
    claim: str
    """``namespace/name`` of the ResourceClaim, for messages."""
    units: int
    memory_limit_mib: int
    compute_policy: str = ""
    """The policy the share's container was told (its spec's env); empty: unknown."""


@dataclass(frozen=True)
class UnresolvedShare:
    """A claim device of ours the agent cannot turn into a share, and why."""

    key: ContainerKey
    claim: str
    """``namespace/name`` of the ResourceClaim."""
    device: str
    """The CDI device ID, or ``pool/device`` when the kubelet listed no CDI device."""
    reason: str

    def describe(self) -> str:
        return f"{self.key}: claim {self.claim}, device {self.device}: {self.reason}"


@dataclass(frozen=True)
class Allocation:
    """One container's devices of one resource, as the kubelet reports them."""

    key: ContainerKey
    resource: str
    device_ids: tuple[str, ...]
    """Meta-device IDs, ``<gpu uuid or index>::<n>``."""
    grants: tuple[ShareGrant, ...] = ()
    """Whole shares with their limits (DRA claims of the agent's driver)."""
    unresolved: tuple[UnresolvedShare, ...] = ()
    """Claim devices of ours that are no share the agent can account for."""


@dataclass(frozen=True)
class ProcessView:
    """One GPU process and who owns it."""

    pid: int
    gpu_uuid: str
    gpu_index: int
    used_memory_mib: int
    utilization_percent: int | None
    container_id: ContainerId | None
    """None for a host process (no container cgroup)."""
    container: ContainerRef | None
    """None for host processes and for containers no pod on this node runs."""


@dataclass(frozen=True)
class ShareView:
    """One container's share of one GPU: what it was given and what it uses."""

    key: ContainerKey
    gpu_uuid: str
    gpu_index: int
    resource: str
    """The resource the units came from; empty for usage without an allocation."""
    units: int
    units_per_gpu: int
    memory_total_mib: int
    memory_limit_mib: int
    memory_used_mib: int
    utilization_percent: int | None
    pids: tuple[int, ...]
    container_id: ContainerId | None
    pod_uid: str
    compute_policy: str = ""
    """The pod's ``metagpu.io/compute-policy``; empty when unknown (no pod seen)."""

    @property
    def policy(self) -> Policy | None:
        """The compute policy if it is one of the three (None: unknown)."""
        for known in COMPUTE_POLICIES:
            if self.compute_policy == known:
                return known
        return None

    @property
    def thread_percentage(self) -> int | None:
        """The SM cap of this share (``fixed`` only; None: no cap or policy unknown)."""
        policy = self.policy
        if not self.allocated or policy is None:
            return None
        return thread_percentage(self.units, units_per_gpu=self.units_per_gpu, policy=policy)

    @property
    def percent(self) -> float:
        """The share as a percentage of the GPU (``units / units_per_gpu × 100``)."""
        return 100.0 * self.units / self.units_per_gpu

    @property
    def allocated(self) -> bool:
        """False for a container using a GPU it holds no units of (no limit applies)."""
        return self.units > 0

    @property
    def over_limit(self) -> bool:
        """Using more memory than the share allows (only shares with units have a limit)."""
        return self.allocated and self.memory_used_mib > self.memory_limit_mib


@dataclass(frozen=True)
class GpuView:
    """One GPU this cycle: capacity, allocation and use."""

    uuid: str
    index: int
    name: str
    memory_total_mib: int
    memory_used_mib: int | None
    utilization_percent: int | None
    healthy: bool
    problem: str | None
    """Why the GPU is unhealthy or its readings are missing."""
    resource: str | None
    """The resource it backs; None when no configured resource includes it."""
    units_total: int
    units_allocated: int
    unattributed_memory_mib: int
    """Memory of processes no pod container on this node owns (host processes,
    unknown containers), plus what the driver reports that no process holds."""
    processes_known: bool = True
    """False when this cycle's process list could not be read: its shares are
    incomplete, so enforcement leaves this GPU alone until it reads again."""
    health: GpuHealth | None = None
    """The device plugin's health record of this GPU (its published board), which
    ``healthy`` and ``problem`` follow; None when the plugin published none for it,
    and then ``healthy`` is the agent's own "described and read this cycle"."""
    liveness: tuple[int, int] | None = None
    """The plugin's liveness polls of this GPU since it started: (answered, failed)."""
    claim: GpuClaim | None = None
    """Another resource advertises or holds this GPU (another device plugin)."""
    numa_node: int | None = None
    """The GPU's NUMA node (None: unknown): the extender breaks ties by it, as the plugin does."""
    units_advertised: int | None = None
    """Units of this GPU the kubelet lists as allocatable for its metagpu resource
    (``GetAllocatableResources``): 0 while the device plugin is not registered (or
    withdrew the GPU); None when the agent does not read allocatable devices."""

    @property
    def units_free(self) -> int:
        """Units a new share could get here: :func:`free_units`."""
        return free_units(self.units_total, self.units_allocated, claim=self.claim)

    @property
    def contested(self) -> bool:
        """A GPU metagpu serves that another resource also hands out."""
        return self.claim is not None and self.resource is not None


def free_units(units_total: int, units_allocated: int, *, claim: GpuClaim | None) -> int:
    """Free units of one GPU, counting other resources on the same physical GPU.

    A GPU another resource advertises or holds has none: its whole capacity is
    the other plugin's to hand out (the device plugin withdraws our units of it),
    and a time-sliced or MIG device of it is no fraction metagpu can account
    for. Otherwise what our containers do not hold (never negative). The one
    rule for mgctl, metrics, node labels and the scheduler's ledger."""
    if claim is not None:
        return 0
    return max(0, units_total - units_allocated)


@dataclass(frozen=True)
class Conflict:
    """Our container holds units of a GPU that another resource's container holds too."""

    share: ShareView
    other: ForeignHolder

    def describe(self) -> str:
        k = self.share.key
        return (
            f"{k.namespace}/{k.pod}/{k.container} holds {self.share.units} unit(s) of "
            f"{self.share.resource} on GPU {self.share.gpu_index} ({self.share.gpu_uuid}), "
            f"which {self.other} also holds"
        )


PeakSpan = Literal["window", "agent-start", "share-start"]
"""What a :class:`UsagePeak` covers: the whole window, or less of it because the
agent started (it keeps no history across restarts) or the share began since."""


@dataclass(frozen=True)
class UsagePeak:
    """One share's peak use over the right-sizing window, and the share it needs.

    Kept by :class:`plugin.agent.usage_history.UsageHistory` in memory only: an
    agent restart starts the window over, which ``span`` says."""

    memory_peak_mib: int
    sm_peak_percent: int | None
    """None when the driver never told this share's SM use."""
    window_s: float
    """The configured window (``agent.rightsizing_window_s``)."""
    covered_s: float
    """How much of the window the history covers (less than ``window_s`` after a
    restart of the agent or for a share younger than the window)."""
    since: float
    """Wall-clock seconds since the epoch where the covered span begins."""
    span: PeakSpan
    recommended_units: int
    """:func:`plugin.api.rightsizing.recommended_units` of the peak."""


@dataclass(frozen=True)
class Snapshot:
    """Everything the agent knows after one cycle. Frozen: readers share it freely."""

    taken_at: float
    """Wall-clock seconds since the epoch."""
    units_per_gpu: int
    gpus: tuple[GpuView, ...]
    shares: tuple[ShareView, ...]
    processes: tuple[ProcessView, ...]
    stale: frozenset[Source] = frozenset()
    """Inputs that could not be read this cycle (the last good value was used)."""
    problems: tuple[str, ...] = ()
    """Human-readable notes: unreadable GPUs, allocations of unknown GPUs, ..."""
    pods_watched: bool = True
    """False when the agent does not watch pods at all (it has no node name): pod
    names are missing by configuration, not because a watch is failing."""
    conflicts: tuple[Conflict, ...] = ()
    """Our shares on GPUs another resource's containers hold too, each pair once."""
    no_gpus_reason: str | None = None
    """Why the node shows no GPUs at all (no driver, and no current board from the
    device plugin), so ``mgctl`` says why instead of an empty table."""
    shares_by_container: Mapping[ContainerKey, tuple[ShareView, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )
    mps: MpsNode = field(default_factory=MpsNode)
    """How the device plugin serves MPS here (its board; ``off`` without one)."""
    usage_peaks: Mapping[tuple[ContainerKey, str], UsagePeak] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Each allocated share's peak over the right-sizing window, by (container, GPU
    UUID); a share with no reading yet has none. Filled by the agent after the join."""
    unresolved: tuple[UnresolvedShare, ...] = ()
    """Claim devices of the DRA driver that no share could be made of (no CDI spec,
    a GPU not on this node, ...), each with its reason, for mgctl and metrics."""

    @property
    def enforces(self) -> tuple[Enforced, ...]:
        """What every container this node admits is held to at allocation."""
        return self.mps.enforces

    def shares_of(self, key: ContainerKey) -> tuple[ShareView, ...]:
        """The shares one container holds or uses."""
        return self.shares_by_container.get(key, ())

    def peak_of(self, share: ShareView) -> UsagePeak | None:
        """The share's peak over the right-sizing window (None: no history yet)."""
        return self.usage_peaks.get((share.key, share.gpu_uuid))

    def gpu(self, uuid: str) -> GpuView | None:
        """One GPU by UUID."""
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        return None


EMPTY_SNAPSHOT: Final = Snapshot(taken_at=0.0, units_per_gpu=1, gpus=(), shares=(), processes=())


def build_snapshot(
    readings: Sequence[GpuReading],
    allocations: Iterable[Allocation],
    owners: Mapping[int, ContainerId | None],
    *,
    directory: ContainerDirectory,
    units_per_gpu: int,
    gpu_resources: Mapping[str, str],
    resources: Iterable[str],
    taken_at: float,
    stale: frozenset[Source] = frozenset(),
    health: Mapping[str, GpuHealth] | None = None,
    liveness: Mapping[str, tuple[int, int]] | None = None,
    pods_watched: bool = True,
    ownership: Ownership = NO_CLAIMS,
    no_gpus_reason: str | None = None,
    advertised: Iterable[tuple[str, Sequence[str]]] | None = None,
    mps: MpsNode | None = None,
) -> Snapshot:
    """Join one cycle's inputs into a :class:`Snapshot`.

    ``owners`` maps every GPU process's PID to its container ID (None: host
    process; a PID missing from the map is treated the same); ``directory``
    names the containers. ``resources`` filters the allocations that are
    shares; other device plugins' resources count through ``ownership``
    (:func:`plugin.placement.ownership.find_foreign_claims` over the same
    answer): their GPUs have no free units and our shares on them conflict.
    ``health`` is the device plugin's board (UUID → record): a GPU on it is as
    healthy as the plugin advertises it, with the plugin's reason.
    ``advertised`` is the kubelet's allocatable devices as (resource, device IDs);
    those of ``resources`` count into each GPU's ``units_advertised`` (None: not read).
    """
    health = health or {}
    liveness = liveness or {}
    problems: list[str] = []
    by_device: dict[str, GpuReading] = {}
    for reading in readings:
        by_device[reading.info.uuid] = reading
        by_device[str(reading.info.index)] = reading

    # --- allocations: (container, gpu) -> units
    wanted = set(resources)
    units: dict[tuple[ContainerKey, str], int] = defaultdict(int)
    unit_resource: dict[tuple[ContainerKey, str], str] = {}
    allocated_on: dict[str, int] = defaultdict(int)
    granted_units: dict[tuple[ContainerKey, str], int] = defaultdict(int)
    granted_mib: dict[tuple[ContainerKey, str], int] = defaultdict(int)
    granted_policy: dict[tuple[ContainerKey, str], str] = {}
    counted: set[tuple[str, str]] = set()
    unresolved: list[UnresolvedShare] = []
    for alloc in allocations:
        if alloc.resource not in wanted:
            continue
        for grant in alloc.grants:
            found = by_device.get(grant.gpu_id)
            if found is None:
                unresolved.append(
                    UnresolvedShare(
                        alloc.key,
                        grant.claim,
                        grant.share,
                        f"its CDI spec names GPU {grant.gpu_id!r}, which is not on this node",
                    )
                )
                continue
            pair = (alloc.key, found.info.uuid)
            units[pair] += grant.units
            granted_units[pair] += grant.units
            granted_mib[pair] += grant.memory_limit_mib
            unit_resource[pair] = alloc.resource
            if grant.compute_policy:
                granted_policy[pair] = grant.compute_policy
            if (found.info.uuid, grant.share) not in counted:
                counted.add((found.info.uuid, grant.share))
                allocated_on[found.info.uuid] += grant.units
        unresolved.extend(alloc.unresolved)
        for device_id in alloc.device_ids:
            try:
                gpu_id, _ = parse_replica_id(device_id)
            except ReplicaIdError as exc:
                problems.append(f"{alloc.key}: {exc}")
                continue
            found = by_device.get(gpu_id)
            if found is None:
                problems.append(
                    f"{alloc.key}: holds {device_id!r} of {alloc.resource} "
                    f"but no GPU {gpu_id!r} is on this node"
                )
                continue
            uuid = found.info.uuid
            units[(alloc.key, uuid)] += 1
            unit_resource[(alloc.key, uuid)] = alloc.resource
            allocated_on[uuid] += 1

    problems.extend(u.describe() for u in unresolved)

    advertised_on: dict[str, int] | None = None
    if advertised is not None:
        advertised_on = defaultdict(int)
        for resource_name, device_ids in advertised:
            if resource_name not in wanted:
                continue
            for device_id in device_ids:
                try:
                    gpu_id, _ = parse_replica_id(device_id)
                except ReplicaIdError:
                    continue
                if (found := by_device.get(gpu_id)) is not None:
                    advertised_on[found.info.uuid] += 1

    # --- processes: attribute each to a container
    processes: list[ProcessView] = []
    proc_of: dict[tuple[ContainerKey, str], list[ProcessView]] = defaultdict(list)
    for reading in readings:
        info = reading.info
        for proc in reading.processes or ():
            cid = owners.get(proc.pid)
            ref = directory.lookup(cid) if cid is not None else None
            view = ProcessView(
                pid=proc.pid,
                gpu_uuid=info.uuid,
                gpu_index=info.index,
                used_memory_mib=proc.used_memory_mib,
                utilization_percent=proc.utilization_percent,
                container_id=cid,
                container=ref,
            )
            processes.append(view)
            if ref is not None:
                proc_of[(ref.key, info.uuid)].append(view)

    # --- shares: every (container, gpu) that holds units or runs processes
    readings_by_uuid = {r.info.uuid: r for r in readings}
    shares: list[ShareView] = []
    for pair in sorted(units.keys() | proc_of.keys(), key=_share_order(readings_by_uuid)):
        key, uuid = pair
        reading = readings_by_uuid[uuid]
        held = units.get(pair, 0)
        procs = proc_of.get(pair, [])
        total_mib = reading.info.memory_mib
        ref = procs[0].container if procs else directory.by_key(key)
        # Meta-devices' memory follows from their count; a whole share brings its own.
        metered = held - granted_units.get(pair, 0)
        limit_mib = granted_mib.get(pair, 0) + memory_limit_mib(
            metered, units_per_gpu=units_per_gpu, memory_total_mib=total_mib
        )
        policy = granted_policy.get(pair) or (ref.compute_policy if ref else "")
        shares.append(
            ShareView(
                key=key,
                gpu_uuid=uuid,
                gpu_index=reading.info.index,
                resource=unit_resource.get(pair, ""),
                units=held,
                units_per_gpu=units_per_gpu,
                memory_total_mib=total_mib,
                memory_limit_mib=limit_mib,
                memory_used_mib=sum(p.used_memory_mib for p in procs),
                utilization_percent=_share_utilization(procs, reading),
                pids=tuple(sorted(p.pid for p in procs)),
                container_id=ref.container_id if ref else None,
                pod_uid=ref.pod_uid if ref else "",
                compute_policy=policy,
            )
        )
    # --- GPUs
    attributed: dict[str, int] = defaultdict(int)
    for view in processes:
        if view.container is not None:
            attributed[view.gpu_uuid] += view.used_memory_mib
    gpus: list[GpuView] = []
    for reading in readings:
        info = reading.info
        resource = gpu_resources.get(info.uuid)
        record = health.get(info.uuid)
        if record is not None:
            healthy = record.healthy
            problem = record.reason or info.unhealthy_reason or reading.error
        else:
            healthy = info.unhealthy_reason is None and reading.usage is not None
            problem = info.unhealthy_reason or reading.error
        if reading.error:
            problems.append(f"GPU {info.index} ({info.uuid}): {reading.error}")
        used = reading.usage.memory_used_mib if reading.usage else None
        gpus.append(
            GpuView(
                uuid=info.uuid,
                index=info.index,
                numa_node=info.numa_node,
                name=info.name,
                memory_total_mib=info.memory_mib,
                memory_used_mib=used,
                utilization_percent=reading.usage.utilization_percent if reading.usage else None,
                healthy=healthy,
                problem=problem,
                resource=resource,
                units_total=units_per_gpu if resource is not None and not info.mig_enabled else 0,
                units_allocated=allocated_on.get(info.uuid, 0),
                unattributed_memory_mib=max(0, (used or 0) - attributed.get(info.uuid, 0)),
                processes_known=reading.processes is not None,
                health=record,
                liveness=liveness.get(info.uuid),
                claim=ownership.claim(info.uuid),
                units_advertised=(
                    advertised_on.get(info.uuid, 0) if advertised_on is not None else None
                ),
            )
        )
    conflicts = tuple(
        Conflict(share, holder)
        for share in shares
        if share.allocated and (claim := ownership.claim(share.gpu_uuid)) is not None
        for holder in claim.holders
    )

    by_container: dict[ContainerKey, list[ShareView]] = defaultdict(list)
    for share in shares:
        by_container[share.key].append(share)
    return Snapshot(
        taken_at=taken_at,
        units_per_gpu=units_per_gpu,
        gpus=tuple(gpus),
        shares=tuple(shares),
        processes=tuple(processes),
        stale=stale,
        problems=tuple(problems),
        pods_watched=pods_watched,
        conflicts=conflicts,
        no_gpus_reason=no_gpus_reason if not gpus else None,
        shares_by_container={k: tuple(v) for k, v in by_container.items()},
        mps=mps or MpsNode(),
        unresolved=tuple(unresolved),
    )


def _share_order(
    readings: Mapping[str, GpuReading],
) -> Callable[[tuple[ContainerKey, str]], tuple[int, ContainerKey]]:
    def order(pair: tuple[ContainerKey, str]) -> tuple[int, ContainerKey]:
        return readings[pair[1]].info.index, pair[0]

    return order


def _share_utilization(procs: Sequence[ProcessView], reading: GpuReading) -> int | None:
    """A container's SM utilisation on one GPU.

    The sum of its processes' own figures when the driver gives them; otherwise
    the whole GPU's figure if this container runs every process on the GPU
    (nothing else can be using it); otherwise unknown. Never a guess split by
    memory: memory says nothing about compute.
    """
    known = [p.utilization_percent for p in procs if p.utilization_percent is not None]
    if known:
        return min(100, sum(known))
    if not procs or reading.usage is None or reading.usage.utilization_percent is None:
        return None
    mine = {p.pid for p in procs}
    if all(p.pid in mine for p in reading.processes or ()):
        return reading.usage.utilization_percent
    return None
