"""``certs bootstrap`` against an API server that speaks real HTTP+JSON.

The real kubernetes-asyncio client talks to ``tests.harness.kube_api`` (get,
create, update with resourceVersion 409s, strategic-merge patch, dry-run,
403s). The clock is injected, so "due for renewal" is exact; the backoff
sleep is recorded instead of slept.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

import certs.permissions
from certs.bootstrap import (
    ANNOTATION_CA_REPLACED_AT,
    CA_CERT_KEY,
    CA_KEY_KEY,
    DEFAULT_CA_OVERLAP,
    TLS_CERT_KEY,
    TLS_KEY_KEY,
    BootstrapError,
    IssuePolicy,
    decide_bundle,
    render_bundle,
)
from certs.cluster import ApiForbiddenError, Obj
from certs.issue import CertPair, inspect_cert, iso_utc, key_matches, verify_chain
from certs.kube import KubeClusterApi
from certs.permissions import permissions_for
from certs.reconcile import (
    BootstrapResult,
    BootstrapTarget,
    RetryPolicy,
    decode_secret_data,
    new_secret,
    run_bootstrap,
)
from plugin.api.permissions import verb_set
from tests.certs.conftest import NAMESPACE, SERVICE_NAMES, T0
from tests.harness.kube_api import FakeKubeApi

SECRET = "metagpu-webhook-tls"
CONFIG = "metagpu"
HOOKS = ("pods.metagpu.io", "jobs.metagpu.io")
PERMISSIONS = permissions_for(secret=SECRET, webhook_config=CONFIG)
TARGET = BootstrapTarget(namespace=NAMESPACE, secret=SECRET, webhook_config=CONFIG)
SECRET_ONLY = BootstrapTarget(namespace=NAMESPACE, secret=SECRET)
ADMISSION = "admissionregistration.k8s.io/v1"
MWC = "MutatingWebhookConfiguration"
POLICY = IssuePolicy(dns_names=SERVICE_NAMES)


def webhook_configuration(*, annotations: dict[str, str] | None = None) -> Obj:
    """A MutatingWebhookConfiguration shaped like the chart's (two webhooks, no caBundle)."""
    hooks = [
        {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "timeoutSeconds": 5,
            "clientConfig": {
                "service": {
                    "name": "metagpu-webhook",
                    "namespace": NAMESPACE,
                    "path": "/mutate",
                    "port": 443,
                }
            },
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
        }
        for name in HOOKS
    ]
    meta: Obj = {"name": CONFIG, "labels": {"app.kubernetes.io/name": "metagpu"}}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": ADMISSION, "kind": MWC, "metadata": meta, "webhooks": hooks}


@dataclass
class Cluster:
    """The fake API server's state, our adapter pointed at it, and what we slept."""

    fake: FakeKubeApi
    port: KubeClusterApi
    sleeps: list[float] = field(default_factory=list)
    now: dt.datetime = T0

    async def sleep(self, delay_s: float) -> None:
        self.sleeps.append(delay_s)

    async def bootstrap(
        self,
        target: BootstrapTarget = TARGET,
        *,
        policy: IssuePolicy = POLICY,
        port: KubeClusterApi | None = None,
        **kwargs: Any,
    ) -> BootstrapResult:
        return await run_bootstrap(
            port or self.port,
            target,
            policy=policy,
            clock=lambda: self.now,
            sleep=self.sleep,
            **kwargs,
        )

    def secret(self) -> Obj | None:
        return self.fake.get("v1", "Secret", SECRET, NAMESPACE)

    def data(self) -> dict[str, bytes]:
        secret = self.secret()
        assert secret is not None
        return decode_secret_data(secret)

    def ca_bundles(self) -> dict[str, bytes | None]:
        config = self.fake.get(ADMISSION, MWC, CONFIG)
        assert config is not None
        out: dict[str, bytes | None] = {}
        for hook in config["webhooks"]:
            raw = hook["clientConfig"].get("caBundle")
            out[hook["name"]] = base64.b64decode(raw) if raw else None
        return out

    def mark(self) -> int:
        return len(self.fake.requests)

    def writes_since(self, mark: int) -> list[tuple[str, str, int, str]]:
        return [
            (r.verb, r.resource, r.status, r.query.get("dryRun", ""))
            for r in self.fake.requests[mark:]
            if r.verb in ("create", "update", "patch", "delete")
        ]


