"""``/proc/<pid>/cgroup`` → container, with the file shapes real nodes produce.

Every sample is a whole file as the kernel prints it (cgroup v1 lists one line
per hierarchy, v2 one ``0::`` line, hybrid both), for each runtime and cgroup
driver the agent supports, plus host processes that must never be taken for
containers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugin.agent.cgroups import (
    CgroupFormatError,
    ContainerId,
    ProcessCgroup,
    ProcessGoneError,
    parse_cgroup_file,
    parse_runtime_container_id,
    pick_container,
    read_command,
    read_process_cgroup,
)

CID = "4f6c3d1e9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d"
CID2 = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"
UID = "7e1c2d3a-4b5c-4d6e-8f90-a1b2c3d4e5f6"
UID_ = UID.replace("-", "_")

V1_CGROUPFS_CONTAINERD = f"""\
12:hugetlb:/kubepods/burstable/pod{UID}/{CID}
11:memory:/kubepods/burstable/pod{UID}/{CID}
10:pids:/kubepods/burstable/pod{UID}/{CID}
9:cpuset:/kubepods/burstable/pod{UID}/{CID}
8:devices:/kubepods/burstable/pod{UID}/{CID}
7:net_cls,net_prio:/kubepods/burstable/pod{UID}/{CID}
6:freezer:/kubepods/burstable/pod{UID}/{CID}
5:blkio:/kubepods/burstable/pod{UID}/{CID}
4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}
3:perf_event:/kubepods/burstable/pod{UID}/{CID}
2:rdma:/
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""

V1_SYSTEMD_CONTAINERD = f"""\
12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
11:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
10:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
"""

V2_SYSTEMD_CONTAINERD = (
    "0::/kubepods.slice/kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
)
V2_SYSTEMD_GUARANTEED = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
V2_CGROUPFS_CONTAINERD = f"0::/kubepods/besteffort/pod{UID}/{CID}\n"
V2_CGROUPFS_GUARANTEED = f"0::/kubepods/pod{UID}/{CID}\n"
V2_CRIO = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n"
)
V2_CRIO_CONMON = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope\n"
)
V1_CRIO_CGROUPFS = f"""\
11:memory:/kubepods/burstable/pod{UID}/crio-{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/crio-{CID}
"""
V2_DOCKER_SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope\n"
)
V1_DOCKER_PLAIN = f"""\
12:memory:/docker/{CID}
11:cpu,cpuacct:/docker/{CID}
1:name=systemd:/docker/{CID}
"""
V2_DOCKER_PLAIN = f"0::/system.slice/docker-{CID}.scope\n"
V2_KIND_NESTED = (
    f"0::/system.slice/docker-{CID2}.scope/kubelet.slice/kubelet-kubepods.slice/"
    f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/"
    f"cri-containerd-{CID}.scope\n"
)
V2_CGROUPNS_RELATIVE = f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
V2_PODMAN = f"0::/machine.slice/libpod-{CID}.scope/container\n"
HYBRID_V2_LINE_EMPTY = f"""\
12:memory:/kubepods/besteffort/pod{UID}/{CID}
1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}
0::/
"""

HOST_V2_SERVICE = "0::/system.slice/containerd.service\n"
HOST_V2_INIT = "0::/init.scope\n"
HOST_V2_SESSION = "0::/user.slice/user-1000.slice/session-3.scope\n"
HOST_V1 = """\
12:memory:/system.slice/kubelet.service
1:name=systemd:/system.slice/kubelet.service
0::/system.slice/kubelet.service
"""
HOST_V1_ROOT = "12:memory:/\n1:name=systemd:/init.scope\n0::/\n"
KUBEPODS_POD_LEVEL = (
    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice\n"
)


