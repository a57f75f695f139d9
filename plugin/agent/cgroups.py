"""Which container a process runs in, from its ``/proc/<pid>/cgroup``.

The kernel's cgroup membership is the one fact about a process that neither
the process nor its container can forge from the inside, and every container
runtime names the container's cgroup after the container ID. The original
MetaGPU only understood containerd with cgroupfs on cgroup v1; the shapes
handled here are:

=====================  ========================================================================
runtime / driver       leaf of the cgroup path
=====================  ========================================================================
containerd, cgroupfs   ``/kubepods/burstable/pod<uid>/<64 hex>``
containerd, systemd    ``.../kubepods-burstable-pod<uid_>.slice/cri-containerd-<64 hex>.scope``
CRI-O, systemd         ``.../crio-<64 hex>.scope`` (``crio-conmon-<id>.scope`` is the monitor)
CRI-O, cgroupfs        ``/kubepods/.../pod<uid>/crio-<64 hex>``
docker / cri-dockerd   ``.../docker-<64 hex>.scope`` or ``/docker/<64 hex>``
podman                 ``.../libpod-<64 hex>.scope``
=====================  ========================================================================

for cgroup v1 (one line per hierarchy, ``12:memory:/...``) and v2 (one line,
``0::/...``). Paths may be nested (kind runs the kubelet inside a docker
container: ``/system.slice/docker-<node>.scope/kubelet.slice/...``) or relative
to the reader's cgroup namespace (``0::/../../kubepods-...slice/...``).

Which ID is "the container"? Only components *below* the first ``kubepods``
component count when there is one, and callers take the **outermost**
candidate that the pod directory knows (:func:`pick_container`). Outermost,
because a privileged container that can write its own cgroupfs can create a
sub-cgroup named ``cri-containerd-<someone else's id>.scope`` under itself, but
it cannot move above its own container's cgroup.

Pure functions only, plus :func:`read_process_cgroup`, which reads the one file
under a configurable ``proc_root`` (so tests can place a process in any
container by writing a fake file).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NewType

ContainerId = NewType("ContainerId", str)
"""A container ID as the runtime names it: 64 lowercase hex digits, no ``containerd://``."""

PodUid = NewType("PodUid", str)
"""A pod's ``metadata.uid`` with dashes (systemd slice names use underscores)."""

_HEX64: Final = r"[0-9a-f]{64}"
_CONTAINER_COMPONENT: Final = re.compile(
    rf"^(?:(?:cri-containerd|crio|docker|libpod)-)?(?P<id>{_HEX64})(?:\.scope)?$"
)
"""A cgroup path component that names a container (``crio-conmon-...`` never matches:
``conmon-<id>`` is not 64 hex digits)."""

_POD_COMPONENT: Final = re.compile(
    r"(?:^|-)pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?$"
)
"""``pod<uid>`` (cgroupfs) or ``kubepods-<qos>-pod<uid_with_underscores>.slice`` (systemd)."""

_KUBEPODS: Final = "kubepods"

# Controllers to trust first on cgroup v1: memory is always mounted where
# Kubernetes runs (the kubelet requires it) and is what limits the container.
_V1_PREFERENCE: Final = ("memory", "name=systemd", "pids", "cpu,cpuacct", "cpu", "devices")


class CgroupFormatError(ValueError):
    """A ``/proc/<pid>/cgroup`` file that is not in the kernel's format."""


@dataclass(frozen=True)
class ProcessCgroup:
    """What a process's cgroup file says about its container."""

    candidates: tuple[ContainerId, ...]
    """Container IDs named on the path, outermost first; empty for host processes."""
    pod_uid: PodUid | None
    """The pod the cgroup belongs to, when the path is under ``kubepods``."""
    path: str
    """The cgroup path the answer came from (for logs and ``mgctl``)."""

    @property
    def in_container(self) -> bool:
        """True when the path names at least one container."""
        return bool(self.candidates)

    @property
    def in_pod(self) -> bool:
        """True when the path is inside the kubelet's pod hierarchy (``kubepods``),
        whether or not a container ID could be read from it."""
        return self.pod_uid is not None or any(
            _KUBEPODS in component for component in self.path.split("/")
        )


HOST: Final = ProcessCgroup(candidates=(), pod_uid=None, path="/")


