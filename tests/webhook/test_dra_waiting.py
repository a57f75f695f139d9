"""The Event that says why a DRA pod waits (webhook.dra_waiting): the view of waiting pods,
one pass through the in-test API server on the captured pod p70 beside two 60-unit shares,
and the way the webhook runs it, under the claim-template controller's Lease."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
from pathlib import Path
from typing import Any, Final

import pytest

from certs.kube import open_api_client
from plugin.api.permissions import verb_set
from tests.harness.kube_api import FakeKubeApi, running_kube_api
from tests.plugin.dra.fixtures import DRIVER, load
from tests.webhook.builders import settings
from tests.webhook.quotas.harness import FAST, write_kubeconfig
from tests.webhook.waiting import eventually
from webhook import dra_waiting
from webhook.claimtemplate_controller import run_claim_templates
from webhook.config import KubernetesConfig
from webhook.dra_waiting import ExplainSettings, WaitingExplainer, WaitingPods
from webhook.metrics import WebhookMetrics
from webhook.namespaces import new_api_client
from webhook.permissions import WAITING_POD_PERMISSIONS, claim_template_permissions

NOW: Final = dt.datetime(2026, 11, 27, 6, 27, 17, tzinfo=dt.UTC)
EVENT: Final = ("events.k8s.io/v1", "Event", "dra-cap")
SIXTIES: Final = ("claim-60-units-a-allocated.json", "claim-60-units-b-allocated.json")
P70_NOTE: Final = (
    "claim p70-gpu-nd7kc: localhost: no single GPU has 70 free units (largest 40; "
    "80 free in total) (free: gpu-0 40 units, 79Gi; gpu-1 40 units, 79Gi)"
)
Obj = dict[str, Any]


def put_captured_state(fake: FakeKubeApi) -> Obj:
    """The node's slice, the two allocated 60s, and pending p70 with its claim."""
    fake.put(load("resourceslice-consumable-accepted.json")["response"]["body"])
    for name in SIXTIES:
        fake.put(load(name))
    pending = load("event-70-units-unschedulable.json")
    fake.put(pending["claim"])
    pod: Obj = fake.put(pending["pod"])
    return pod


def p70(**changes: Any) -> Obj:
    pod: Obj = copy.deepcopy(load("event-70-units-unschedulable.json")["pod"])
    for key, value in changes.items():
        pod["status"][key] = value
    return pod


def explainer(api: Any, pods: WaitingPods, **kwargs: Any) -> WaitingExplainer:
    return WaitingExplainer(
        api,
        pods,
        driver=DRIVER,
        device_class=DRIVER,
        reporting_instance="test",
        clock=lambda: NOW,
        **kwargs,
    )


# ------------------------------------------------------------------ the view
def test_only_unschedulable_pods_with_claims_are_kept_and_trimmed() -> None:
    pods = WaitingPods()
    pods.listed([p70()])
    assert len(pods) == 1
    assert pods.wake.is_set()
    (kept,) = pods.pods()
    assert set(kept) == {"metadata", "spec", "status"}
    assert kept["status"]["resourceClaimStatuses"][0]["resourceClaimName"] == "p70-gpu-nd7kc"
    assert "containers" not in kept["spec"]
    scheduled = p70(phase="Running")
    pods.changed("MODIFIED", scheduled)
    assert len(pods) == 0
    no_claims = p70()
    del no_claims["spec"]["resourceClaims"]
    pods.changed("ADDED", no_claims)
    assert len(pods) == 0
    not_yet_tried = p70(conditions=[])
    pods.changed("ADDED", not_yet_tried)
    assert len(pods) == 0