@pytest.fixture
async def cluster(kube_api: tuple[FakeKubeApi, str]) -> AsyncIterator[Cluster]:
    fake, url = kube_api
    fake.put(webhook_configuration())
    async with ApiClient(Configuration(host=url)) as client:
        c = Cluster(fake, KubeClusterApi(client, permissions=PERMISSIONS))
        yield c
    # Whatever the scenario, nothing may be sent that the declared RBAC does not grant.
    assert fake.verbs_used() <= verb_set(PERMISSIONS)


# ------------------------------------------------------------------ runs
async def test_first_run_creates_the_secret_then_patches_every_ca_bundle(cluster: Cluster) -> None:
    result = await cluster.bootstrap()
    assert result.secret_action == "created"
    assert result.patched_webhooks == HOOKS
    secret = cluster.secret()
    assert secret is not None
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == (
        "metagpu-certs-bootstrap"
    )
    data = cluster.data()
    assert set(data) == {TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY, CA_KEY_KEY}
    assert inspect_cert(data[TLS_CERT_KEY]).dns_names == SERVICE_NAMES
    verify_chain(data[TLS_CERT_KEY], data[CA_CERT_KEY], now=T0)
    assert key_matches(data[TLS_CERT_KEY], data[TLS_KEY_KEY])
    assert key_matches(data[CA_CERT_KEY], data[CA_KEY_KEY])
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, data[CA_CERT_KEY])
    # Order: a new CA is trusted first (nothing was trusted before), then the Secret.
    assert cluster.writes_since(0) == [
        ("patch", "mutatingwebhookconfigurations", 200, ""),
        ("create", "secrets", 201, ""),
    ]
    patch = [r for r in cluster.fake.requests if r.verb == "patch"][-1]
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body["metadata"]["resourceVersion"]  # a precondition, not a blind write
    config = cluster.fake.get(ADMISSION, MWC, CONFIG)
    assert config is not None
    assert config["webhooks"][0]["failurePolicy"] == "Fail"  # the rest is untouched


async def test_second_run_sends_no_writes(cluster: Cluster) -> None:
    first = await cluster.bootstrap()
    mark = cluster.mark()
    cluster.now = T0 + dt.timedelta(days=30)
    second = await cluster.bootstrap()
    assert cluster.writes_since(mark) == []
    assert [(r.verb, r.resource) for r in cluster.fake.requests[mark:]] == [
        ("get", "mutatingwebhookconfigurations"),
        ("get", "secrets"),
    ]
    assert second.secret_action == "unchanged"
    assert not second.changed
    assert second.webhooks_in_sync == HOOKS
    assert second.leaf.serial == first.leaf.serial


@pytest.mark.parametrize(
    ("offset_s", "reissued"),
    [
        pytest.param(-1, False, id="one-second-before-due"),
        pytest.param(1, True, id="one-second-after-due"),
    ],
)
async def test_a_due_leaf_is_reissued_with_the_ca_and_ca_bundle_unchanged(
    cluster: Cluster, offset_s: int, reissued: bool
) -> None:
    await cluster.bootstrap()
    before = cluster.data()
    bundles_before = cluster.ca_bundles()
    due = inspect_cert(before[TLS_CERT_KEY]).renew_at(POLICY.renew_fraction)
    cluster.now = due + dt.timedelta(seconds=offset_s)
    mark = cluster.mark()
    result = await cluster.bootstrap()
    after = cluster.data()
    assert after[CA_CERT_KEY] == before[CA_CERT_KEY]
    assert after[CA_KEY_KEY] == before[CA_KEY_KEY]
    assert cluster.ca_bundles() == bundles_before
    if not reissued:
        assert cluster.writes_since(mark) == []
        return
    assert result.secret_action == "updated"
    assert "due for renewal" in result.decision.leaf_reasons[0]
    assert after[TLS_CERT_KEY] != before[TLS_CERT_KEY]
    verify_chain(after[TLS_CERT_KEY], after[CA_CERT_KEY], now=cluster.now)
    assert cluster.writes_since(mark) == [("update", "secrets", 200, "")]


async def test_ca_missing_but_leaf_present_recreates_both_and_the_ca_bundle(
    cluster: Cluster,
) -> None:
    await cluster.bootstrap()
    old = cluster.data()
    secret = cluster.secret()
    assert secret is not None
    for key in (CA_CERT_KEY, CA_KEY_KEY):
        del secret["data"][key]
    cluster.fake.put(secret)
    mark = cluster.mark()
    result = await cluster.bootstrap()
    assert (result.decision.ca, result.decision.leaf) == ("replace", "issue")
    new = cluster.data()
    assert new[TLS_CERT_KEY] != old[TLS_CERT_KEY]
    assert new[CA_CERT_KEY] != old[CA_CERT_KEY]
    verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=T0)
    # The old CA stays trusted: the pods still serve old[TLS_CERT_KEY] for a while.
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, new[CA_CERT_KEY] + old[CA_CERT_KEY])
    assert cluster.writes_since(mark) == [
        ("patch", "mutatingwebhookconfigurations", 200, ""),
        ("update", "secrets", 200, ""),
    ]


