"""Two quota mirror replicas against one API server: one leads and writes, the other takes over
when the first stops (at once, it released the Lease), crashes (after the Lease expires) or
loses the API server (only after the first has stepped down). Never two writers."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.harness.kube_api import FakeKubeApi, running_kube_api
from tests.webhook.quotas.builders import for_put, quota
from tests.webhook.quotas.harness import (
    FAST,
    LEASE,
    LEASE_NAMESPACE,
    Leadership,
    assert_one_writer,
    mirror_instance,
    quota_writes,
    stop,
    write_kubeconfig,
)
from tests.webhook.waiting import eventually
from webhook.quotas.leader import MICRO_TIME, LeaseTiming

RQ = ("v1", "ResourceQuota")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[FakeKubeApi, Path]]:
    async with running_kube_api(FakeKubeApi(garbage_collector=False)) as (api, url):
        yield api, write_kubeconfig(url, tmp_path / "kubeconfig")


def lease(api: FakeKubeApi) -> dict[str, object]:
    obj = api.get("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NAMESPACE)
    assert obj is not None
    spec: dict[str, object] = obj["spec"]
    return spec


def holder(api: FakeKubeApi) -> object:
    obj = api.get("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NAMESPACE)
    return None if obj is None else obj["spec"].get("holderIdentity")


def mirrored(api: FakeKubeApi, name: str) -> bool:
    return api.get(*RQ, f"{name}-metagpu", "team-a") is not None


async def test_one_leads_and_the_other_takes_over_at_once_after_a_clean_stop(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    leadership = Leadership()
    async with (
        mirror_instance(kubeconfig, "a", leadership) as a,
        mirror_instance(kubeconfig, "b", leadership) as b,
    ):
        await eventually(lambda: len(leadership.leaders()) == 1)
        [first] = leadership.leaders()
        leader, follower = (a, b) if first == "a" else (b, a)
        assert holder(api) == first
        spec = lease(api)
        assert spec["leaseDurationSeconds"] == FAST.lease_duration_s
        dt.datetime.strptime(str(spec["renewTime"]), MICRO_TIME)  # MicroTime, as upstream

        api.put(for_put(quota("one", {"requests.nvidia.com/gpu": "1"})))
        await eventually(lambda: mirrored(api, "one"))
        assert {w.user_agent for w in quota_writes(api)} == {first}

        loop = asyncio.get_running_loop()
        stopped = loop.time()
        await stop(leader)
        assert lease(api)["holderIdentity"] == ""  # released
        await eventually(lambda: leadership.leaders() == {follower.identity})
        # Released, so no wait for the Lease to expire.
        assert loop.time() - stopped < FAST.lease_duration_s
        assert lease(api)["leaseTransitions"] == 1

        api.put(for_put(quota("two", {"requests.nvidia.com/gpu": "1"})))
        await eventually(lambda: mirrored(api, "two"))
    assert_one_writer(api, leadership)
    assert {w.user_agent for w in quota_writes(api) if w.path.endswith("quotas")} == {"a", "b"}


async def test_a_crashed_leader_is_replaced_only_after_its_lease_expires(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    leadership = Leadership()
    async with mirror_instance(kubeconfig, "a", leadership, release_on_cancel=False) as a:
        await eventually(lambda: leadership.leaders() == {"a"})
        async with mirror_instance(kubeconfig, "b", leadership):
            await eventually(lambda: any(r.user_agent == "b" for r in api.requests))
            await stop(a)  # no release: as if the process were killed
            assert holder(api) == "a"
            await eventually(lambda: leadership.leaders() == {"b"}, timeout_s=10)
            api.put(for_put(quota("after", {"requests.nvidia.com/gpu": "1"})))
            await eventually(lambda: mirrored(api, "after"))
    assert _taken(api, "b") - _last_lease_write(api, "a") >= FAST.lease_duration_s
    assert_one_writer(api, leadership)


async def test_a_leader_cut_off_from_the_api_steps_down_before_another_takes_over(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    leadership = Leadership()
    async with mirror_instance(kubeconfig, "a", leadership):
        await eventually(lambda: leadership.leaders() == {"a"})
        async with mirror_instance(kubeconfig, "b", leadership):
            await eventually(lambda: any(r.user_agent == "b" for r in api.requests))
            # "a" can still write quotas, but its Lease requests fail from now on.
            for verb in ("get", "update"):
                api.fail_next(
                    verb,
                    "leases",
                    status=503,
                    reason="ServiceUnavailable",
                    message="etcd leader changed",
                    times=None,
                    user_agent="a",
                )
            await eventually(lambda: leadership.leaders() == {"b"}, timeout_s=10)
            order = [(who, leading) for who, leading, _ in leadership.changes]
            api.heal()
            api.put(for_put(quota("later", {"requests.nvidia.com/gpu": "1"})))
            await eventually(lambda: mirrored(api, "later"))
    # "a" stepped down on its own (it still runs); "b" waited for the whole Lease
    # after the last renewal "a" got through, and "a" was gone before "b" began.
    assert order == [
        ("a", True),
        ("a", False),
        ("b", True),
    ]
    assert _taken(api, "b") - _last_lease_write(api, "a") >= FAST.lease_duration_s
    assert_one_writer(api, leadership)


def _lease_writes(api: FakeKubeApi, who: str) -> list[float]:
    return [
        r.at
        for r in api.requests
        if r.resource == "leases"
        and r.user_agent == who
        and r.verb in ("create", "update")
        and r.status in (200, 201)
    ]


def _last_lease_write(api: FakeKubeApi, who: str) -> float:
    return max(_lease_writes(api, who))


def _taken(api: FakeKubeApi, who: str) -> float:
    return min(_lease_writes(api, who))


async def test_never_two_writers_under_churn(cluster: tuple[FakeKubeApi, Path]) -> None:
    api, kubeconfig = cluster
    leadership = Leadership()
    async with (
        mirror_instance(kubeconfig, "a", leadership) as a,
        mirror_instance(kubeconfig, "b", leadership),
        mirror_instance(kubeconfig, "c", leadership),
    ):
        for i in range(20):
            api.put(for_put(quota(f"q{i}", {"requests.nvidia.com/gpu": str(i % 3 + 1)})))
            if i == 10 and "a" in leadership.leaders():
                await stop(a)
            await asyncio.sleep(0)  # let the writers run between changes (no timing assumed)
        await eventually(lambda: all(mirrored(api, f"q{i}") for i in range(20)))
    assert_one_writer(api, leadership)


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        pytest.param({"lease_duration_s": 1, "renew_deadline_s": 1}, "greater than", id="renew"),
        pytest.param({"renew_deadline_s": 2, "retry_period_s": 2}, "1.2", id="retry"),
    ],
)
def test_timings_client_go_would_refuse_are_refused(timing: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeaseTiming(**timing)  # type: ignore[arg-type]
