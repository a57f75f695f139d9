"""The ledger and its assume cache (pure): reports, assumptions, expiry, restarts."""

from __future__ import annotations

from plugin.api.scheduling import ContainerAssignment, PodAssignment
from plugin.extender.ledger import Assumption, Ledger, NodeView, rfc3339
from tests.extender.builders import RESOURCE, ledger


def free(led: Ledger, node: str) -> list[int]:
    view = led.view(node)
    assert isinstance(view, NodeView), view
    return [g.free for g in view.gpus]


def assignment(node: str, gpus: dict[str, int], *, at: float) -> str:
    return PodAssignment(
        node=node,
        containers=(ContainerAssignment(container="c", units=sum(gpus.values()), gpus=gpus),),
        taken=gpus,
        assigned_at=rfc3339(at),
    ).model_dump_json()


def test_an_assumption_holds_until_the_node_reports_the_pod_late() -> None:
    led = Ledger(resource=RESOURCE)
    led.set_node("a", ledger([0, 0], node="a").model_dump_json())
    led.assume(Assumption("u1", "ns", "p", "a", {"GPU-a-0": 70}, expires_at=100))
    assert free(led, "a") == [30, 100]
    # An unrelated report (the kubelet has not admitted u1 yet): still assumed.
    led.set_node("a", ledger([0, 20], node="a").model_dump_json())
    assert free(led, "a") == [30, 80]
    # The report arrives: the units are counted once, from the report.
    reported = ledger([70, 20], node="a", holder_uids=["u1", "a-holder-1"])
    led.set_node("a", reported.model_dump_json())
    assert free(led, "a") == [30, 80]
    assert led.assumption("u1") is None


def test_assumptions_expire_and_are_dropped_with_their_pod() -> None:
    led = Ledger(resource=RESOURCE)
    led.set_node("a", ledger([0], node="a").model_dump_json())
    led.assume(Assumption("u1", "ns", "p", "a", {"GPU-a-0": 30}, expires_at=10))
    led.assume(Assumption("u2", "ns", "q", "a", {"GPU-a-0": 30}, expires_at=20))
    assert free(led, "a") == [40]
    assert [a.pod_uid for a in led.expire(now=15)] == ["u1"]
    assert free(led, "a") == [70]
    led.pod_gone("u2")
    assert free(led, "a") == [100]


def test_a_restart_rebuilds_from_ledgers_and_assigned_pods_without_double_booking() -> None:
    # Before the restart: u1 reported by the node, u2 bound but not reported yet.
    node = ledger([70, 0], node="a", holder_uids=["u1", "x"]).model_dump_json()
    pods = [
        ("u1", "a", assignment("a", {"GPU-a-0": 70}, at=1000)),
        ("u2", "a", assignment("a", {"GPU-a-1": 50}, at=1000)),
        # a bind that failed half-way left an annotation naming a node the pod is not on
        ("u3", None, assignment("a", {"GPU-a-1": 40}, at=1000)),
    ]
    for order in ("nodes first", "pods first"):
        led = Ledger(resource=RESOURCE)
        if order == "nodes first":
            led.set_node("a", node)
        for uid, bound_to, text in pods:
            led.observe_pod(
                pod_uid=uid,
                namespace="ns",
                pod=uid,
                node_name=bound_to,
                phase="Pending",
                annotation=text,
                now=1010,
                ttl_s=300,
            )
        if order == "pods first":
            led.set_node("a", node)
        assert free(led, "a") == [30, 50], order
        assert {a.pod_uid for a in led.assumed()} == {"u2"}, order


def test_a_settled_pod_is_never_assumed_again() -> None:
    led = Ledger(resource=RESOURCE)
    text = assignment("a", {"GPU-a-0": 70}, at=1000)
    led.set_node("a", ledger([70], node="a", holder_uids=["u1"]).model_dump_json())
    # The pod ends: the ledger drops it first, then a late pod update arrives.
    led.set_node("a", ledger([0], node="a").model_dump_json())
    led.observe_pod(
        pod_uid="u1",
        namespace="ns",
        pod="p",
        node_name="a",
        phase="Running",
        annotation=text,
        now=1010,
        ttl_s=300,
    )
    assert free(led, "a") == [100]