# ---------------------------------------------------------- CA replacement
OVERLAP = DEFAULT_CA_OVERLAP


def lose_ca_key(cluster: Cluster) -> None:
    secret = cluster.secret()
    assert secret is not None
    del secret["data"][CA_KEY_KEY]
    cluster.fake.put(secret)


def delete_secret(cluster: Cluster) -> None:
    cluster.fake.remove("v1", "Secret", SECRET, NAMESPACE)


def patched_bundles(request: Any) -> set[bytes]:
    """The caBundles a (strategic-merge) patch request sets."""
    return {base64.b64decode(w["clientConfig"]["caBundle"]) for w in request.body["webhooks"]}


@pytest.mark.parametrize(
    ("cause", "kwargs", "secret_write"),
    [
        pytest.param(None, {"new_ca": True}, "update", id="new-ca-flag"),
        pytest.param(lose_ca_key, {}, "update", id="ca-key-lost"),
        pytest.param(delete_secret, {}, "create", id="secret-deleted-pods-keep-old-files"),
    ],
)
async def test_ca_replacement_trusts_new_and_old_ca_before_the_secret_is_written(
    cluster: Cluster,
    cause: Callable[[Cluster], None] | None,
    kwargs: dict[str, Any],
    secret_write: str,
) -> None:
    await cluster.bootstrap()
    old = cluster.data()
    if cause is not None:
        cause(cluster)
    cluster.now = T0 + dt.timedelta(days=1)
    mark = cluster.mark()
    result = await cluster.bootstrap(**kwargs)
    new = cluster.data()
    assert result.decision.ca == "replace"
    assert new[CA_CERT_KEY] != old[CA_CERT_KEY]
    both = new[CA_CERT_KEY] + old[CA_CERT_KEY]
    # The patch that makes the API server trust both goes out BEFORE the Secret changes,
    # and it is the only caBundle write: the Secret write needs nothing after it.
    writes = [r for r in cluster.fake.requests[mark:] if r.verb in ("patch", "create", "update")]
    assert [(r.verb, r.resource, r.status) for r in writes] == [
        ("patch", "mutatingwebhookconfigurations", 200),
        (secret_write, "secrets", 201 if secret_write == "create" else 200),
    ]
    assert "dryRun" not in writes[0].query
    assert patched_bundles(writes[0]) == {both}
    assert writes[0].body["metadata"]["resourceVersion"]
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, both)
    assert result.patched_webhooks == HOOKS
    # The API server accepts the leaf the pods still serve AND the one they will load.
    verify_chain(old[TLS_CERT_KEY], both, now=cluster.now)
    verify_chain(new[TLS_CERT_KEY], both, now=cluster.now)
    secret = cluster.secret()
    assert secret is not None
    assert secret["metadata"]["annotations"][ANNOTATION_CA_REPLACED_AT] == iso_utc(cluster.now)
    assert result.ca_bundle is not None
    assert [c.fingerprint_sha256 for c in result.ca_bundle.previous] == [
        inspect_cert(old[CA_CERT_KEY]).fingerprint_sha256
    ]
    assert result.ca_bundle.overlap_until == cluster.now + OVERLAP
    assert "the first run after" in result.summary()


@pytest.mark.parametrize(
    ("after", "trimmed"),
    [
        pytest.param(dt.timedelta(0), False, id="immediately"),
        pytest.param(OVERLAP - dt.timedelta(seconds=1), False, id="one-second-before-overlap-ends"),
        pytest.param(-dt.timedelta(seconds=30), False, id="clock-of-next-job-30s-behind"),
        pytest.param(OVERLAP, True, id="overlap-over"),
        pytest.param(dt.timedelta(days=1), True, id="next-day-cronjob"),
    ],
)
async def test_replaced_ca_is_kept_until_the_overlap_ends_then_trimmed_once(
    cluster: Cluster, after: dt.timedelta, trimmed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    await cluster.bootstrap()
    old = cluster.data()
    await cluster.bootstrap(new_ca=True)
    new = cluster.data()
    replaced = cluster.now
    cluster.now = replaced + after
    caplog.set_level(logging.INFO, logger="certs.reconcile")
    mark = cluster.mark()
    result = await cluster.bootstrap()  # the post-upgrade hook, then the CronJob
    assert result.secret_action == "unchanged"
    if not trimmed:
        assert cluster.writes_since(mark) == []
        assert cluster.ca_bundles() == dict.fromkeys(HOOKS, new[CA_CERT_KEY] + old[CA_CERT_KEY])
        return
    assert cluster.writes_since(mark) == [("patch", "mutatingwebhookconfigurations", 200, "")]
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, new[CA_CERT_KEY])
    old_ca = inspect_cert(old[CA_CERT_KEY])
    assert result.ca_bundle is not None
    assert [c.serial for c in result.ca_bundle.removed] == [old_ca.serial]
    assert f"serial {old_ca.serial:x}" in caplog.text  # the log says what left the caBundle
    assert "removed (not the Secret's CA)" in result.summary()
    # Trimmed once; the run after writes nothing.
    mark = cluster.mark()
    again = await cluster.bootstrap()
    assert cluster.writes_since(mark) == []
    assert not again.changed


