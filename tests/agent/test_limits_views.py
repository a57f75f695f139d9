"""mgctl shows each container's limits and whether the node enforces each (issue 28, item 4).

The limits are :mod:`plugin.api.limits`' (the one formula); whether each holds is the
device plugin's word through its board (``Snapshot.mps``): only a supervised MPS
daemon enforces, at allocation; elsewhere a limit is advice.
"""

from __future__ import annotations

from typing import Any

import pytest

from plugin.agent import mgctl
from plugin.agent.accounting import Allocation, Snapshot, build_snapshot
from plugin.agent.identity import Caller
from plugin.agent.views import device_list, process_list
from plugin.api.limits import memory_limit_mib, share_percent
from plugin.gpu.mps import MpsNode, MpsStatus
from tests.agent.builders import gpu, gpu_uuid, index_of, key, pod, reading, ref

R = "cnvrg.io/metagpu"
U0 = gpu_uuid(0)
NODE = Caller(pid=1, uid=0, scope="node", container=None, via="host root")
SUPERVISED = MpsNode(mode="supervised", status=MpsStatus(state="up", restarts=1))


def with_policy(the_pod: dict[str, Any], policy: str) -> dict[str, Any]:
    the_pod["metadata"]["annotations"] = {"metagpu.io/compute-policy": policy}
    return the_pod


def snapshot(mps: MpsNode) -> Snapshot:
    """``a`` fixed with 25 units, ``b`` balance with 50, on one 80 GiB GPU."""
    a = ref("a")
    return build_snapshot(
        [reading(gpu(0), [(101, 4000)])],
        [
            Allocation(key("a"), R, tuple(f"{U0}::{u}" for u in range(25))),
            Allocation(key("b"), R, tuple(f"{U0}::{u}" for u in range(25, 75))),
        ],
        {101: a.container_id},
        directory=index_of(with_policy(pod("a"), "fixed"), with_policy(pod("b"), "balance")),
        units_per_gpu=100,
        gpu_resources={U0: R},
        resources=[R],
        taken_at=1_700_000_000,
        mps=mps,
    )


def caller(name: str) -> Caller:
    return Caller(pid=1, uid=1000, scope="container", container=ref(name), via="pod container")


@pytest.mark.parametrize(
    ("mps", "enforced", "words"),
    [
        pytest.param(SUPERVISED, True, "mem enforced, sm 25% enforced", id="supervised"),
        pytest.param(MpsNode(), False, "mem advisory, sm 25% advisory", id="time-sliced"),
        pytest.param(
            MpsNode(mode="unsupervised"), False, "mem advisory, sm 25% advisory", id="unsupervised"
        ),
    ],
)
def test_a_container_sees_its_limits_and_whether_each_holds(
    mps: MpsNode, enforced: bool, words: str
) -> None:
    doc = device_list(snapshot(mps), caller("a"), node="n")
    share = doc["items"][0]["share"]
    assert share["computePolicy"] == "fixed"
    limits = share["limits"]
    # the one formula: the same numbers the plugin hands the container
    assert limits["memory"]["mib"] == memory_limit_mib(
        25, units_per_gpu=100, memory_total_mib=81920
    )
    assert limits["sm"]["percent"] == share_percent(25, 100) == 25
    assert limits["memory"]["enforced"] is limits["sm"]["enforced"] is enforced
    assert ("advisory" in limits["memory"]["by"]) is not enforced
    text = mgctl.render_devices(doc)
    assert words in text
    processes = process_list(snapshot(mps), caller("a"), node="n", command=lambda _: "py")
    assert processes["items"][0]["limits"] == limits


def test_the_node_view_says_the_daemon_state_and_each_shares_limits() -> None:
    doc = device_list(snapshot(SUPERVISED), NODE, node="n")
    assert doc["mps"]["mode"] == "supervised"
    assert doc["mps"]["enforces"] == ["memory", "fixed"]
    assert doc["mps"]["daemon"]["state"] == "up"
    text = mgctl.render_devices(doc)
    assert "MPS: supervised daemon up (1 restart(s)): enforces memory, fixed" in text
    assert "mem enforced, sm 25% enforced" in text
    assert "mem enforced, sm no cap" in text  # balance: memory only

    down = MpsNode(
        mode="supervised",
        status=MpsStatus(state="down", reason="MPS control daemon not answering", restarts=2),
    )
    text = mgctl.render_devices(device_list(snapshot(down), NODE, node="n"))
    assert "MPS: supervised daemon down (2 restart(s))" in text
    assert "MPS control daemon not answering" in text


def test_a_node_without_mps_adds_no_line_and_calls_every_limit_advice() -> None:
    doc = device_list(snapshot(MpsNode()), NODE, node="n")
    assert doc["mps"] == {"mode": "off", "enforces": []}
    text = mgctl.render_devices(doc)
    assert "MPS:" not in text
    assert "mem advisory, sm no cap" in text
