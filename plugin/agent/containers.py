"""Which pod and container a container ID belongs to, from the pods on this node.

Pure: :class:`PodIndex` is fed pod objects (plain dicts, as the API server sends
them) by the watch in :mod:`plugin.agent.pods` and answers lookups by container
ID, the one key a process's cgroup gives us. Regular, init and ephemeral
containers are all indexed: an init container can hold GPU units too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from plugin.agent.cgroups import ContainerId, parse_runtime_container_id
from plugin.api.resources import ANNOTATION_COMPUTE_POLICY

ContainerKind = Literal["container", "init", "ephemeral"]

_STATUS_FIELDS: tuple[tuple[str, ContainerKind], ...] = (
    ("containerStatuses", "container"),
    ("initContainerStatuses", "init"),
    ("ephemeralContainerStatuses", "ephemeral"),
)


class ContainerKey(NamedTuple):
    """A container as the kubelet's PodResources API names it."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True)
class ContainerRef:
    """A running container of a pod on this node."""

    key: ContainerKey
    container_id: ContainerId
    pod_uid: str
    kind: ContainerKind = "container"
    compute_policy: str = ""
    """The pod's ``metagpu.io/compute-policy`` (set by the webhook); empty when unset."""


@dataclass(frozen=True)
class PodRef:
    """What an Event about a pod needs (``regarding``)."""

    namespace: str
    name: str
    uid: str


def containers_of_pod(pod: Mapping[str, Any]) -> Iterator[ContainerRef]:
    """Every container of ``pod`` that has a container ID (i.e. has been started)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    namespace = str(meta.get("namespace", ""))
    name = str(meta.get("name", ""))
    uid = str(meta.get("uid", ""))
    annotations = meta.get("annotations")
    policy = (
        annotations.get(ANNOTATION_COMPUTE_POLICY) if isinstance(annotations, Mapping) else None
    )
    compute_policy = policy if isinstance(policy, str) else ""
    for field, kind in _STATUS_FIELDS:
        for cs in status.get(field) or ():
            cid = parse_runtime_container_id(str(cs.get("containerID") or ""))
            if cid is None or not cs.get("name"):
                continue
            yield ContainerRef(
                key=ContainerKey(namespace, name, str(cs["name"])),
                container_id=cid,
                pod_uid=uid,
                kind=kind,
                compute_policy=compute_policy,
            )


class ContainerDirectory(Protocol):
    """What the accounting join needs from the pod index."""

    def lookup(self, cid: ContainerId) -> ContainerRef | None:
        """The container with this ID, or None."""
        ...

    def by_key(self, key: ContainerKey) -> ContainerRef | None:
        """The running container named ``key``, or None."""
        ...


class PodIndex:
    """Container ID → container, and (namespace, name) → pod, for the pods on this node.

    Not thread-safe; owned by the event loop. :attr:`generation` changes on every
    change so readers can cache derived data.
    """

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], PodRef] = {}
        self._by_pod: dict[tuple[str, str], tuple[ContainerRef, ...]] = {}
        self._by_id: dict[ContainerId, ContainerRef] = {}
        self._by_key: dict[ContainerKey, ContainerRef] = {}
        self.generation = 0

    def __len__(self) -> int:
        return len(self._pods)

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Start over from a full list (after a LIST or a 410 Gone re-list)."""
        self._pods.clear()
        self._by_pod.clear()
        self._by_id.clear()
        self._by_key.clear()
        for pod in pods:
            self._upsert(pod)
        self.generation += 1

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """Apply one watch event: ``ADDED``, ``MODIFIED`` or ``DELETED``."""
        if event_type == "DELETED":
            self._remove(_pod_key(pod))
        elif event_type in ("ADDED", "MODIFIED"):
            self._upsert(pod)
        else:
            return
        self.generation += 1

    def lookup(self, cid: ContainerId) -> ContainerRef | None:
        """The container with this ID, or None if no pod on this node runs it."""
        return self._by_id.get(cid)

    def by_key(self, key: ContainerKey) -> ContainerRef | None:
        """The running container named ``key``, or None."""
        return self._by_key.get(key)

    def knows(self, cid: ContainerId) -> bool:
        """True if a pod on this node runs container ``cid``."""
        return cid in self._by_id

    def pod(self, namespace: str, name: str) -> PodRef | None:
        """The pod ``namespace/name`` if it is on this node."""
        return self._pods.get((namespace, name))

    def containers(self) -> Iterator[ContainerRef]:
        """Every indexed container."""
        return iter(self._by_id.values())

    # ----------------------------------------------------------- internals
    def _upsert(self, pod: Mapping[str, Any]) -> None:
        key = _pod_key(pod)
        self._remove(key)
        meta = pod.get("metadata") or {}
        self._pods[key] = PodRef(namespace=key[0], name=key[1], uid=str(meta.get("uid", "")))
        refs = tuple(containers_of_pod(pod))
        self._by_pod[key] = refs
        for ref in refs:
            self._by_id[ref.container_id] = ref
            self._by_key[ref.key] = ref

    def _remove(self, key: tuple[str, str]) -> None:
        self._pods.pop(key, None)
        for ref in self._by_pod.pop(key, ()):
            if self._by_id.get(ref.container_id) is ref:
                del self._by_id[ref.container_id]
            if self._by_key.get(ref.key) is ref:
                del self._by_key[ref.key]


def _pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


_: ContainerDirectory = PodIndex()  # mypy: the index satisfies the port