def test_only_a_new_verdict_wakes_the_explainer() -> None:
    pods = WaitingPods()
    pods.changed("ADDED", p70())
    pods.wake.clear()
    pods.changed("MODIFIED", p70())  # a status write that changes nothing we read
    assert not pods.wake.is_set()
    again = p70()
    again["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-27T06:30:00Z"
    pods.changed("MODIFIED", again)
    assert pods.wake.is_set()
    pods.changed("DELETED", again)
    assert len(pods) == 0


# ------------------------------------------------------------------ one pass
async def test_a_pending_pod_gets_one_event_saying_why(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    fake, _ = kube_api
    pod = put_captured_state(fake)
    pods = WaitingPods()
    pods.listed([pod])
    async with open_api_client() as (api, _):
        explain = explainer(api, pods)
        assert await explain.explain() == 1
        (event,) = fake.objects(*EVENT)
        assert event["reason"] == "NoGpuShareFits"
        assert event["type"] == "Warning"
        assert event["action"] == "Scheduling"
        assert event["reportingController"] == "gpu.metagpu.io/why-pending"
        assert event["regarding"]["uid"] == pod["metadata"]["uid"]
        assert event["note"] == P70_NOTE
        # the same reason next pass: not repeated
        assert await explain.explain() == 0
        assert len(fake.objects(*EVENT)) == 1


async def test_nothing_is_said_when_a_gpu_has_room_or_nothing_waits(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    fake, _ = kube_api
    pods = WaitingPods()
    async with open_api_client() as (api, _):
        explain = explainer(api, pods)
        assert await explain.explain() == 0  # no pods at all, and nothing listed
        assert not [r for r in fake.requests if r.resource == "resourceslices"]
        fake.put(load("resourceslice-consumable-accepted.json")["response"]["body"])
        fake.put(load("claim-60-units-b-allocated.json"))  # gpu-0 is free: the 70 fits
        pending = load("event-70-units-unschedulable.json")
        fake.put(pending["claim"])
        pods.listed([fake.put(pending["pod"])])
        assert await explain.explain() == 0
        assert fake.objects(*EVENT) == []


async def test_a_burst_is_written_a_bounded_number_per_pass(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    fake, _ = kube_api
    first = put_captured_state(fake)
    clones = []
    for i in range(2):
        clone = copy.deepcopy(first)
        clone["metadata"].update(name=f"p70-{i}", uid=f"uid-{i}")
        clones.append(fake.put(clone))
    pods = WaitingPods()
    pods.listed([first, *clones])
    pods.wake.clear()
    async with open_api_client() as (api, _):
        explain = explainer(api, pods, max_events_per_pass=2)
        assert await explain.explain() == 2
        assert pods.wake.is_set()  # the rest is due at once
        assert await explain.explain() == 1
        assert len(fake.objects(*EVENT)) == 3


# ------------------------------------------------------------------ metrics
def scraped(metrics: WebhookMetrics, name: str, **labels: str) -> float:
    """One sample's value from the webhook's registry, as Prometheus would read it."""
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


async def test_a_pass_reports_waiting_and_unplaceable_pods_events_and_its_duration(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    fake, _ = kube_api
    pod = put_captured_state(fake)
    twin = copy.deepcopy(pod)
    twin["metadata"].update(name="p70-twin", uid="uid-twin")
    pods = WaitingPods()
    pods.listed([pod, fake.put(twin)])
    metrics = WebhookMetrics()
    stats = metrics.dra_waiting
    ok = {"outcome": "ok"}
    passes = "metagpu_webhook_dra_waiting_pass_duration_seconds_count"
    async with open_api_client() as (api, _):
        explain = explainer(api, pods, metrics=stats)
        assert scraped(metrics, "metagpu_webhook_dra_waiting_pods") == 0  # not leading yet
        stats.lead(lambda: len(pods))
        assert await explain.explain() == 2
        assert scraped(metrics, "metagpu_webhook_dra_waiting_pods") == 2
        assert scraped(metrics, "metagpu_webhook_dra_unplaceable_pods") == 2
        written = {"result": "written"}
        assert scraped(metrics, "metagpu_webhook_dra_waiting_events_total", **written) == 2
        assert scraped(metrics, "metagpu_webhook_dra_waiting_events_total", result="failed") == 0
        assert scraped(metrics, passes, **ok) == 1
        assert scraped(metrics, "metagpu_webhook_dra_waiting_pass_duration_seconds_sum", **ok) > 0

        # A neighbour's 60 ends: both pods still wait for the scheduler's next try, but a
        # GPU now takes the 70, so no pod is unplaceable and nothing new is said.
        b = load(SIXTIES[1])["metadata"]
        fake.remove("resource.k8s.io/v1", "ResourceClaim", b["name"], b["namespace"])
        assert await explain.explain() == 0
        assert scraped(metrics, "metagpu_webhook_dra_waiting_pods") == 2
        assert scraped(metrics, "metagpu_webhook_dra_unplaceable_pods") == 0
        assert scraped(metrics, "metagpu_webhook_dra_waiting_events_total", **written) == 2
        assert scraped(metrics, passes, **ok) == 2

        # The pods are placed: nothing waits (no pass needed, none counted).
        pods.listed([])
        assert await explain.explain() == 0
        assert scraped(metrics, "metagpu_webhook_dra_waiting_pods") == 0
        assert scraped(metrics, "metagpu_webhook_dra_unplaceable_pods") == 0
        assert scraped(metrics, passes, **ok) == 2


async def test_failed_events_and_failed_passes_are_counted(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    fake, _ = kube_api
    pods = WaitingPods()
    pods.listed([put_captured_state(fake)])
    metrics = WebhookMetrics()
    async with open_api_client() as (api, _):
        explain = explainer(api, pods, metrics=metrics.dra_waiting)
        fake.fail_next("create", "events", status=500, reason="InternalError", message="boom")
        assert await explain.explain() == 0
        assert scraped(metrics, "metagpu_webhook_dra_waiting_events_total", result="failed") == 1
        assert scraped(metrics, "metagpu_webhook_dra_waiting_events_total", result="written") == 0
        assert scraped(metrics, "metagpu_webhook_dra_unplaceable_pods") == 1

        fake.fail_next("list", "resourceslices", status=500, reason="InternalError", message="x")
        with pytest.raises(RuntimeError, match="listing failed"):
            await explain.explain()
        error = {"outcome": "error"}
        assert (
            scraped(metrics, "metagpu_webhook_dra_waiting_pass_duration_seconds_count", **error)
            == 1
        )
        # The last completed pass's figure stands until the next one completes.
        assert scraped(metrics, "metagpu_webhook_dra_unplaceable_pods") == 1
        assert await explain.explain() == 1  # the Event that failed, written now
        assert scraped(metrics, "metagpu_webhook_dra_waiting_events_total", result="written") == 1


# ------------------------------------------------------- as the webhook runs it
async def test_the_leader_explains_waiting_pods_and_brings_the_reason_up_to_date(
    tmp_path: Path,
) -> None:
    """run_claim_templates with explain on: the controller's Pod watch feeds the view,
    a waiting pod gets its Event at once, a changed reason (a 60 shrank to 50, no pod
    event) a second one at the next refresh, and an unchanged reason none; the verbs
    are the declared ones."""
    dra = settings(mode="dra", dra={"gpu_memory_mib": 81920}).dra
    assert dra is not None
    metrics = WebhookMetrics()
    async with running_kube_api(FakeKubeApi(garbage_collector=False)) as (fake, url):
        put_captured_state(fake)
        client = await new_api_client(
            KubernetesConfig(kubeconfig=write_kubeconfig(url, tmp_path / "kubeconfig")), {}
        )
        task = asyncio.create_task(
            run_claim_templates(
                client,
                dra=dra,
                lease_name="metagpu-claim-templates",
                lease_namespace="metagpu",
                identity="a",
                timing=FAST,
                watch_timeout_s=1,
                explain=ExplainSettings(driver=DRIVER, refresh_s=0.2),
                metrics=metrics.dra_waiting,
            )
        )
        try:
            await eventually(lambda: len(fake.objects(*EVENT)) == 1)
            await eventually(lambda: scraped(metrics, "metagpu_webhook_dra_unplaceable_pods") == 1)
            assert scraped(metrics, "metagpu_webhook_dra_waiting_pods") == 1
            assert fake.objects(*EVENT)[0]["note"] == P70_NOTE
            assert fake.objects(*EVENT)[0]["reportingInstance"] == "a"

            def slice_lists() -> int:
                return sum(1 for r in fake.requests if r.resource == "resourceslices")

            seen = slice_lists()
            await eventually(lambda: slice_lists() >= seen + 2)  # two refreshes, same words
            assert len(fake.objects(*EVENT)) == 1

            smaller = load("claim-60-units-b-allocated.json")
            (result,) = smaller["status"]["allocation"]["devices"]["results"]
            result["consumedCapacity"]["units"] = "50"
            fake.put(smaller)
            await eventually(lambda: len(fake.objects(*EVENT)) == 2)
            newest = max(fake.objects(*EVENT), key=lambda e: int(e["metadata"]["resourceVersion"]))
            assert (
                "no single GPU has 70 free units (largest 50; 90 free in total)" in (newest["note"])
            )
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()
    # No longer leading (stopped): the replica reports 0, so max() across replicas is the
    # new leader's figure.
    assert scraped(metrics, "metagpu_webhook_dra_waiting_pods") == 0
    assert scraped(metrics, "metagpu_webhook_dra_unplaceable_pods") == 0
    assert scraped(metrics, "metagpu_webhook_dra_waiting_events_total", result="written") == 2
    declared = verb_set(claim_template_permissions("metagpu-claim-templates"))
    declared |= verb_set(WAITING_POD_PERMISSIONS)
    assert fake.verbs_used() <= declared
    assert verb_set(WAITING_POD_PERMISSIONS) <= fake.verbs_used()


async def test_lists_are_read_page_by_page(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims and slices come in pages (limit/continue), so a cluster of 10,000 claims never
    sits in the webhook's memory as one body; the words are the same."""
    monkeypatch.setattr(dra_waiting, "PAGE_SIZE", 1)
    fake, _ = kube_api
    pod = put_captured_state(fake)
    pods = WaitingPods()
    pods.listed([pod])
    async with open_api_client() as (api, _):
        assert await explainer(api, pods).explain() == 1
    (event,) = fake.objects(*EVENT)
    assert event["note"] == P70_NOTE
    claim_lists = [r for r in fake.requests if r.resource == "resourceclaims"]
    assert len(claim_lists) == 3  # three claims, one per page


def test_the_collector_is_paused_for_a_pass_and_always_restored() -> None:
    import gc

    assert gc.isenabled()
    with dra_waiting.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), dra_waiting.collector_paused():
        raise RuntimeError("a failed list")
    assert gc.isenabled()
    gc.disable()
    try:
        with dra_waiting.collector_paused():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()