async def test_two_replacements_within_the_overlap_keep_every_ca_the_pods_may_serve(
    cluster: Cluster,
) -> None:
    await cluster.bootstrap()
    first = cluster.data()[CA_CERT_KEY]
    await cluster.bootstrap(new_ca=True)
    second = cluster.data()[CA_CERT_KEY]
    cluster.now = T0 + dt.timedelta(minutes=1)  # pods may still serve a leaf of the first CA
    await cluster.bootstrap(new_ca=True)
    third = cluster.data()[CA_CERT_KEY]
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, third + second + first)
    cluster.now += OVERLAP
    await cluster.bootstrap()
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, third)


async def test_secret_only_replacement_then_the_post_hook_still_keeps_the_old_ca(
    cluster: Cluster,
) -> None:
    """The chart's pre-upgrade hook has no --webhook-config; the post-upgrade hook must
    not finish the job by dropping the CA the pods still serve."""
    await cluster.bootstrap()
    old = cluster.data()
    lose_ca_key(cluster)
    await cluster.bootstrap(SECRET_ONLY)
    new = cluster.data()
    assert new[CA_CERT_KEY] != old[CA_CERT_KEY]
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, old[CA_CERT_KEY])  # not touched yet
    cluster.now = T0 + dt.timedelta(minutes=2)
    result = await cluster.bootstrap()
    assert result.patched_webhooks == HOOKS
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, new[CA_CERT_KEY] + old[CA_CERT_KEY])


@pytest.mark.parametrize(
    "offset",
    [
        pytest.param(dt.timedelta(minutes=1), id="during-the-overlap"),
        pytest.param(dt.timedelta(days=300), id="long-after"),
    ],
)
async def test_a_leaf_renewal_leaves_the_ca_bundle_and_the_replacement_time_alone(
    cluster: Cluster, offset: dt.timedelta
) -> None:
    await cluster.bootstrap()
    await cluster.bootstrap(new_ca=True)
    before = cluster.ca_bundles()
    secret = cluster.secret()
    assert secret is not None
    stamp = secret["metadata"]["annotations"][ANNOTATION_CA_REPLACED_AT]
    if offset > OVERLAP:
        cluster.now = T0 + OVERLAP
        await cluster.bootstrap()  # the overlap's trim, done before the renewal
        before = cluster.ca_bundles()
        assert len(set(before.values())) == 1
    cluster.now = T0 + offset
    mark = cluster.mark()
    result = await cluster.bootstrap(force_leaf=True)
    assert (result.decision.ca, result.decision.leaf) == ("keep", "issue")
    assert cluster.writes_since(mark) == [("update", "secrets", 200, "")]
    assert cluster.ca_bundles() == before
    secret = cluster.secret()
    assert secret is not None
    assert secret["metadata"]["annotations"][ANNOTATION_CA_REPLACED_AT] == stamp