@pytest.mark.parametrize(
    ("text", "container", "pod_uid"),
    [
        pytest.param(V1_CGROUPFS_CONTAINERD, CID, UID, id="v1-cgroupfs-containerd"),
        pytest.param(V1_SYSTEMD_CONTAINERD, CID, UID, id="v1-systemd-containerd"),
        pytest.param(V2_SYSTEMD_CONTAINERD, CID, UID, id="v2-systemd-containerd-besteffort"),
        pytest.param(V2_SYSTEMD_GUARANTEED, CID, UID, id="v2-systemd-containerd-guaranteed"),
        pytest.param(V2_CGROUPFS_CONTAINERD, CID, UID, id="v2-cgroupfs-containerd"),
        pytest.param(V2_CGROUPFS_GUARANTEED, CID, UID, id="v2-cgroupfs-guaranteed"),
        pytest.param(V2_CRIO, CID, UID, id="v2-systemd-crio"),
        pytest.param(V1_CRIO_CGROUPFS, CID, UID, id="v1-cgroupfs-crio"),
        pytest.param(V2_DOCKER_SYSTEMD, CID, UID, id="v2-systemd-docker-kubepods"),
        pytest.param(V1_DOCKER_PLAIN, CID, None, id="v1-docker-plain"),
        pytest.param(V2_DOCKER_PLAIN, CID, None, id="v2-docker-plain"),
        pytest.param(V2_KIND_NESTED, CID, UID, id="v2-kind-nested-in-docker"),
        pytest.param(V2_CGROUPNS_RELATIVE, CID, UID, id="v2-cgroup-namespace-relative"),
        pytest.param(V2_PODMAN, CID, None, id="v2-podman-nested-leaf"),
        pytest.param(HYBRID_V2_LINE_EMPTY, CID, UID, id="hybrid-empty-unified-line"),
        pytest.param(V2_CRIO_CONMON, None, UID, id="crio-conmon-is-not-a-container"),
        pytest.param(KUBEPODS_POD_LEVEL, None, UID, id="pod-slice-without-container"),
        pytest.param(HOST_V2_SERVICE, None, None, id="host-v2-service"),
        pytest.param(HOST_V2_INIT, None, None, id="host-v2-init-scope"),
        pytest.param(HOST_V2_SESSION, None, None, id="host-v2-user-session"),
        pytest.param(HOST_V1, None, None, id="host-v1-kubelet"),
        pytest.param(HOST_V1_ROOT, None, None, id="host-v1-root"),
    ],
)
def test_container_from_cgroup_file(text: str, container: str | None, pod_uid: str | None) -> None:
    parsed = parse_cgroup_file(text)
    got = pick_container(parsed, known=lambda _: False)
    assert got == container
    assert parsed.pod_uid == pod_uid
    assert parsed.in_container == (container is not None)


def test_kind_ignores_the_outer_docker_container() -> None:
    # The kind node's own docker scope sits above kubepods; it must not be a candidate.
    assert parse_cgroup_file(V2_KIND_NESTED).candidates == (ContainerId(CID),)


@pytest.mark.parametrize(
    ("path", "known", "expected"),
    [
        pytest.param(
            f"0::/kubepods/besteffort/pod{UID}/{CID}/docker/{CID2}\n",
            {CID},
            CID,
            id="docker-in-docker-inner-unknown-outer-wins",
        ),
        pytest.param(
            f"0::/kubepods/besteffort/pod{UID}/{CID}/cri-containerd-{CID2}.scope\n",
            {CID, CID2},
            CID,
            id="forged-subcgroup-cannot-impersonate-another-container",
        ),
        pytest.param(
            f"0::/kubepods/besteffort/pod{UID}/{CID}/docker/{CID2}\n",
            set(),
            CID2,
            id="none-known-innermost-for-display",
        ),
    ],
)
def test_pick_container_prefers_outermost_known(path: str, known: set[str], expected: str) -> None:
    parsed = parse_cgroup_file(path)
    assert pick_container(parsed, known=lambda c: c in known) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "empty cgroup file", id="empty"),
        pytest.param("garbage\n", "line 1 is not <id>:<controllers>:<path>", id="no-colons"),
        pytest.param("x::/\n", "line 1", id="non-numeric-hierarchy"),
        pytest.param("0::relative\n", "'0::relative'", id="relative-path"),
    ],
)
def test_malformed_cgroup_file(text: str, message: str) -> None:
    with pytest.raises(CgroupFormatError, match=None) as err:
        parse_cgroup_file(text)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(f"containerd://{CID}", CID, id="containerd"),
        pytest.param(f"cri-o://{CID}", CID, id="cri-o"),
        pytest.param(f"docker://{CID}", CID, id="docker"),
        pytest.param(CID.upper(), CID, id="bare-uppercase"),
        pytest.param("", None, id="not-started"),
    ],
)
def test_runtime_container_id(value: str, expected: str | None) -> None:
    assert parse_runtime_container_id(value) == expected


def test_read_process_cgroup_under_proc_root(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(V2_SYSTEMD_CONTAINERD)
    (tmp_path / "42" / "cmdline").write_bytes(b"python\0train.py\0--epochs\x0010\0")
    parsed = read_process_cgroup(42, proc_root=tmp_path)
    assert parsed == ProcessCgroup(
        candidates=(ContainerId(CID),), pod_uid=parsed.pod_uid, path=V2_SYSTEMD_CONTAINERD[3:-1]
    )
    assert read_command(42, proc_root=tmp_path) == "python train.py --epochs 10"
    assert read_command(43, proc_root=tmp_path) == ""


def test_read_process_cgroup_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ProcessGoneError, match="process 7 is gone"):
        read_process_cgroup(7, proc_root=tmp_path)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_text("nonsense")
    with pytest.raises(CgroupFormatError, match=str(tmp_path / "8" / "cgroup")):
        read_process_cgroup(8, proc_root=tmp_path)


def test_real_proc_self_parses() -> None:
    # Whatever this machine is, its own cgroup file must parse.
    parsed = read_process_cgroup(os.getpid(), proc_root=Path("/proc"))
    assert isinstance(parsed, ProcessCgroup)