def parse_cgroup_path(path: str) -> ProcessCgroup:
    """Interpret one cgroup path (the part after the second ``:``)."""
    components = [c for c in path.split("/") if c and c not in (".", "..")]
    start = next((i for i, comp in enumerate(components) if _KUBEPODS in comp), None)
    under_kubepods = start is not None
    candidates: list[ContainerId] = []
    pod_uid: PodUid | None = None
    for comp in components[start or 0 :]:
        match = _CONTAINER_COMPONENT.match(comp)
        if match:
            candidates.append(ContainerId(match["id"]))
            continue
        pod = _POD_COMPONENT.search(comp)
        if pod and under_kubepods:
            pod_uid = PodUid(pod["uid"].replace("_", "-"))
    return ProcessCgroup(candidates=tuple(candidates), pod_uid=pod_uid, path=path)


def parse_cgroup_file(text: str) -> ProcessCgroup:
    """Interpret a whole ``/proc/<pid>/cgroup`` file, v1, v2 or hybrid.

    The unified (``0::``) line is preferred, then the v1 controllers in
    :data:`_V1_PREFERENCE` order, then any other line; the first line that
    names a container wins. A file that names no container is a host process.
    Raises :class:`CgroupFormatError` for text that is not a cgroup file.
    """
    entries: list[tuple[str, str]] = []  # (controllers, path)
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            raise CgroupFormatError(
                f"line {lineno} is not <id>:<controllers>:<path>: {_short(line)!r}"
            )
        entries.append((parts[1], parts[2]))
    if not entries:
        raise CgroupFormatError("empty cgroup file")

    def rank(entry: tuple[str, str]) -> int:
        controllers = entry[0]
        if controllers == "":
            return 0
        for i, name in enumerate(_V1_PREFERENCE, start=1):
            if name in controllers.split(","):
                return i
        return len(_V1_PREFERENCE) + 1

    first: ProcessCgroup | None = None
    for entry in sorted(entries, key=rank):
        parsed = parse_cgroup_path(entry[1])
        if parsed.in_container:
            return parsed
        first = first or parsed
    assert first is not None
    return first


def pick_container(
    cgroup: ProcessCgroup, *, known: Callable[[ContainerId], bool]
) -> ContainerId | None:
    """The container a process belongs to: the outermost candidate ``known`` accepts.

    Falls back to the innermost candidate when none is known (a container the
    pod watch has not seen yet, or one not run by Kubernetes), so logs and
    ``mgctl`` on the host can still name it. None for host processes.
    """
    for candidate in cgroup.candidates:
        if known(candidate):
            return candidate
    return cgroup.candidates[-1] if cgroup.candidates else None


def parse_runtime_container_id(value: str) -> ContainerId | None:
    """``containerd://<id>``, ``cri-o://<id>``, ``docker://<id>`` → ``<id>``.

    This is the form in ``status.containerStatuses[].containerID``. Returns
    None for an empty value (a container that has not started yet).
    """
    if not value:
        return None
    _, sep, cid = value.partition("://")
    return ContainerId((cid if sep else value).strip().lower()) or None


class ProcessGoneError(LookupError):
    """The process exited before its cgroup could be read."""


def read_proc_text(path: Path, *, pid: int, unreadable: type[Exception]) -> str:
    """The text of one file under ``/proc/<pid>/``.

    A missing file means the process exited (:class:`ProcessGoneError`); any
    other read error is raised as ``unreadable``, naming the file.
    """
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGoneError(f"process {pid} is gone (no {path})") from exc
    except OSError as exc:
        raise unreadable(f"cannot read {path}: {exc}") from exc


def read_process_cgroup(pid: int, *, proc_root: Path) -> ProcessCgroup:
    """Read and parse ``<proc_root>/<pid>/cgroup``.

    Raises :class:`ProcessGoneError` when the process no longer exists and
    :class:`CgroupFormatError` when the file is unreadable or malformed.
    """
    path = proc_root / str(pid) / "cgroup"
    text = read_proc_text(path, pid=pid, unreadable=CgroupFormatError)
    try:
        return parse_cgroup_file(text)
    except CgroupFormatError as exc:
        raise CgroupFormatError(f"{path}: {exc}") from exc


def read_command(pid: int, *, proc_root: Path, limit: int = 120) -> str:
    """The command line of ``pid`` for display (``python train.py``), or ``""``."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    text = " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_id(cid: str, length: int = 12) -> str:
    """The first 12 hex digits, as ``crictl ps`` and ``docker ps`` show them."""
    return cid[:length]


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