@pytest.mark.parametrize(
    ("offset", "kept_foreign"),
    [
        pytest.param(dt.timedelta(minutes=1), True, id="during-the-overlap"),
        pytest.param(dt.timedelta(days=1), False, id="after-the-overlap"),
    ],
)
async def test_junk_is_always_dropped_and_foreign_cas_only_after_the_overlap(
    cluster: Cluster,
    ca_pair: CertPair,
    offset: dt.timedelta,
    kept_foreign: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await cluster.bootstrap()
    old = cluster.data()[CA_CERT_KEY]
    await cluster.bootstrap(new_ca=True)
    new = cluster.data()[CA_CERT_KEY]
    junk = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
    config = cluster.fake.get(ADMISSION, MWC, CONFIG)
    assert config is not None
    edited = new + old + ca_pair.cert_pem + junk  # an operator added a CA, and a broken block
    for hook in config["webhooks"]:
        hook["clientConfig"]["caBundle"] = base64.b64encode(edited).decode()
    cluster.fake.put(config)
    caplog.set_level(logging.INFO, logger="certs.reconcile")
    cluster.now = T0 + offset
    result = await cluster.bootstrap()
    assert result.ca_bundle is not None
    assert result.ca_bundle.unreadable == len(HOOKS)  # one broken block per webhook
    if kept_foreign:
        assert cluster.ca_bundles() == dict.fromkeys(HOOKS, new + old + ca_pair.cert_pem)
        return
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, new)
    removed = {c.fingerprint_sha256 for c in result.ca_bundle.removed}
    assert removed == {inspect_cert(p).fingerprint_sha256 for p in (old, ca_pair.cert_pem)}
    assert "part(s) that are not certificates" in caplog.text


async def test_a_replacement_dry_run_writes_nothing_and_reports_both_cas(
    cluster: Cluster,
) -> None:
    await cluster.bootstrap()
    mark = cluster.mark()
    result = await cluster.bootstrap(new_ca=True, dry_run=True)
    assert cluster.writes_since(mark) == []
    assert result.patched_webhooks == HOOKS
    assert result.ca_bundle is not None
    assert len(result.ca_bundle.previous) == 1
    assert result.to_json()["webhookConfiguration"]["previousCAsUntil"] == iso_utc(T0 + OVERLAP)


async def test_a_conflict_on_the_first_patch_rereads_and_still_keeps_the_old_ca(
    cluster: Cluster,
) -> None:
    await cluster.bootstrap()
    old = cluster.data()[CA_CERT_KEY]
    cluster.fake.fail_next("patch", "mutatingwebhookconfigurations")
    mark = cluster.mark()
    await cluster.bootstrap(new_ca=True)
    new = cluster.data()[CA_CERT_KEY]
    assert cluster.writes_since(mark) == [
        ("patch", "mutatingwebhookconfigurations", 409, ""),
        ("patch", "mutatingwebhookconfigurations", 200, ""),
        ("update", "secrets", 200, ""),
    ]
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, new + old)


async def test_an_unreadable_replacement_time_trims_like_before_and_warns(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    await cluster.bootstrap()
    await cluster.bootstrap(new_ca=True)
    secret = cluster.secret()
    assert secret is not None
    secret["metadata"]["annotations"][ANNOTATION_CA_REPLACED_AT] = "yesterday"
    cluster.fake.put(secret)
    await cluster.bootstrap()
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, cluster.data()[CA_CERT_KEY])
    assert "ca-replaced-at='yesterday' is not an ISO 8601 time" in caplog.text


async def test_a_due_ca_is_renewed_with_its_key_and_old_leaves_still_verify(
    cluster: Cluster,
) -> None:
    policy = IssuePolicy(
        dns_names=SERVICE_NAMES,
        ca_validity=dt.timedelta(days=30),
        leaf_validity=dt.timedelta(days=7),
    )
    await cluster.bootstrap(policy=policy)
    cluster.now = T0 + dt.timedelta(days=19, hours=22)  # leaf expired, CA not yet due
    leaf_only = await cluster.bootstrap(policy=policy)
    assert (leaf_only.decision.ca, leaf_only.decision.leaf) == ("keep", "issue")
    before = cluster.data()
    cluster.now = T0 + dt.timedelta(days=20, hours=12)  # CA due (< 10 of 30 days left)
    result = await cluster.bootstrap(policy=policy)
    assert (result.decision.ca, result.decision.leaf) == ("renew", "keep")
    after = cluster.data()
    assert after[CA_KEY_KEY] == before[CA_KEY_KEY]
    assert after[TLS_CERT_KEY] == before[TLS_CERT_KEY]
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, after[CA_CERT_KEY])
    verify_chain(after[TLS_CERT_KEY], after[CA_CERT_KEY], now=cluster.now)


async def test_only_the_named_webhooks_are_patched(cluster: Cluster) -> None:
    target = BootstrapTarget(NAMESPACE, SECRET, CONFIG, webhooks=("jobs.metagpu.io",))
    result = await cluster.bootstrap(target)
    assert result.patched_webhooks == ("jobs.metagpu.io",)
    bundles = cluster.ca_bundles()
    assert bundles["pods.metagpu.io"] is None
    assert bundles["jobs.metagpu.io"] == cluster.data()[CA_CERT_KEY]


