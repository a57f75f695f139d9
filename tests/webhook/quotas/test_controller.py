"""The quota mirror against an API server speaking real HTTP+JSON (tests.harness.kube_api),
through the real kubernetes-asyncio client: companions created, updated, repaired and deleted
with their sources, ownership the garbage collector acts on, and a restart that resyncs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plugin.api.permissions import verb_set
from tests.harness.kube_api import FakeKubeApi, running_kube_api
from tests.webhook.quotas.builders import for_put, quota
from tests.webhook.quotas.harness import (
    LEASE,
    Leadership,
    mirror_instance,
    quota_writes,
    write_kubeconfig,
)
from tests.webhook.waiting import eventually
from webhook.permissions import QUOTA_CACHE_PERMISSIONS, quota_mirror_permissions

RQ = ("v1", "ResourceQuota")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[FakeKubeApi, Path]]:
    """A fake API without a garbage collector: what the mirror deletes, it deletes itself."""
    async with running_kube_api(FakeKubeApi(garbage_collector=False)) as (api, url):
        yield api, write_kubeconfig(url, tmp_path / "kubeconfig")


def companion(api: FakeKubeApi, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
    return api.get(*RQ, name, namespace)


def units(api: FakeKubeApi, name: str, namespace: str = "team-a") -> str | None:
    obj = companion(api, name, namespace)
    return None if obj is None else obj["spec"]["hard"].get("requests.cnvrg.io/metagpu")


async def test_companion_follows_create_update_and_delete_of_its_source(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    leadership = Leadership()
    async with mirror_instance(kubeconfig, "a", leadership):
        source = api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
        await eventually(lambda: units(api, "gpus-metagpu") == "100")
        made = companion(api, "gpus-metagpu")
        assert made is not None
        assert made["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "name": "gpus",
                "uid": source["metadata"]["uid"],
                "controller": True,
            }
        ]
        assert made["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "metagpu-quota-mirror"

        source["spec"]["hard"]["requests.nvidia.com/gpu"] = "2500m"
        api.put(source)
        await eventually(lambda: units(api, "gpus-metagpu") == "250")

        api.remove(*RQ, "gpus", "team-a")
        await eventually(lambda: companion(api, "gpus-metagpu") is None)
    [delete] = [r for r in quota_writes(api) if r.verb == "delete"]
    assert delete.body["preconditions"] == {"uid": made["metadata"]["uid"]}


async def test_a_hand_edited_companion_is_put_back(cluster: tuple[FakeKubeApi, Path]) -> None:
    api, kubeconfig = cluster
    async with mirror_instance(kubeconfig, "a", Leadership()):
        api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
        await eventually(lambda: units(api, "gpus-metagpu") == "100")
        edited = companion(api, "gpus-metagpu")
        assert edited is not None
        edited["spec"]["hard"] = {"requests.cnvrg.io/metagpu": "5000"}
        edited["metadata"]["labels"]["team"] = "ml"
        edited["metadata"].pop("ownerReferences")
        api.put(edited)
        await eventually(lambda: units(api, "gpus-metagpu") == "100")
        repaired = companion(api, "gpus-metagpu")
        assert repaired is not None
        assert repaired["metadata"]["ownerReferences"][0]["name"] == "gpus"
        assert repaired["metadata"]["labels"]["team"] == "ml"  # theirs, kept


async def test_quotas_it_must_leave_alone(cluster: tuple[FakeKubeApi, Path]) -> None:
    api, kubeconfig = cluster
    # The operator already set a unit budget here; and a quota about CPU only.
    api.put(
        for_put(
            quota("chosen", {"requests.nvidia.com/gpu": "1", "requests.cnvrg.io/metagpu": "30"})
        )
    )
    api.put(for_put(quota("cpu", {"requests.cpu": "4"})))
    # A quota that is not ours squats on the companion's name: never overwritten.
    api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"}, namespace="team-b")))
    api.put(for_put(quota("gpus-metagpu", {"requests.cnvrg.io/metagpu": "7"}, namespace="team-b")))
    # A sentinel that is mirrored, to know when the first pass is done.
    api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"}, namespace="team-z")))
    async with mirror_instance(kubeconfig, "a", Leadership()):
        await eventually(lambda: companion(api, "gpus-metagpu", "team-z") is not None)
    assert companion(api, "chosen-metagpu") is None
    assert companion(api, "cpu-metagpu") is None
    assert units(api, "gpus-metagpu", "team-b") == "7"
    assert [r.namespace for r in quota_writes(api)] == ["team-z"]


async def test_the_owner_reference_lets_the_garbage_collector_remove_it(
    tmp_path: Path,
) -> None:
    async with running_kube_api(FakeKubeApi(garbage_collector=True)) as (api, url):
        kubeconfig = write_kubeconfig(url, tmp_path / "kubeconfig")
        async with mirror_instance(kubeconfig, "a", Leadership()):
            api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
            await eventually(lambda: companion(api, "gpus-metagpu") is not None)
        # The mirror is gone (uninstalled, scaled to zero): the owner reference alone
        # takes the companion away with its source.
        api.remove(*RQ, "gpus", "team-a")
        assert companion(api, "gpus-metagpu") is None


async def test_a_restarted_mirror_resyncs_what_changed_while_none_ran(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    leadership = Leadership()
    keep = api.put(for_put(quota("keep", {"requests.nvidia.com/gpu": "1"})))
    api.put(for_put(quota("drop", {"requests.nvidia.com/gpu": "1"})))
    api.put(for_put(quota("edit", {"requests.nvidia.com/gpu": "1"})))
    async with mirror_instance(kubeconfig, "first", leadership):
        await eventually(
            lambda: all(units(api, f"{n}-metagpu") == "100" for n in ("keep", "drop", "edit"))
        )
    assert leadership.leaders() == set()
    # While nothing runs: a new source, a deleted one, a changed one, a hand edit.
    api.put(for_put(quota("new", {"requests.nvidia.com/gpu": "3"}, namespace="team-b")))
    api.remove(*RQ, "drop", "team-a")
    edit = api.get(*RQ, "edit", "team-a")
    assert edit is not None
    edit["spec"]["hard"]["requests.nvidia.com/gpu"] = "2"
    api.put(edit)
    tampered = companion(api, "keep-metagpu")
    assert tampered is not None
    tampered["spec"]["hard"]["requests.cnvrg.io/metagpu"] = "1"
    api.put(tampered)
    api.compact()  # and the history is gone: only a list can tell
    async with mirror_instance(kubeconfig, "second", leadership):
        await eventually(
            lambda: (
                units(api, "new-metagpu", "team-b") == "300"
                and companion(api, "drop-metagpu") is None
                and units(api, "edit-metagpu") == "200"
                and units(api, "keep-metagpu") == "100"
            )
        )
        kept = companion(api, "keep-metagpu")
        assert kept is not None
        assert kept["metadata"]["ownerReferences"][0]["uid"] == keep["metadata"]["uid"]


async def test_verbs_sent_are_exactly_the_declared_permissions(
    cluster: tuple[FakeKubeApi, Path],
) -> None:
    api, kubeconfig = cluster
    async with mirror_instance(kubeconfig, "a", Leadership()):
        source = api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
        await eventually(lambda: units(api, "gpus-metagpu") == "100")
        hand = companion(api, "gpus-metagpu")
        assert hand is not None
        hand["spec"]["hard"]["requests.cnvrg.io/metagpu"] = "1"
        api.put(hand)
        await eventually(lambda: units(api, "gpus-metagpu") == "100")
        api.remove(*RQ, source["metadata"]["name"], "team-a")
        await eventually(lambda: companion(api, "gpus-metagpu") is None)
        await eventually(lambda: any(r.verb == "watch" for r in api.requests))
    declared = verb_set(QUOTA_CACHE_PERMISSIONS + quota_mirror_permissions(LEASE))
    assert api.verbs_used() == declared
    lease_calls = {r.name for r in api.requests if r.resource == "leases" and r.verb != "create"}
    assert lease_calls == {LEASE}


async def test_an_api_error_is_retried_with_backoff(cluster: tuple[FakeKubeApi, Path]) -> None:
    api, kubeconfig = cluster
    api.fail_next("create", "resourcequotas", status=500, reason="InternalError", message="etcd")
    async with mirror_instance(kubeconfig, "a", Leadership()):
        api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
        await eventually(lambda: units(api, "gpus-metagpu") == "100")
    assert [r.status for r in quota_writes(api)] == [500, 201]


async def test_nothing_is_written_twice(cluster: tuple[FakeKubeApi, Path]) -> None:
    api, kubeconfig = cluster
    for i in range(5):
        api.put(for_put(quota(f"q{i}", {"requests.nvidia.com/gpu": str(i + 1)})))
    async with mirror_instance(kubeconfig, "a", Leadership()):
        await eventually(lambda: len(api.objects(*RQ)) == 10)
        # Another full pass (a watch that ended and resumed) must find nothing to do.
        watches = sum(r.verb == "watch" for r in api.requests)
        await eventually(lambda: sum(r.verb == "watch" for r in api.requests) > watches + 1)
    assert len(quota_writes(api)) == 5


async def test_a_failed_list_is_retried(cluster: tuple[FakeKubeApi, Path]) -> None:
    api, kubeconfig = cluster
    api.forbid("list", "resourcequotas", times=1)  # RBAC not yet bound, say
    api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
    async with mirror_instance(kubeconfig, "a", Leadership()):
        await eventually(lambda: units(api, "gpus-metagpu") == "100")
    lists = [r.status for r in api.requests if r.verb == "list"]
    assert lists[:2] == [403, 200]
