"""The GPU-aware scheduling contract: who holds what on each GPU, and which GPU a pod gets.

Three components speak it, so it lives in the shared words (standard library
and pydantic only):

* the **node agent** publishes a :class:`NodeLedger` on its Node, in the
  annotation :data:`ANNOTATION_GPU_LEDGER`: every GPU of the node with its
  health and the units the kubelet really allocated on it (from PodResources),
  rewritten when it changes and at least every :data:`ANNOTATION_LEDGER_REFRESH`
  seconds when it does not, so the extender can tell a ledger whose agent is gone;
* the **scheduler extender** reads the ledgers, adds its own assignments the
  nodes have not reported yet, and at bind records the GPUs it chose for each
  container of the pod in :data:`ANNOTATION_ASSIGNED_GPUS` (a
  :class:`PodAssignment`);
* the **device plugin** reads the assignments of pods bound to its node and
  answers ``GetPreferredAllocation`` with the assigned GPU.

Annotations, not a CRD: they need no installation step, they are readable
with ``kubectl get -o yaml``, and RBAC already covers them (the agent patches
its Node, the extender its pods). Both are compact JSON (a few hundred bytes per
GPU), far under the 256 KiB annotation budget of an object.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from plugin.api.limits import Enforced
from plugin.api.resources import MAX_UNITS_PER_GPU
from plugin.api.settings import StrictModel

ANNOTATION_GPU_LEDGER: Final = "metagpu.io/gpu-ledger"
"""On a Node, written by the node agent: a :class:`NodeLedger` as JSON."""

ANNOTATION_LEDGER_REFRESH: Final = "metagpu.io/gpu-ledger-refresh-s"
"""On a Node, beside the ledger: the seconds within which its agent rewrites the ledger even
unchanged (a decimal number). Its own annotation, not a ledger field, so an extender of an
earlier release (which refuses unknown ledger fields) still reads the ledger; an extender
that sees it stops trusting a ledger several periods old, and trusts a ledger without it
however old (agents of an earlier release rewrite only on change)."""

ANNOTATION_ASSIGNED_GPUS: Final = "metagpu.io/assigned-gpus"
"""On a Pod, written by the scheduler extender at bind: a :class:`PodAssignment` as JSON."""

DEFAULT_SCHEDULER_NAME: Final = "metagpu-scheduler"
"""The second scheduler's profile name; the webhook points metagpu pods at it."""

ANNOTATION_PLACEMENT_POLICY: Final = "metagpu.io/placement-policy"
"""On a Pod or its Namespace: ``binpack`` or ``spread``, overriding the extender's default
for that pod (the pod's own annotation wins), the way ``metagpu.io/compute-policy`` works."""

PLACEMENT_POLICIES: Final = ("binpack", "spread")

MAX_LEDGER_GPUS: Final = 64
"""GPUs one node ledger may list (real nodes have 1-16). The extender keeps every
node as a row as wide as the widest node, and a node's units (at most
``MAX_UNITS_PER_GPU`` per GPU) must stay below 2**20 in its arrays: a larger ledger
is refused as unreadable for that node alone, never for every pod."""

MAX_NUMA_NODE: Final = 65535
"""Largest NUMA node ID a ledger may carry (Linux numbers them from 0; "unknown" is
no value, not -1)."""


class GpuHolder(StrictModel):
    """Units of one GPU allocated to one container (as the kubelet reports them)."""

    pod_uid: str = Field(min_length=1)
    namespace: str
    pod: str
    container: str
    units: int = Field(ge=1)


class GpuLedgerEntry(StrictModel):
    """One physical GPU of the node: capacity, health and who holds its units."""

    uuid: str = Field(min_length=1)
    """The GPU's ID as the device plugin advertises it (``DeviceId``: UUID by default)."""
    index: int = Field(ge=0)
    units: int = Field(ge=1, le=MAX_UNITS_PER_GPU)
    """Meta-devices of this GPU (``units_per_gpu``)."""
    numa: int | None = Field(default=None, ge=0, le=MAX_NUMA_NODE)
    """The GPU's NUMA node when the plugin advertises topology (optional, added for the
    extender: :func:`~plugin.placement.units.place_units` prefers GPUs on one NUMA node,
    so the extender needs it to choose the GPU the plugin would choose)."""
    healthy: bool = True
    reason: str = ""
    """Why it is unhealthy, for operators and the extender's refusal messages."""
    holders: tuple[GpuHolder, ...] = ()

    @property
    def used(self) -> int:
        return sum(h.units for h in self.holders)


class NodeLedger(StrictModel):
    """Everything the extender needs to know about one node's GPUs."""

    version: Literal["v1"] = "v1"
    resource: str
    """The resource these GPUs serve (``cnvrg.io/metagpu``)."""
    units_per_gpu: int = Field(ge=1, le=MAX_UNITS_PER_GPU)
    gpus: tuple[GpuLedgerEntry, ...] = Field(default=(), max_length=MAX_LEDGER_GPUS)
    observed_at: str = ""
    """RFC 3339 time of the PodResources reading this ledger was built from."""
    enforces: tuple[Enforced, ...] = ()
    """What the node holds every container it admits to (``memory``, ``fixed``: a
    supervised MPS daemon serves every GPU of it, so each GPU is in one mode, MPS).
    Absent from ledgers of earlier agents and of nodes that enforce nothing, which
    then mean exactly that: the extender sends no ``fixed`` pod there. Written only
    when not empty (:func:`plugin.agent.ledger.encode_ledger`), so an extender of an
    earlier release still reads the ledgers of nodes without MPS."""


class ContainerAssignment(StrictModel):
    """The units one container gets on each GPU (GPU ID → units)."""

    container: str
    kind: Literal["init", "sidecar", "app"] = "app"
    """Init containers' units are reused by later containers, the kubelet's way."""
    units: int = Field(ge=1)
    """What the container asks for (``cnvrg.io/metagpu`` units)."""
    gpus: dict[str, int]
    """GPU ID → units taken there; one entry for any share below one GPU."""


class PodAssignment(StrictModel):
    """What the extender decided for a pod at bind time."""

    version: Literal["v1"] = "v1"
    node: str
    containers: tuple[ContainerAssignment, ...]
    taken: dict[str, int] = Field(default_factory=dict)
    """GPU ID → units the whole pod takes from that GPU (optional): what the extender
    reserves; less than the containers' sum when app containers reuse init units."""
    assigned_at: str = ""
    """RFC 3339 time of the bind (optional): after an extender restart, an assignment the
    node has not reported within the assume timeout is no longer held for the pod."""