async def test_secret_only_mode_never_touches_webhook_configurations(cluster: Cluster) -> None:
    result = await cluster.bootstrap(SECRET_ONLY)
    assert result.secret_action == "created"
    assert {r.resource for r in cluster.fake.requests} == {"secrets"}
    secret_only = verb_set(permissions_for(secret=SECRET, webhook_config=None))
    assert cluster.fake.verbs_used() <= secret_only


async def test_an_update_keeps_foreign_keys_labels_and_annotations(cluster: Cluster) -> None:
    await cluster.bootstrap()
    secret = cluster.secret()
    assert secret is not None
    secret["data"]["extra"] = base64.b64encode(b"kept").decode()
    secret["metadata"]["annotations"] = {"team": "ml-platform"}
    secret["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    cluster.fake.put(secret)
    await cluster.bootstrap(force_leaf=True)
    updated = cluster.secret()
    assert updated is not None
    assert updated["data"]["extra"] == base64.b64encode(b"kept").decode()
    assert updated["metadata"]["annotations"] == {"team": "ml-platform"}
    update = [r for r in cluster.fake.requests if r.verb == "update"][-1]
    assert update.body["metadata"]["resourceVersion"]  # conditional PUT
    assert "managedFields" not in update.body["metadata"]  # the server keeps tracking them


async def test_dry_run_reads_only(cluster: Cluster) -> None:
    result = await cluster.bootstrap(dry_run=True)
    assert result.secret_action == "created"
    assert result.patched_webhooks == HOOKS
    assert "would be created" in result.summary()
    assert cluster.writes_since(0) == []
    assert cluster.secret() is None


# ------------------------------------------------------------- concurrency
async def test_conflict_on_secret_update_rereads_and_retries(cluster: Cluster) -> None:
    await cluster.bootstrap()
    cluster.fake.fail_next("update", "secrets")
    mark = cluster.mark()
    result = await cluster.bootstrap(force_leaf=True)
    assert result.secret_action == "updated"
    assert cluster.writes_since(mark) == [
        ("update", "secrets", 409, ""),
        ("update", "secrets", 200, ""),
    ]
    assert [(r.verb, r.resource) for r in cluster.fake.requests[mark:]].count(
        ("get", "secrets")
    ) == 2
    assert len(cluster.sleeps) == 1
    assert 0 < cluster.sleeps[0] <= RetryPolicy().base_delay_s


class RacingApi(KubeClusterApi):
    """Lets another writer act between our read and our write, once."""

    def __init__(self, inner: KubeClusterApi, race: Callable[[], None], *, on: str) -> None:
        self.__dict__.update(inner.__dict__)
        self._race, self._on, self.raced = race, on, False

    def _maybe_race(self, where: str) -> None:
        if where == self._on and not self.raced:
            self.raced = True
            self._race()

    async def get_webhook_config(self, name: str) -> Obj | None:
        obj = await super().get_webhook_config(name)
        self._maybe_race("after-get-config")
        return obj

    async def create_secret(self, namespace: str, body: Obj) -> Obj:
        self._maybe_race("before-create-secret")
        return await super().create_secret(namespace, body)


async def test_a_concurrent_change_to_the_configuration_is_a_409_not_a_lost_update(
    cluster: Cluster,
) -> None:
    await cluster.bootstrap(SECRET_ONLY)

    def someone_else_edits() -> None:
        config = cluster.fake.get(ADMISSION, MWC, CONFIG)
        assert config is not None
        config["metadata"]["labels"]["edited-by"] = "helm"
        cluster.fake.put(config)

    racing = RacingApi(cluster.port, someone_else_edits, on="after-get-config")
    mark = cluster.mark()
    result = await cluster.bootstrap(port=racing)
    assert racing.raced
    assert result.patched_webhooks == HOOKS
    assert cluster.writes_since(mark) == [
        ("patch", "mutatingwebhookconfigurations", 409, ""),
        ("patch", "mutatingwebhookconfigurations", 200, ""),
    ]
    config = cluster.fake.get(ADMISSION, MWC, CONFIG)
    assert config is not None
    assert config["metadata"]["labels"]["edited-by"] == "helm"  # their change survived
    assert cluster.ca_bundles() == dict.fromkeys(HOOKS, cluster.data()[CA_CERT_KEY])


async def test_two_first_runs_racing_converge_on_one_ca(cluster: Cluster) -> None:
    other_runner: dict[str, bytes] = {}

    def another_job_creates_it() -> None:
        decision = decide_bundle(None, policy=POLICY, now=T0)
        other_runner.update(render_bundle(None, decision, policy=POLICY, now=T0))
        cluster.fake.put(new_secret(SECRET_ONLY, other_runner))

    racing = RacingApi(cluster.port, another_job_creates_it, on="before-create-secret")
    result = await cluster.bootstrap(SECRET_ONLY, port=racing)
    assert racing.raced
    assert result.secret_action == "unchanged"  # the winner's bundle was valid: adopted
    assert cluster.data() == other_runner
    assert [(r.verb, r.status) for r in cluster.fake.requests if r.verb == "create"] == [
        ("create", 409)
    ]


async def test_gives_up_after_the_configured_attempts(cluster: Cluster) -> None:
    await cluster.bootstrap()
    cluster.fake.fail_next("update", "secrets", times=10)
    with pytest.raises(BootstrapError) as err:
        await cluster.bootstrap(force_leaf=True, retry=RetryPolicy(attempts=3))
    assert "gave up after 3 attempts" in str(err.value)
    assert "409" in str(err.value)
    assert len(cluster.sleeps) == 2
    assert cluster.sleeps[1] <= 2 * RetryPolicy().base_delay_s


async def test_a_transient_503_is_retried(cluster: Cluster) -> None:
    cluster.fake.fail_next(
        "get", "secrets", status=503, reason="ServiceUnavailable", message="etcd leader changed"
    )
    result = await cluster.bootstrap()
    assert result.secret_action == "created"
    assert len(cluster.sleeps) == 1


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("verb", "resource", "prepare", "expected"),
    [
        pytest.param(
            "patch",
            "mutatingwebhookconfigurations",
            False,
            [
                'cannot patch mutatingwebhookconfigurations "metagpu" '
                "(admissionregistration.k8s.io): forbidden",
                "needs verb patch on mutatingwebhookconfigurations",
                "resourceNames [metagpu]",
                "ClusterRole",
                'User "system:serviceaccount:metagpu:metagpu" cannot patch',
            ],
            id="patch-config",
        ),
        pytest.param(
            "create",
            "secrets",
            False,
            [
                'cannot create secrets "metagpu-webhook-tls" in namespace "metagpu" '
                "(core API group): forbidden",
                "needs verb create on secrets",
                "RBAC cannot restrict create by resource name",
                'a Role in namespace "metagpu"',
            ],
            id="create-secret",
        ),
        pytest.param(
            "get",
            "secrets",
            False,
            ['cannot get secrets "metagpu-webhook-tls"', "resourceNames [metagpu-webhook-tls]"],
            id="get-secret",
        ),
        pytest.param(
            "update",
            "secrets",
            True,
            ['cannot update secrets "metagpu-webhook-tls"', "needs verb update"],
            id="update-secret",
        ),
        pytest.param(
            "get",
            "mutatingwebhookconfigurations",
            False,
            ['cannot get mutatingwebhookconfigurations "metagpu"', "needs verb get"],
            id="get-config",
        ),
    ],
)
async def test_forbidden_names_the_verb_and_resource_and_writes_nothing_more(
    cluster: Cluster, verb: str, resource: str, prepare: bool, expected: list[str]
) -> None:
    if prepare:
        await cluster.bootstrap()
    before = cluster.secret()
    cluster.fake.forbid(verb, resource)
    with pytest.raises(ApiForbiddenError) as err:
        await cluster.bootstrap(force_leaf=prepare)
    for text in expected:
        assert text in str(err.value)
    assert cluster.sleeps == []  # a 403 is not retried
    assert cluster.secret() == before  # no half-applied state


