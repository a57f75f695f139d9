"""What preemption must know of a pod besides its units: priority, policy, labels (pure).

kube-scheduler reads ``spec.priority`` (resolved from the PriorityClass at
admission; absent means 0, ``corev1helpers.PodPriority``) and
``spec.preemptionPolicy`` (``Never``: the pod waits, it never preempts,
``PodEligibleToPreemptOthers``). Victims are ordered by importance
(``MoreImportantPod``: higher priority, then the earlier start time), and
budgets match their labels.

The extender keeps these facts only for pods bound to a node that ask for its
resource (:class:`PodDirectory`): the pods that can hold units, so the memory
follows the GPU pods, never the cluster's pod count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from plugin.extender.mps_users import pod_user

MAX_PODS = 200_000
"""Pods whose facts are kept (far above the GPU pods of any cluster: 10,000 GPUs with
10 pods each); past it the oldest entries go first."""


@dataclass(frozen=True, slots=True)
class PodFacts:
    uid: str
    namespace: str
    name: str
    priority: int
    may_preempt: bool
    """False when ``spec.preemptionPolicy`` is ``Never``."""
    labels: Mapping[str, str] = field(default_factory=dict)
    started_at: str = ""
    """``status.startTime`` (RFC 3339 compares in time order as text); empty: not started."""
    terminating: bool = False
    """``metadata.deletionTimestamp`` is set: its units are leaving already."""
    user: int | None = None
    """The UID its GPU containers run as (:func:`plugin.extender.mps_users.pod_user`;
    None: unknown or not read)."""


def pod_facts(pod: Mapping[str, Any], *, asking: Collection[str] | None = None) -> PodFacts:
    """The facts of a Pod object as the API serves it (never raises: odd values read as
    the API server's defaults); with ``asking`` (the names of its containers that ask for
    GPU units), the user they run as."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    priority = spec.get("priority")
    labels = meta.get("labels") or {}
    return PodFacts(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        may_preempt=spec.get("preemptionPolicy") != "Never",
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
        started_at=str(status.get("startTime") or ""),
        terminating=bool(meta.get("deletionTimestamp")),
        user=pod_user(pod, asking=asking) if asking is not None else None,
    )


class PodDirectory:
    """Facts of the GPU pods bound to nodes, by UID (bounded by :data:`MAX_PODS`), and how
    many have each priority: whether any pod could be a victim at all is then a look at
    a few distinct priorities, not a walk over every node."""

    def __init__(self, *, limit: int = MAX_PODS) -> None:
        self._pods: dict[str, PodFacts] = {}
        self._limit = limit
        self._priorities: Counter[int] = Counter()

    def put(self, facts: PodFacts) -> None:
        self.drop(facts.uid)
        self._pods[facts.uid] = facts
        self._priorities[facts.priority] += 1
        while len(self._pods) > self._limit:
            self.drop(next(iter(self._pods)))

    def drop(self, uid: str) -> PodFacts | None:
        facts = self._pods.pop(uid, None)
        if facts is not None:
            self._priorities[facts.priority] -= 1
            if not self._priorities[facts.priority]:
                del self._priorities[facts.priority]
        return facts

    def get(self, uid: str) -> PodFacts | None:
        return self._pods.get(uid)

    def uids(self) -> list[str]:
        return list(self._pods)

    def any_below(self, priority: int) -> bool:
        """Some known GPU pod has a lower priority than ``priority`` (a possible victim)."""
        return any(known < priority for known in self._priorities)

    def __len__(self) -> int:
        return len(self._pods)
