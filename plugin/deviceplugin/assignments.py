"""Which GPU the scheduler extender assigned to the container the kubelet is allocating (pure).

``GetPreferredAllocation`` carries no pod identity: the kubelet asks for N
meta-devices (with ``must_include`` when it reuses an init container's), and
nothing says for which pod. The extender recorded at bind, on each pod, the
GPUs every container gets (``metagpu.io/assigned-gpus``, a
:class:`~plugin.api.scheduling.PodAssignment`). :class:`AssignmentBook` holds
those assignments for the pods bound to this node (fed by the pod watch,
:class:`plugin.kube.node_pods.NodePodWatcher`) and answers a request with the
assignment of the **oldest pending container asking for N units**:

* *pending*: assigned, and not yet allocated. The book learns a container is
  allocated from ``Allocate`` (the plugin remembers the devices it answered
  for each container, and the kubelet allocates exactly those), and, as a
  safety net for a plugin restart or a kubelet that ignored the answer, from
  the pod's status: once the kubelet reports container statuses or a phase
  past ``Pending``, the pod was admitted and all its devices were allocated.
  A pod deleted, or marked for deletion, is dropped.
* *asking for N units*: the container's units equal the request's size, and
  the units it reuses from its pod's init containers equal the request's
  ``must_include`` count (the kubelet's reuse, ``../shared/KUBELET-FACTS.md``).
  Two pending containers of the same size are interchangeable: each was
  booked on its GPUs, so answering one with the other's GPUs keeps every GPU
  within what the extender booked.
* *continuation first*: the kubelet admits one pod at a time, its containers
  in order, so after answering one container of a pod, the pod's next pending
  container is tried before older ones.
* *oldest*: pod ``creationTimestamp``, then the container's place in its pod.

A candidate is used only if the request can take exactly its assigned counts
(every GPU's units within what is free plus what ``must_include`` holds
there); otherwise the next one is tried, and with none the caller falls back
to its own policy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS, PodAssignment

logger = logging.getLogger("plugin.assignments")

MAX_REMEMBERED_ANSWERS: Final = 256
"""Answers kept until their ``Allocate`` arrives. The kubelet allocates right after
asking, one container at a time; the bound only stops a kubelet that asks and never
allocates from growing the book."""

ContainerRef = tuple[str, str]
"""``(pod uid, container name)``."""


@dataclass(frozen=True, slots=True)
class AssignedContainer:
    """One container's assignment, with what is needed to match a request to it."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    position: int
    """Its place in the pod's allocation order (init containers, then app containers)."""
    units: int
    reuse: int
    """Units it takes from its pod's init containers (the kubelet's ``must_include``)."""
    gpus: Mapping[str, int]
    """GPU ID (as the plugin names GPUs) → units, reused units included."""

    @property
    def ref(self) -> ContainerRef:
        return (self.pod_uid, self.container)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True, slots=True)
class _Pod:
    created: str
    namespace: str
    name: str
    containers: tuple[AssignedContainer, ...]


@dataclass(frozen=True, slots=True)
class Match:
    """A request answered with an assignment: which container, and the units to take."""

    container: AssignedContainer
    take: tuple[int, ...]
    """Units to take from each GPU (the request's GPU order), beyond ``must_include``."""