def test_old_assignments_are_not_assumed_after_a_restart() -> None:
    led = Ledger(resource=RESOURCE)
    led.set_node("a", ledger([0], node="a").model_dump_json())
    led.observe_pod(
        pod_uid="u1",
        namespace="ns",
        pod="p",
        node_name="a",
        phase="Pending",
        annotation=assignment("a", {"GPU-a-0": 70}, at=1000),
        now=1400,
        ttl_s=300,
    )
    assert free(led, "a") == [100]


def test_ended_pods_drop_their_reservation() -> None:
    led = Ledger(resource=RESOURCE)
    led.set_node("a", ledger([0], node="a").model_dump_json())
    led.assume(Assumption("u1", "ns", "p", "a", {"GPU-a-0": 30}, expires_at=1e12))
    led.observe_pod(
        pod_uid="u1",
        namespace="ns",
        pod="p",
        node_name="a",
        phase="Failed",
        annotation=None,
        now=0,
        ttl_s=300,
    )
    assert free(led, "a") == [100]


def test_a_missing_or_deleted_node_has_a_reason() -> None:
    led = Ledger(resource=RESOURCE)
    assert "has not reported" in str(led.view("a"))
    led.set_node("a", ledger([0], node="a").model_dump_json())
    led.assume(Assumption("u1", "ns", "p", "a", {"GPU-a-0": 30}, expires_at=1e12))
    led.drop_node("a")
    assert isinstance(led.view("a"), str)
    assert led.assumption("u1") is None


def test_reports_are_kept_as_plain_data_not_as_parsed_models() -> None:
    """The collector walks every container object a long-lived process keeps: a parsed
    NodeLedger per node (about 60 of them) made its full passes 30-40 ms at 1,000
    nodes. The ledger keeps tuples instead, and its views answer the same."""
    import gc

    from plugin.api.scheduling import GpuHolder, GpuLedgerEntry
    from plugin.api.scheduling import NodeLedger as ParsedLedger

    def models() -> int:
        gc.collect()
        kinds = (ParsedLedger, GpuLedgerEntry, GpuHolder)
        return sum(1 for o in gc.get_objects() if isinstance(o, kinds))

    reports = [ledger([10 * i % 100, 0, 50], node=f"n{i}").model_dump_json() for i in range(50)]
    before = models()
    led = Ledger(resource=RESOURCE)
    for i, report in enumerate(reports):
        led.set_node(f"n{i}", report)
    assert [free(led, f"n{i}") for i in (0, 3)] == [[100, 100, 50], [70, 100, 50]]
    assert models() == before
    # and a heartbeat with the same report is not parsed again
    led.set_node("n3", reports[3])
    assert free(led, "n3") == [70, 100, 50]


def test_a_ledger_its_agent_stopped_refreshing_is_no_longer_trusted() -> None:
    """An agent that promises (metagpu.io/gpu-ledger-refresh-s) to rewrite its ledger every
    300 s and misses three rewrites is down or cut off: its GPUs and holders may be gone,
    so the node offers nothing, with the reason, until a rewrite arrives. A ledger without
    the promise (an agent of an earlier release) is trusted however old."""
    led = Ledger(resource=RESOURCE)
    at = 1_800_000_000.0
    text = ledger([40, 0], node="a").model_copy(update={"observed_at": rfc3339(at)})
    led.set_node("a", text.model_dump_json(), refresh_s=300)
    old = ledger([40, 0], node="b").model_copy(update={"observed_at": rfc3339(at - 86400)})
    led.set_node("b", old.model_dump_json())
    assert led.mark_stale(at + 900) == []
    assert free(led, "a") == [60, 100]
    assert led.mark_stale(at + 901) == ["a"]
    why = led.view("a")
    assert isinstance(why, str)
    assert "has not refreshed this node's GPU ledger for 901s" in why
    assert "every 300s" in why
    assert led.view_for("a", pod_uid="p", priority=1000) == why
    assert led.mark_stale(at + 2000) == []  # marked once
    assert isinstance(led.view("b"), NodeView)  # no promise: trusted however old
    fresh = text.model_copy(update={"observed_at": rfc3339(at + 1950)})
    led.set_node("a", fresh.model_dump_json(), refresh_s=300)
    assert free(led, "a") == [60, 100]
    assert led.mark_stale(at + 2000) == []