async def test_forbidden_patch_after_a_leaf_renewal_leaves_a_consistent_secret(
    cluster: Cluster,
) -> None:
    """A leaf-only renewal does not change the caBundle, so it needs no patch at all."""
    await cluster.bootstrap()
    cluster.fake.forbid("patch", "mutatingwebhookconfigurations")
    result = await cluster.bootstrap(force_leaf=True)
    assert result.secret_action == "updated"
    assert result.patched_webhooks == ()


@pytest.mark.parametrize(
    ("setup", "target", "expected"),
    [
        pytest.param(
            "delete-config",
            TARGET,
            'mutatingwebhookconfigurations "metagpu" not found: install the chart',
            id="config-missing",
        ),
        pytest.param(
            None,
            BootstrapTarget(NAMESPACE, SECRET, CONFIG, webhooks=("pods.example.com",)),
            "no webhook named 'pods.example.com'; it has: pods.metagpu.io, jobs.metagpu.io",
            id="unknown-webhook",
        ),
        pytest.param(
            "cert-manager-config",
            TARGET,
            "cert-manager.io/inject-ca-from=metagpu/metagpu-webhook",
            id="config-owned-by-cert-manager",
        ),
        pytest.param(
            "opaque-secret",
            TARGET,
            "has type Opaque; bootstrap keeps a kubernetes.io/tls Secret",
            id="secret-wrong-type",
        ),
        pytest.param(
            "cert-manager-secret",
            TARGET,
            "managed by the cert-manager Certificate 'metagpu-webhook'",
            id="secret-owned-by-cert-manager",
        ),
    ],
)
async def test_objects_bootstrap_must_not_touch_stop_it_before_any_write(
    cluster: Cluster, setup: str | None, target: BootstrapTarget, expected: str
) -> None:
    fake = cluster.fake
    if setup == "delete-config":
        fake.remove(ADMISSION, MWC, CONFIG)
    elif setup == "cert-manager-config":
        fake.put(
            webhook_configuration(
                annotations={"cert-manager.io/inject-ca-from": "metagpu/metagpu-webhook"}
            )
        )
    elif setup in ("opaque-secret", "cert-manager-secret"):
        secret: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque" if setup == "opaque-secret" else "kubernetes.io/tls",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": {},
        }
        if setup == "cert-manager-secret":
            secret["metadata"]["annotations"] = {
                "cert-manager.io/certificate-name": "metagpu-webhook"
            }
        fake.put(secret)
    with pytest.raises(BootstrapError) as err:
        await cluster.bootstrap(target)
    assert expected in str(err.value)
    assert cluster.writes_since(0) == []


