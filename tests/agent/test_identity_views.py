"""Caller identification from (pid, uid) and what each scope gets to see (no sockets here;
``test_api.py`` does the same over a real unix socket with SO_PEERCRED)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin.agent.accounting import Allocation, Snapshot, build_snapshot
from plugin.agent.containers import PodIndex
from plugin.agent.identity import Caller, CallerRefusedError, identify
from plugin.agent.views import (
    KillNotAllowedError,
    NotAGpuProcessError,
    authorize_kill,
    device_list,
    process_list,
)
from tests.agent.builders import (
    container_id,
    gpu,
    gpu_uuid,
    index_of,
    key,
    place_in_container,
    place_on_host,
    pod,
    reading,
    ref,
)

R = "cnvrg.io/metagpu"
U0 = gpu_uuid(0)


@pytest.fixture
def index() -> PodIndex:
    return index_of(pod("a"), pod("b"))


def who(pid: int, uid: int, proc_root: Path, index: PodIndex, **kw: object) -> Caller:
    return identify(
        pid,
        uid,
        proc_root=proc_root,
        lookup=index.lookup,
        agent_cgroup=kw.get("agent_cgroup"),  # type: ignore[arg-type]
        node_name="node-a",
        pods_problem=kw.get("pods_problem"),  # type: ignore[arg-type]
    )


def test_container_caller(tmp_path: Path, index: PodIndex) -> None:
    place_in_container(tmp_path, 500, ref("a"))
    caller = who(500, 1000, tmp_path, index)
    assert caller.scope == "container"
    assert caller.container == ref("a")
    assert caller.describe() == "pod ml/a container main (PID 500)"


def test_host_root_sees_the_node(tmp_path: Path, index: PodIndex) -> None:
    place_on_host(tmp_path, 600)
    caller = who(600, 0, tmp_path, index)
    assert caller.scope == "node"
    assert caller.via == "host root"


def test_a_host_process_of_the_agents_own_user_sees_the_node(
    tmp_path: Path, index: PodIndex
) -> None:
    # metagpu dev on a workstation runs the agent as the developer: that user can
    # read and signal the agent anyway. Any other non-root user stays refused, and
    # the same UID inside a pod's container keeps container scope.
    place_on_host(tmp_path, 610)
    kw = {"proc_root": tmp_path, "lookup": index.lookup, "agent_cgroup": None}
    caller = identify(610, 1000, node_name="node-a", agent_uid=1000, **kw)  # type: ignore[arg-type]
    assert (caller.scope, caller.via) == ("node", "the agent's user")
    with pytest.raises(CallerRefusedError, match="host process running as UID 1001"):
        identify(610, 1001, node_name="node-a", agent_uid=1000, **kw)  # type: ignore[arg-type]
    place_in_container(tmp_path, 611, ref("a"))
    inside = identify(611, 1000, node_name="node-a", agent_uid=1000, **kw)  # type: ignore[arg-type]
    assert inside.scope == "container"


def test_agent_container_root_sees_the_node(tmp_path: Path, index: PodIndex) -> None:
    agent = container_id("metagpu/agent")
    agent_cgroup = f"/kubepods/besteffort/pod1/{agent}"
    (tmp_path / "700").mkdir()
    (tmp_path / "700" / "cgroup").write_text(f"0::{agent_cgroup}\n")
    caller = who(700, 0, tmp_path, index, agent_cgroup=agent_cgroup)
    assert caller.scope == "node"
    assert caller.via == "agent container"
    with pytest.raises(CallerRefusedError):  # same container, not root
        who(700, 1000, tmp_path, index, agent_cgroup=agent_cgroup)


def test_a_sub_cgroup_named_after_the_agent_container_is_not_the_agent(
    tmp_path: Path, index: PodIndex
) -> None:
    # Root in some other container creates a sub-cgroup named after the agent's
    # container ID; with no outer container known, the innermost ID is picked. It
    # must not get the agent container's node scope: only the very cgroup does.
    agent = container_id("metagpu/agent")
    stranger = container_id("elsewhere/x")
    (tmp_path / "701").mkdir()
    (tmp_path / "701" / "cgroup").write_text(f"0::/kubepods/besteffort/pod9/{stranger}/{agent}\n")
    with pytest.raises(CallerRefusedError, match="not a container of any pod on node node-a"):
        who(701, 0, tmp_path, index, agent_cgroup=f"/kubepods/besteffort/pod1/{agent}")


@pytest.mark.parametrize(
    ("setup", "pid", "uid", "message"),
    [
        pytest.param("host", 600, 1000, "host process running as UID 1000", id="host-non-root"),
        pytest.param("none", 601, 0, "exited before it could be identified", id="gone"),
        pytest.param(
            "stranger", 602, 0, "not a container of any pod on node node-a", id="unknown-ctr"
        ),
        pytest.param("none", 0, 0, "must run with hostPID", id="pid-zero"),
        pytest.param("garbage", 603, 0, "cannot tell which container PID 603", id="bad-cgroup"),
        pytest.param(
            "pod-level", 604, 0, "runs in a pod's cgroup", id="root-in-pod-without-container-id"
        ),
        pytest.param(
            "odd-runtime", 605, 0, "its container cannot be identified", id="root-unknown-runtime"
        ),
    ],
)
def test_refused(
    tmp_path: Path, index: PodIndex, *, setup: str, pid: int, uid: int, message: str
) -> None:
    if setup == "host":
        place_on_host(tmp_path, pid)
    elif setup == "stranger":
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::/system.slice/docker-{'e' * 64}.scope\n")
    elif setup == "garbage":
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text("nope")
    elif setup == "pod-level":  # root in a pod's cgroup, not in any container's
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            "kubepods-besteffort-pod0a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice\n"
        )
    elif setup == "odd-runtime":  # a runtime whose scope naming we do not parse
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(
            f"0::/kubepods/burstable/pod0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/sandbox-{'f' * 40}\n"
        )
    with pytest.raises(CallerRefusedError) as err:
        who(pid, uid, tmp_path, index)
    assert message in str(err.value)


def test_refusal_names_why_the_pod_list_is_incomplete(tmp_path: Path) -> None:
    place_in_container(tmp_path, 500, ref("a"))
    with pytest.raises(CallerRefusedError, match="pod list is incomplete: 403 Forbidden"):
        who(500, 0, tmp_path, PodIndex(), pods_problem="403 Forbidden")


# ------------------------------------------------------------------- views
def two_tenants(index: PodIndex) -> Snapshot:
    a, b = ref("a"), ref("b")
    return build_snapshot(
        [reading(gpu(0), [(101, 4000), (201, 9000), (900, 100)]), reading(gpu(1), [(202, 5)])],
        [
            Allocation(key("a"), R, tuple(f"{U0}::{u}" for u in range(25))),
            Allocation(key("b"), R, tuple(f"{U0}::{u}" for u in range(25, 75))),
        ],
        {101: a.container_id, 201: b.container_id, 202: b.container_id, 900: None},
        directory=index,
        units_per_gpu=100,
        gpu_resources={U0: R, gpu_uuid(1): R},
        resources=[R],
        taken_at=1_700_000_000,
    )


def container_caller(name: str) -> Caller:
    return Caller(pid=1, uid=1000, scope="container", container=ref(name), via="pod container")


NODE = Caller(pid=1, uid=0, scope="node", container=None, via="host root")


def test_container_sees_only_its_processes(index: PodIndex) -> None:
    doc = process_list(two_tenants(index), container_caller("a"), node="n", command=lambda _: "py")
    assert [p["pid"] for p in doc["items"]] == [101]
    item = doc["items"][0]
    assert item["units"] == 25
    assert item["memoryLimitMiB"] == 20480
    assert item["sharePercent"] == 25
    assert doc["caller"]["pod"] == "a"
    assert doc["caller"]["scope"] == "container"


def test_node_sees_every_process(index: PodIndex) -> None:
    doc = process_list(two_tenants(index), NODE, node="n", command=lambda _: "")
    assert sorted(p["pid"] for p in doc["items"]) == [101, 201, 202, 900]


def test_container_sees_only_its_share(index: PodIndex) -> None:
    doc = device_list(two_tenants(index), container_caller("a"), node="n")
    (item,) = doc["items"]
    assert item["uuid"] == U0
    assert item["share"]["units"] == 25
    # nothing about the GPU as a whole or about tenant b
    assert "memoryUsedMiB" not in item
    assert "shares" not in item
    assert "unitsAllocated" not in item
    assert "9000" not in str(doc)
    assert "/b/" not in str(doc)


def test_node_sees_every_share(index: PodIndex) -> None:
    doc = device_list(two_tenants(index), NODE, node="n")
    g0 = doc["items"][0]
    assert g0["unitsAllocated"] == 75
    assert g0["unitsFree"] == 25
    assert g0["processes"] == 3
    assert [s["pod"] for s in g0["shares"]] == ["a", "b"]


def test_kill_authorization(index: PodIndex) -> None:
    snap = two_tenants(index)
    assert authorize_kill(snap, container_caller("a"), 101).pid == 101
    with pytest.raises(KillNotAllowedError, match="not a GPU process of your container"):
        authorize_kill(snap, container_caller("a"), 201)  # b's process
    with pytest.raises(KillNotAllowedError, match="not a GPU process of your container"):
        authorize_kill(snap, container_caller("a"), 4242)  # no such PID: same answer
    assert authorize_kill(snap, NODE, 900).pid == 900
    with pytest.raises(NotAGpuProcessError, match="PID 4242 is not a GPU process"):
        authorize_kill(snap, NODE, 4242)