class AssignmentBook:
    """The extender's assignments of the pods bound to this node, and which are pending.

    Fed like :class:`plugin.kube.node_pods.PodSink` (``replace``, ``apply``);
    asked by the servicer (:meth:`match`, :meth:`answered`, :meth:`allocated`).
    Not thread-safe; owned by the event loop.
    """

    def __init__(self) -> None:
        self._pods: dict[str, _Pod] = {}
        self._allocated: set[ContainerRef] = set()
        self._answers: dict[frozenset[str], AssignedContainer] = {}
        self._current: str | None = None
        """The pod of the last answered container: the kubelet is admitting it."""
        self._bad: set[str] = set()
        """Pods whose annotation did not parse (logged once each)."""

    # ------------------------------------------------------------ the pod watch
    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Start over from a full list (after a LIST or a 410 Gone re-list)."""
        self._pods.clear()
        for pod in pods:
            self._upsert(pod)
        self._forget_gone()

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """One watch event: ``ADDED``, ``MODIFIED`` or ``DELETED``."""
        if event_type == "DELETED":
            self._pods.pop(_uid(pod), None)
            self._forget_gone()
        elif event_type in ("ADDED", "MODIFIED"):
            self._upsert(pod)

    # ------------------------------------------------------------ the servicer
    def pending(self) -> list[AssignedContainer]:
        """Every pending container, oldest first."""
        out: list[AssignedContainer] = []
        for pod in sorted(self._pods.values(), key=lambda p: (p.created, p.namespace, p.name)):
            out.extend(c for c in pod.containers if c.ref not in self._allocated)
        return out

    def match(
        self, size: int, *, gpu_ids: Sequence[str], free: Sequence[int], held: Sequence[int]
    ) -> Match | None:
        """The assignment to answer a request of ``size`` with, or None (use the policy).

        ``gpu_ids``: the GPUs of the request, as the plugin names them; ``free``
        and ``held``: per GPU, units available and units in ``must_include``."""
        reuse = sum(held)
        candidates = [c for c in self.pending() if c.units == size and c.reuse == reuse]
        if self._current is not None:
            mine = [c for c in candidates if c.pod_uid == self._current]
            candidates = mine + [c for c in candidates if c.pod_uid != self._current]
        position = {gpu: pos for pos, gpu in enumerate(gpu_ids)}
        for candidate in candidates:
            take = _take(candidate, position=position, free=free, held=held)
            if take is not None:
                return Match(candidate, take)
        return None

    def answered(self, device_ids: Iterable[str], container: AssignedContainer) -> None:
        """The plugin answered ``container``'s request with ``device_ids``."""
        if len(self._answers) >= MAX_REMEMBERED_ANSWERS:
            self._answers.pop(next(iter(self._answers)))
        self._answers[frozenset(device_ids)] = container
        self._current = container.pod_uid

    def allocated(
        self, device_ids: Iterable[str], units_by_gpu: Mapping[str, int]
    ) -> AssignedContainer | None:
        """``Allocate`` gave ``device_ids``: the container they were answered for (or,
        when the kubelet chose by itself, the oldest pending one with exactly these
        counts) is no longer pending. Returns it, or None."""
        ids = frozenset(device_ids)
        container = self._answers.pop(ids, None)
        if container is None:
            wanted = dict(units_by_gpu)
            container = next(
                (c for c in self.pending() if c.units == len(ids) and dict(c.gpus) == wanted),
                None,
            )
        if container is not None and container.pod_uid in self._pods:
            # (a pod already gone, e.g. admitted meanwhile, has nothing left to mark)
            self._allocated.add(container.ref)
        return container

    # ------------------------------------------------------------ internals
    def _upsert(self, pod: Mapping[str, Any]) -> None:
        uid = _uid(pod)
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(ANNOTATION_ASSIGNED_GPUS)
        if not uid or text is None or meta.get("deletionTimestamp") or _admitted(pod):
            # Nothing to wait for: no assignment, going away, or already allocated.
            if uid in self._pods:
                self._pods.pop(uid)
                self._allocated.difference_update({r for r in self._allocated if r[0] == uid})
            return
        try:
            assignment = PodAssignment.model_validate_json(text)
        except ValidationError as exc:
            if uid not in self._bad:
                self._bad.add(uid)
                logger.warning(
                    "ignoring the %s annotation of pod %s/%s: %s",
                    ANNOTATION_ASSIGNED_GPUS,
                    meta.get("namespace"),
                    meta.get("name"),
                    _first_error(exc),
                )
            return
        self._pods[uid] = _Pod(
            created=str(meta.get("creationTimestamp") or ""),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            containers=_containers(assignment, pod_uid=uid, meta=meta),
        )

    def _forget_gone(self) -> None:
        self._allocated = {r for r in self._allocated if r[0] in self._pods}
        self._bad &= set(self._pods)
        if self._current not in self._pods:
            self._current = None


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _admitted(pod: Mapping[str, Any]) -> bool:
    """The kubelet admitted the pod (so allocated all its devices): it reports
    container statuses, or a phase past Pending (Failed: rejected at admission)."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "", "Pending"):
        return True
    return bool(status.get("containerStatuses") or status.get("initContainerStatuses"))


def _containers(
    assignment: PodAssignment, *, pod_uid: str, meta: Mapping[str, Any]
) -> tuple[AssignedContainer, ...]:
    """The assignment's containers with the units each reuses, replayed the kubelet's
    way: a regular init container's units become reusable, later containers take
    reusable units first (``plugin.placement.pod.place_pod`` does the same)."""
    reusable = 0
    out: list[AssignedContainer] = []
    for position, c in enumerate(assignment.containers):
        reuse = min(c.units, reusable)
        reusable -= reuse
        if c.kind == "init":
            reusable += c.units
        out.append(
            AssignedContainer(
                pod_uid=pod_uid,
                namespace=str(meta.get("namespace") or ""),
                pod=str(meta.get("name") or ""),
                container=c.container,
                position=position,
                units=c.units,
                reuse=reuse,
                gpus=dict(c.gpus),
            )
        )
    return tuple(out)


def _take(
    c: AssignedContainer,
    *,
    position: Mapping[str, int],
    free: Sequence[int],
    held: Sequence[int],
) -> tuple[int, ...] | None:
    """Units to take per GPU so the request gets exactly ``c.gpus``; None if it cannot."""
    target = [0] * len(free)
    for gpu, units in c.gpus.items():
        pos = position.get(gpu)
        if pos is None:
            return None
        target[pos] = units
    if sum(target) != c.units:
        return None
    take: list[int] = []
    for want, have, room in zip(target, held, free, strict=True):
        if have > want or want - have > room:
            return None
        take.append(want - have)
    return tuple(take)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "(top)"
    return f"{where}: {err.get('msg')}"