# -------------------------------------------------------------- permissions
async def test_verbs_sent_across_all_scenarios_equal_the_declared_permissions(
    cluster: Cluster,
) -> None:
    """first run, no-op run, leaf renewal, CA loss, conflict: the union is exactly PERMISSIONS."""
    await cluster.bootstrap()
    await cluster.bootstrap()
    cluster.now = T0 + dt.timedelta(days=300)
    await cluster.bootstrap()
    secret = cluster.secret()
    assert secret is not None
    del secret["data"][CA_KEY_KEY]
    cluster.fake.put(secret)
    cluster.fake.fail_next("update", "secrets")
    await cluster.bootstrap()
    assert cluster.fake.verbs_used() == verb_set(PERMISSIONS)


def test_declared_permissions_are_scoped_by_name_where_rbac_allows() -> None:
    assert PERMISSIONS == certs.permissions.PERMISSIONS  # the defaults are what the tests use
    by_verb = {(p.resource, v): p for p in PERMISSIONS for v in p.verbs}
    assert by_verb[("secrets", "get")].resource_names == {SECRET}
    assert by_verb[("secrets", "update")].resource_names == {SECRET}
    assert by_verb[("secrets", "create")].resource_names == frozenset()
    assert by_verb[("mutatingwebhookconfigurations", "patch")].resource_names == {CONFIG}
    assert not by_verb[("mutatingwebhookconfigurations", "get")].namespaced
    assert all(p.why for p in PERMISSIONS)


# ---------------------------------------------------- real TLS, and secrecy
async def test_the_served_pair_is_trusted_through_the_patched_ca_bundle(
    cluster: Cluster, tmp_path: Path
) -> None:
    """What the API server does: trust only caBundle, dial <svc>.<ns>.svc."""
    cluster.now = dt.datetime.now(dt.UTC)  # OpenSSL checks validity against the real clock
    await cluster.bootstrap()
    data = cluster.data()
    (tmp_path / "tls.crt").write_bytes(data[TLS_CERT_KEY])
    (tmp_path / "tls.key").write_bytes(data[TLS_KEY_KEY])
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"admitted")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    ca_bundle = cluster.ca_bundles()["pods.metagpu.io"]
    assert ca_bundle is not None
    client_ctx = ssl.create_default_context(cadata=ca_bundle.decode())
    async with server:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="metagpu-webhook.metagpu.svc"
        )
        assert await reader.read() == b"admitted"
        writer.close()


async def test_no_key_material_is_logged(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await cluster.bootstrap()
    cluster.now = T0 + dt.timedelta(days=300)
    await cluster.bootstrap()
    data = cluster.data()
    text = caplog.text + " ".join(str(r.__dict__) for r in caplog.records)
    assert "PRIVATE KEY" not in text
    for key in (TLS_KEY_KEY, CA_KEY_KEY):
        assert base64.b64encode(data[key]).decode()[:40] not in text
        assert data[key].decode()[40:80] not in text
    assert "TLS secret updated" in caplog.text  # it did log the change itself
