"""Builders for the agent tests: GPUs, pods, cgroup files, containers (after NVIDIA's
``resource-testing.go``: small functions that make valid objects with defaults)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from plugin.agent.accounting import GpuReading
from plugin.agent.cgroups import ContainerId
from plugin.agent.containers import ContainerKey, ContainerRef, PodIndex
from plugin.gpu.backend import GpuInfo, GpuProcess, GpuUsage

A100 = "NVIDIA A100-SXM4-80GB"


def gpu_uuid(index: int) -> str:
    return f"GPU-0b8a5e3c-1f6e-4a53-9c1e-2d7b8f1a0c{index:02d}"


def gpu(index: int = 0, *, memory_mib: int = 81920, name: str = A100, **kw: Any) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=gpu_uuid(index),
        name=name,
        memory_mib=memory_mib,
        minor_number=index,
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
        numa_node=0,
        **kw,
    )


def reading(
    info: GpuInfo,
    processes: list[tuple[int, int]] | None = None,
    *,
    util: int | None = 40,
    reserved_mib: int = 0,
) -> GpuReading:
    procs = tuple(GpuProcess(pid=p, used_memory_mib=m) for p, m in (processes or []))
    used = reserved_mib + sum(m for _, m in (processes or []))
    return GpuReading(
        info=info,
        usage=GpuUsage(
            memory_used_mib=used, memory_total_mib=info.memory_mib, utilization_percent=util
        ),
        processes=procs,
    )


def container_id(name: str) -> ContainerId:
    """A stable 64-hex container ID derived from a readable name."""
    return ContainerId(hashlib.sha256(name.encode()).hexdigest())


def pod_uid(name: str) -> str:
    h = hashlib.md5(name.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def pod(
    name: str,
    *,
    namespace: str = "ml",
    node: str = "node-a",
    containers: tuple[str, ...] = ("main",),
    runtime: str = "containerd",
    init: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A running pod as the API server returns it (the fields the agent reads and a few more)."""

    def status(cname: str) -> dict[str, Any]:
        return {
            "name": cname,
            "containerID": f"{runtime}://{container_id(f'{namespace}/{name}/{cname}')}",
            "ready": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        }

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": pod_uid(f"{namespace}/{name}")},
        "spec": {"nodeName": node, "containers": [{"name": c, "image": "x"} for c in containers]},
        "status": {
            "phase": "Running",
            "containerStatuses": [status(c) for c in containers],
            "initContainerStatuses": [status(c) for c in init],
        },
    }


def key(pod_name: str, container: str = "main", namespace: str = "ml") -> ContainerKey:
    return ContainerKey(namespace, pod_name, container)


def ref(pod_name: str, container: str = "main", namespace: str = "ml") -> ContainerRef:
    return ContainerRef(
        key=key(pod_name, container, namespace),
        container_id=container_id(f"{namespace}/{pod_name}/{container}"),
        pod_uid=pod_uid(f"{namespace}/{pod_name}"),
    )


def index_of(*pods: dict[str, Any]) -> PodIndex:
    index = PodIndex()
    index.replace(pods)
    return index


def cgroup_line(cid: str, uid: str) -> str:
    """A cgroup v2 file for a containerd (systemd driver) container."""
    uid_ = uid.replace("-", "_")
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope\n"
    )


def stat_line(pid: int, *, state: str = "S", start_ticks: int = 4242) -> str:
    """A ``/proc/<pid>/stat`` line (52 fields; the command name has a space and a ``)``)."""
    rest = ["0"] * 49
    rest[18] = str(start_ticks)  # field 22
    return f"{pid} (py thon) x) {state} " + " ".join(rest) + "\n"


def _process_dir(proc_root: Path, pid: int) -> Path:
    """``<proc_root>/<pid>``, with a ``stat`` file: the real process's when it runs here
    (so its start time is right for the start-time pin), else a made-up one."""
    d = proc_root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        stat = stat_line(pid)
    (d / "stat").write_text(stat)
    return d


def place_in_container(proc_root: Path, pid: int, cref: ContainerRef) -> None:
    """Write ``<proc_root>/<pid>/cgroup`` so the agent sees ``pid`` in ``cref``'s container."""
    d = _process_dir(proc_root, pid)
    (d / "cgroup").write_text(cgroup_line(cref.container_id, cref.pod_uid))


def place_on_host(proc_root: Path, pid: int) -> None:
    d = _process_dir(proc_root, pid)
    (d / "cgroup").write_text("0::/user.slice/user-0.slice/session-1.scope\n")


BOOT_ID = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
"""The boot ID a fake procfs reports (:func:`fake_boot`)."""


def fake_boot(proc_root: Path, boot_id: str = BOOT_ID) -> None:
    """``<proc_root>/sys/kernel/random/boot_id``, as the agent reads it."""
    path = proc_root / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")


def mirror_this_process(proc_root: Path) -> None:
    """Make a fake procfs show this test process as it really is (its boot ID and
    its ``stat``), so a health board that an in-process device plugin stamped is
    current for an agent reading that procfs."""
    fake_boot(proc_root, Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    _process_dir(proc_root, os.getpid())
