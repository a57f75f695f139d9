"""``metagpu cleanup`` against an API server that speaks real HTTP+JSON.

The real kubernetes-asyncio client talks to ``tests.harness.kube_api``: Nodes
carrying the agent's keys beside other people's, the release's Leases, DRA
claim templates that pods do and do not name, 403s and a deadline. Whatever
the scenario, the verbs sent must be the ones :mod:`metagpu.cleanup.permissions`
declares (and so the ones the chart grants, tests/install/test_rbac.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from metagpu.cleanup.kube import CleanupTarget, run_cleanup
from metagpu.cleanup.permissions import permissions_for
from metagpu.cleanup.plan import (
    COMPANION_SELECTOR,
    MANAGED_BY_SELECTOR,
    NODE_ANNOTATIONS,
    NODE_LABELS,
    Report,
    node_command,
    node_patch,
)
from metagpu.cli import main
from plugin.api.permissions import verb_set
from tests.harness.kube_api import FakeKubeApi, Obj, running_kube_api

NAMESPACE = "metagpu"
LEASES = ("metagpu-quota-mirror", "metagpu-scheduler", "metagpu-claim-templates")
TARGET = CleanupTarget(namespace=NAMESPACE, leases=LEASES, dra=True, quota_companions=True)
OURS = {
    "metagpu.io/gpu-product": "NVIDIA-A100-SXM4-80GB",
    "metagpu.io/gpu-count": "4",
    "metagpu.io/gpu-memory-mib": "81920",
    "metagpu.io/units-per-gpu": "100",
    "metagpu.io/largest-free-units": "50",
    "metagpu.io/enforces": "",
}
OUR_ANNOTATIONS = {"metagpu.io/gpu-ledger": '{"gpus":[]}', "metagpu.io/gpu-ledger-refresh-s": "300"}
FOREIGN_LABELS = {
    "kubernetes.io/hostname": "x",
    "nvidia.com/gpu.product": "A100",
    "accelerator": "nvidia",
    "metagpu.io/gpu-pool": "a",  # our prefix, but not a key the agent writes: the operator's
}
FOREIGN_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0", "metagpu.io/note": "keep"}
RCT = "resource.k8s.io/v1"
MANAGED = {"app.kubernetes.io/managed-by": "metagpu"}


def node(name: str, labels: dict[str, str], annotations: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }


def template(namespace: str, name: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": RCT,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(MANAGED) if labels is None else labels,
        },
        "spec": {"spec": {"devices": {"requests": []}}},
    }


def pod(namespace: str, name: str, *templates: str) -> Obj:
    claims = [{"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": claims},
    }


COMPANION = {"app.kubernetes.io/managed-by": "metagpu-quota-mirror"}


def quota(namespace: str, name: str, labels: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2"}},
    }


def lease(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": ""},
    }


@pytest.fixture
def fake(kube_api: tuple[FakeKubeApi, str]) -> FakeKubeApi:
    api = kube_api[0]
    api.put(node("gpu-1", {**OURS, **FOREIGN_LABELS}, {**OUR_ANNOTATIONS, **FOREIGN_ANNOTATIONS}))
    api.put(node("gpu-2", {"metagpu.io/gpu-count": "0"}, dict(OUR_ANNOTATIONS)))
    api.put(node("gpu-3", dict(OURS), {}))
    api.put(node("cpu-1", dict(FOREIGN_LABELS), dict(FOREIGN_ANNOTATIONS)))
    for name in LEASES[:2]:  # the claim-template Lease never existed (no DRA pods)
        api.put(lease(NAMESPACE, name))
    api.put(lease(NAMESPACE, "someone-elses"))
    api.put(lease("kube-system", "metagpu-scheduler"))
    api.put(template("team-a", "metagpu-50u-40gi"))
    api.put(template("team-a", "metagpu-25u-20gi"))
    api.put(template("team-b", "metagpu-100u-80gi"))
    api.put(template("team-b", "their-own", {"app.kubernetes.io/managed-by": "helm"}))
    api.put(template("team-c", "unlabelled", {}))
    api.put(pod("team-a", "train-0", "metagpu-50u-40gi"))
    api.put(pod("team-a", "train-1", "metagpu-50u-40gi", "their-other"))
    api.put(pod("team-b", "web", "their-own"))
    api.put(quota("team-a", "gpus", {}))  # the user's source quota
    api.put(quota("team-a", "gpus-metagpu", dict(COMPANION)))
    api.put(quota("team-b", "gpus-metagpu", dict(COMPANION)))
    api.put(quota("team-b", "cpu", {"app.kubernetes.io/managed-by": "helm"}))
    return api


@pytest.fixture
async def api_client(kube_api: tuple[FakeKubeApi, str]) -> AsyncIterator[ApiClient]:
    async with ApiClient(Configuration(host=kube_api[1])) as client:
        yield client
    # Whatever the scenario, nothing may be sent that the declared RBAC does not grant.
    assert kube_api[0].verbs_used() <= verb_set(
        permissions_for(leases=LEASES, dra=True, quota_companions=True)
    )


async def clean(client: ApiClient, *, page_size: int = 500, timeout_s: float = 30) -> Report:
    return await run_cleanup(
        client, TARGET, timeout_s=timeout_s, request_timeout_s=5, page_size=page_size
    )


def meta(fake: FakeKubeApi, name: str) -> tuple[dict[str, str], dict[str, str]]:
    obj = fake.get("v1", "Node", name)
    assert obj is not None
    return obj["metadata"].get("labels") or {}, obj["metadata"].get("annotations") or {}


# ------------------------------------------------------------------ nodes
async def test_only_the_agents_keys_leave_and_only_nodes_with_any_are_written(
    fake: FakeKubeApi, api_client: ApiClient
) -> None:
    report = await clean(api_client)
    assert not report.failed
    assert meta(fake, "gpu-1") == (FOREIGN_LABELS, FOREIGN_ANNOTATIONS)
    for name in ("gpu-2", "gpu-3"):
        assert meta(fake, name) == ({}, {})
    assert meta(fake, "cpu-1") == (FOREIGN_LABELS, FOREIGN_ANNOTATIONS)
    patched = {r.name: r.body for r in fake.writes() if r.resource == "nodes"}
    assert set(patched) == {"gpu-1", "gpu-2", "gpu-3"}
    # Each patch names only the keys that node had, each set to null.
    assert patched["gpu-2"] == {
        "metadata": {
            "labels": {"metagpu.io/gpu-count": None},
            "annotations": dict.fromkeys(OUR_ANNOTATIONS),
        }
    }
    assert patched["gpu-3"] == {"metadata": {"labels": dict.fromkeys(OURS)}}
    assert {
        r.content_type for r in fake.requests if r.resource == "nodes" and r.verb == "patch"
    } == {"application/merge-patch+json"}


def test_the_keys_are_the_agents_own_constants() -> None:
    from plugin.agent.labels import OWNED_LABELS
    from plugin.agent.ledger import OWNED_ANNOTATIONS
    from webhook.dra import MANAGED_BY, MANAGED_BY_LABEL

    assert set(NODE_LABELS) == set(OWNED_LABELS) == set(OURS)
    assert set(NODE_ANNOTATIONS) == set(OWNED_ANNOTATIONS) == set(OUR_ANNOTATIONS)
    assert f"{MANAGED_BY_LABEL}={MANAGED_BY}" == MANAGED_BY_SELECTOR
    from webhook.quotas.mirror import LABEL_MANAGED_BY
    from webhook.quotas.mirror import MANAGED_BY as MIRROR

    assert f"{LABEL_MANAGED_BY}={MIRROR}" == COMPANION_SELECTOR
    assert node_patch(node("n", dict(FOREIGN_LABELS), dict(FOREIGN_ANNOTATIONS))) is None


async def test_nodes_and_pods_are_read_a_page_at_a_time(
    fake: FakeKubeApi, api_client: ApiClient
) -> None:
    report = await clean(api_client, page_size=1)
    assert not report.failed
    node_lists = [r for r in fake.requests if r.resource == "nodes" and r.verb == "list"]
    assert [r.query.get("limit") for r in node_lists] == ["1"] * 4
    assert "continue" not in node_lists[0].query
    assert all(r.query.get("continue") for r in node_lists[1:])
    pod_lists = [r for r in fake.requests if r.resource == "pods" and r.verb == "list"]
    assert [r.namespace for r in pod_lists] == ["team-a", "team-a", "team-b"]
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        assert not set(meta(fake, name)[0]) & set(OURS)


# ----------------------------------------------------- leases and templates
async def test_leases_go_by_name_and_unused_templates_go_a_named_one_stays(
    fake: FakeKubeApi, api_client: ApiClient
) -> None:
    report = await clean(api_client)
    assert not report.failed
    assert [o["metadata"]["name"] for o in fake.objects("coordination.k8s.io/v1", "Lease")] == [
        "metagpu-scheduler",  # kube-system's: another namespace
        "someone-elses",
    ]
    assert "lease metagpu/metagpu-claim-templates: already gone" in report.done
    left = {
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for o in fake.objects(RCT, "ResourceClaimTemplate")
    }
    assert left == {
        ("team-a", "metagpu-50u-40gi"),  # train-0 and train-1 name it
        ("team-b", "their-own"),  # not labelled as ours
        ("team-c", "unlabelled"),
    }
    [kept] = report.kept
    assert "team-a/metagpu-50u-40gi" in kept
    assert "train-0, train-1 still name it" in kept
    assert "kubectl -n team-a delete resourceclaimtemplate metagpu-50u-40gi" in kept
    # Deleted with the uid it was listed with.
    deletes = [r for r in fake.writes() if r.resource == "resourceclaimtemplates"]
    assert {r.name for r in deletes} == {"metagpu-25u-20gi", "metagpu-100u-80gi"}
    assert all(r.body["preconditions"]["uid"] for r in deletes)
    assert "(no pod names it)" in report.summary()


async def test_the_quota_mirrors_companions_go_and_the_users_quotas_stay(
    fake: FakeKubeApi, api_client: ApiClient
) -> None:
    report = await clean(api_client)
    assert not report.failed
    left = {
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for o in fake.objects("v1", "ResourceQuota")
    }
    assert left == {("team-a", "gpus"), ("team-b", "cpu")}
    assert "resourcequota team-b/gpus-metagpu: deleted (the quota mirror's companion)" in (
        report.done
    )
    deletes = [r for r in fake.writes() if r.resource == "resourcequotas"]
    assert all(r.body["preconditions"]["uid"] for r in deletes)


async def test_without_dra_templates_and_pods_are_not_touched(
    fake: FakeKubeApi, api_client: ApiClient
) -> None:
    target = CleanupTarget(namespace=NAMESPACE, leases=LEASES[:1])
    report = await run_cleanup(api_client, target, timeout_s=30, request_timeout_s=5)
    assert not report.failed
    assert not [r for r in fake.requests if r.resource in ("pods", "resourceclaimtemplates")]
    assert fake.verbs_used() == verb_set(permissions_for(leases=LEASES[:1], dra=False))
    assert len(fake.objects(RCT, "ResourceClaimTemplate")) == 5


async def test_a_second_run_writes_nothing_and_uses_exactly_the_declared_verbs(
    fake: FakeKubeApi, api_client: ApiClient
) -> None:
    await clean(api_client)
    mark = len(fake.requests)
    report = await clean(api_client)
    assert not report.failed
    later = fake.requests[mark:]
    assert {(r.verb, r.resource, r.status) for r in later if r.verb != "list"} == {
        ("delete", "leases", 404)
    }  # the companions went the first time: none is listed again
    assert fake.verbs_used() == verb_set(
        permissions_for(leases=LEASES, dra=True, quota_companions=True)
    )


# ---------------------------------------------------------------- failures
async def test_a_forbidden_node_is_logged_with_the_command_and_the_rest_go_on(
    fake: FakeKubeApi, api_client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    fake.forbid("patch", "nodes", name="gpu-2")
    fake.forbid("delete", "leases", name="metagpu-scheduler")
    with caplog.at_level(logging.WARNING, logger="metagpu.cleanup"):
        report = await clean(api_client)
    assert len(report.failed) == 2
    assert meta(fake, "gpu-2")[1] == OUR_ANNOTATIONS  # untouched
    assert meta(fake, "gpu-3") == ({}, {})  # after it in the list: still cleaned
    assert fake.get("coordination.k8s.io/v1", "Lease", "metagpu-quota-mirror", NAMESPACE) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("node gpu-2: HTTP 403" in w and node_command("gpu-2") in w for w in warnings)
    assert node_command("gpu-2").startswith("kubectl label node gpu-2 metagpu.io/gpu-product- ")
    assert any("kubectl -n metagpu delete lease metagpu-scheduler" in w for w in warnings)


async def test_the_deadline_reports_every_unfinished_step_with_its_command(
    fake: FakeKubeApi, api_client: ApiClient
) -> None:
    report = await clean(api_client, timeout_s=1e-9)
    assert len(report.failed) == 4
    assert all("deadline of 1e-09 s passed" in line for line in report.failed)
    assert (
        "kubectl delete resourceclaimtemplates -A -l app.kubernetes.io/managed-by=metagpu"
        in (report.failed[1])
    )
    assert f"kubectl delete resourcequotas -A -l {COMPANION_SELECTOR}" in report.failed[2]
    assert node_command() in report.failed[3]
    assert not fake.writes()


# ------------------------------------------------------------- the command
def args(kubeconfig: Path, *extra: str) -> list[str]:
    flags = [f"--lease={name}" for name in LEASES]
    return ["cleanup", "--kubeconfig", str(kubeconfig), "-n", NAMESPACE, *flags, "--dra", *extra]


async def test_the_command_exits_0_with_failures_unless_strict(
    fake: FakeKubeApi, kube_config_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.forbid("patch", "nodes", name="gpu-1", times=None)
    assert await asyncio.to_thread(main, args(kube_config_env)) == 0
    out = capsys.readouterr().out
    assert "1 failed" in out
    assert "FAILED: node gpu-1: HTTP 403" in out
    assert await asyncio.to_thread(main, args(kube_config_env, "--strict")) == 1
    fake.heal()
    assert await asyncio.to_thread(main, args(kube_config_env, "--strict")) == 0
    assert meta(fake, "gpu-1") == (FOREIGN_LABELS, FOREIGN_ANNOTATIONS)


async def test_an_unreachable_api_server_does_not_block_the_uninstall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_kube_api() as (_, url):
        pass  # served and stopped: a port where nothing listens now
    config = tmp_path / "kubeconfig"
    config.write_text(
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        f'"clusters": [{{"name": "c", "cluster": {{"server": "{url}"}}}}],'
        '"users": [{"name": "u", "user": {"token": "t"}}],'
        '"contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}'
    )
    argv = ["cleanup", "--kubeconfig", str(config), "-n", NAMESPACE, "--lease", "x"]
    assert await asyncio.to_thread(main, argv) == 0
    assert "2 failed" in capsys.readouterr().out
    assert await asyncio.to_thread(main, [*argv, "--strict"]) == 1


def test_bad_timeouts_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cleanup", "--timeout-s", "0"]) == 2
    assert "--timeout-s must be more than 0" in capsys.readouterr().err


def test_no_credentials_is_reported_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cleanup", "--kubeconfig", str(tmp_path / "missing"), "--lease", "x"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1 failed" in out
    assert "no Kubernetes credentials" in out
    assert main([*argv, "--strict"]) == 1
