"""The admission warning: a namespace whose quotas limit nvidia.com/gpu but not the metagpu
resource hears so when an object is converted, through the real webhook over HTTPS, with the
quota cache fed by the fake API server's list and watch (no I/O per review)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from certs.files import BundlePaths
from plugin.api.permissions import verb_set
from tests.conftest import load_admission_fixture
from tests.harness.kube_api import FakeKubeApi
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.http import HttpAnswer, ReviewClient
from tests.webhook.quotas.builders import SETTINGS, for_put, quota
from tests.webhook.waiting import eventually
from webhook.admission import admit
from webhook.config import KubernetesConfig, WebhookConfig
from webhook.model import NamespaceFacts, RuleSettings
from webhook.namespaces import new_api_client
from webhook.permissions import QUOTA_CACHE_PERMISSIONS
from webhook.quotas.cache import QuotaCache
from webhook.quotas.coverage import (
    NamespaceQuotas,
    kind_of,
    uncounted_claims_warning,
    unmirrored_warning,
)
from webhook.quotas.mirror import MirrorSettings
from webhook.review import MAX_WARNING_CHARS, AdmissionRequest
from webhook.server import running_webhook

RQ = ("v1", "ResourceQuota")


def quota_warnings(answer: HttpAnswer) -> list[str]:
    return [w for w in answer.response.get("warnings", []) if "ResourceQuota" in w]


@pytest.fixture
async def client(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path, ca_bundle: BundlePaths
) -> AsyncIterator[ReviewClient]:
    config = webhook_config(ca_bundle, kubernetes={"enabled": "auto"})
    async with running_webhook(config, env=os.environ) as hook, aiohttp.ClientSession() as s:
        c = ReviewClient(s, hook.url, client_context(ca_bundle.ca_file))
        await eventually(lambda: _ready(c))
        yield c


async def _ready(c: ReviewClient) -> bool:
    return (await c.get("/readyz")).status == 200


async def test_a_converted_pod_hears_that_the_gpu_quota_does_not_count_it(
    kube_api: tuple[FakeKubeApi, str], client: ReviewClient
) -> None:
    api, _ = kube_api
    review = load_admission_fixture("pod-half-gpu.json")
    assert quota_warnings(await client.post(review)) == []  # no quota, nothing to say

    api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "2"})))

    async def warned() -> bool:
        return bool(quota_warnings(await client.post(review)))

    await eventually(warned)
    answer = await client.post(review)
    assert answer.response["allowed"] is True
    assert answer.patch  # converted
    [warning] = quota_warnings(answer)
    assert warning == (
        'ResourceQuota "gpus" limits nvidia.com/gpu but not cnvrg.io/metagpu in this '
        "namespace; these units are not counted. Fix: quotaMirror.enabled=true, or "
        "requests.cnvrg.io/metagpu (100/GPU) in a quota (docs/quotas.md)"
    )

    # Workload templates are converted too, and warned the same way.
    workload = await client.post(load_admission_fixture("deployment-half-gpu.json"))
    assert len(quota_warnings(workload)) == 1

    # A pod that asks for no GPU is not converted: no metagpu warning on every `kubectl run`.
    assert quota_warnings(await client.post(load_admission_fixture("pod-no-gpu.json"))) == []
    # A whole GPU is counted by the quota: no warning even though a sidecar is mutated.
    whole = {**review, "request": _whole_gpu_pod_with_sidecar()}
    answer = await client.post(whole)
    assert answer.patch
    assert quota_warnings(answer) == []

    # Once the units are limited (the mirror's companion, or the operator's own): quiet.
    api.put(for_put(quota("gpus-metagpu", {"requests.cnvrg.io/metagpu": "200"})))

    async def quiet() -> bool:
        return not quota_warnings(await client.post(review))

    await eventually(quiet)
    assert api.writes() == []


async def test_the_cache_follows_quotas_and_reads_only_what_it_declares(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"})))
    api.put(for_put(quota("cpu", {"requests.cpu": "1"}, namespace="team-b")))
    client = await new_api_client(KubernetesConfig(), os.environ)
    async with QuotaCache(client, settings=SETTINGS, watch_timeout_s=1) as cache:
        await cache.wait_synced()
        assert len(cache.warnings("team-a")) == 1
        assert cache.warnings("team-b") == ()
        api.put(for_put(quota("gpus", {"limits.nvidia.com/gpu": "1"}, namespace="team-b")))
        await eventually(lambda: len(cache.warnings("team-b")) == 1)
        api.remove(*RQ, "gpus", "team-a")
        await eventually(lambda: cache.warnings("team-a") == ())
        # A change the watch never delivers (its history compacted at once): the next
        # watch gets 410 Gone, and only the fresh list can bring it.
        api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"}, namespace="team-c")))
        api.compact()
        await eventually(lambda: len(cache.warnings("team-c")) == 1)
        assert len(cache.warnings("team-b")) == 1
        assert [r.verb for r in api.requests].count("list") == 2
        await eventually(lambda: any(r.verb == "watch" for r in api.requests))
    assert api.verbs_used() == verb_set(QUOTA_CACHE_PERMISSIONS)


async def test_the_cache_is_bounded(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    for i in range(5):
        api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "1"}, namespace=f"ns-{i}")))
    client = await new_api_client(KubernetesConfig(), os.environ)
    async with QuotaCache(client, settings=SETTINGS, max_quotas=3) as cache:
        await cache.wait_synced()
        assert sum(bool(cache.warnings(f"ns-{i}")) for i in range(5)) == 3


def test_warning_fits_what_the_api_server_keeps() -> None:
    usual = unmirrored_warning(["gpu-budget"], SETTINGS)
    assert len(usual) <= MAX_WARNING_CHARS
    kinds = NamespaceQuotas({f"{'q' * 100}{i}": "gpus" for i in range(5)})
    longest = unmirrored_warning(kinds.unmirrored(), SETTINGS)
    assert f'ResourceQuota "{"q" * 27}..." (+4 more)' in longest
    assert len(longest) <= MAX_WARNING_CHARS
    assert NamespaceQuotas({"a": "gpus", "b": "units"}).unmirrored() == []
    assert NamespaceQuotas({"a": "both"}).unmirrored() == []


# ------------------------------------------------- which admitted objects hear it
WARNING = ("the GPU quota does not count units",)


def _review(name: str) -> dict[str, Any]:
    request: dict[str, Any] = load_admission_fixture(name)["request"]
    return request


def _whole_gpu_pod_with_sidecar() -> dict[str, Any]:
    request = _review("pod-half-gpu.json")
    spec = request["object"]["spec"]
    spec["runtimeClassName"] = "nvidia"
    spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    spec["containers"].append({"name": "side", "image": "busybox"})
    return request


def _cronjob_template_in_units() -> dict[str, Any]:
    request = _review("statefulset-metagpu-20.json")
    template = request["object"]["spec"]["template"]
    request["kind"] = {"group": "batch", "version": "v1", "kind": "CronJob"}
    request["object"] = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "team-a"},
        "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}},
    }
    return request


@pytest.mark.parametrize(
    ("request_body", "warned"),
    [
        pytest.param(_review("pod-half-gpu.json"), True, id="fraction-converted"),
        pytest.param(_review("deployment-half-gpu.json"), True, id="template-converted"),
        pytest.param(_review("statefulset-metagpu-20.json"), True, id="template-already-units"),
        pytest.param(_cronjob_template_in_units(), True, id="cronjob-template-units"),
        pytest.param(
            _review("pod-init-sidecar-two-containers-fractions.json"), True, id="init-containers"
        ),
        pytest.param(_review("pod-no-gpu.json"), False, id="no-gpu"),
        pytest.param(_whole_gpu_pod_with_sidecar(), False, id="whole-gpu-is-counted"),
        pytest.param(_review("pod-0.333-gpu.json"), False, id="denied"),
    ],
)
def test_only_objects_that_ask_for_units_hear_it(
    request_body: dict[str, Any], warned: bool
) -> None:
    settings = RuleSettings.from_config(WebhookConfig())
    facts = NamespaceFacts(unit_warnings=WARNING)
    decision = admit(cast(AdmissionRequest, request_body), settings=settings, namespace=facts)
    assert (WARNING[0] in decision.warnings) is warned
    plain = admit(cast(AdmissionRequest, request_body), settings=settings)
    assert decision.warnings[: len(plain.warnings)] == plain.warnings  # only added to


# ------------------------------------------------------------------ DRA mode
DRA_SETTINGS = MirrorSettings(
    resource_name="cnvrg.io/metagpu", units_per_gpu=100, claim_device_class="gpu.metagpu.io"
)
DRA_CONFIG: dict[str, Any] = {"mode": "dra", "dra": {"gpu_memory_mib": 81920}}


def test_in_dra_mode_only_a_devices_quota_counts_the_shares() -> None:
    """A claim holds neither nvidia.com/gpu nor units: only the DeviceClass's devices key
    counts it (the ResourceClaim quota evaluator), so that is what the warning asks for."""
    devices = {"gpu.metagpu.io.deviceclass.resource.k8s.io/devices": "4"}
    assert kind_of(quota("shares", devices), DRA_SETTINGS) == "devices"
    assert kind_of(quota("shares", devices), SETTINGS) is None  # device-plugin mode
    assert kind_of(quota("gpus", {"requests.nvidia.com/gpu": "2"}), DRA_SETTINGS) == "gpus"
    kinds = NamespaceQuotas({"gpus": "gpus", "units": "units"})
    assert kinds.uncounted_claims() == ["gpus", "units"]
    assert kinds.unmirrored() == []  # device-plugin mode would be content with the units
    assert NamespaceQuotas({"gpus": "gpus", "shares": "devices"}).uncounted_claims() == []
    long = NamespaceQuotas({f"{'q' * 100}{i}": "both" for i in range(5)})
    warning = uncounted_claims_warning(long.uncounted_claims(), DRA_SETTINGS)
    assert len(warning) <= MAX_WARNING_CHARS
    assert "gpu.metagpu.io.deviceclass.resource.k8s.io/devices (shares at once)" in warning


@pytest.mark.parametrize(
    ("request_body", "warned"),
    [
        pytest.param(_review("pod-half-gpu.json"), True, id="fraction-becomes-a-claim"),
        pytest.param(_review("deployment-half-gpu.json"), True, id="template-gets-claims"),
        pytest.param(_review("pod-no-gpu.json"), False, id="no-gpu"),
        pytest.param(_review("pod-0.333-gpu.json"), False, id="denied"),
    ],
)
def test_in_dra_mode_objects_given_a_claim_hear_it(
    request_body: dict[str, Any], warned: bool
) -> None:
    settings = RuleSettings.from_config(WebhookConfig.model_validate(DRA_CONFIG))
    facts = NamespaceFacts(unit_warnings=WARNING)
    decision = admit(cast(AdmissionRequest, request_body), settings=settings, namespace=facts)
    assert (WARNING[0] in decision.warnings) is warned


async def test_the_cache_says_the_dra_warning_and_goes_quiet_with_a_devices_quota(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    api, _ = kube_api
    api.put(for_put(quota("gpus", {"requests.nvidia.com/gpu": "2"})))
    client = await new_api_client(KubernetesConfig(kubeconfig=kube_config_env), {})
    try:
        async with QuotaCache(client, settings=DRA_SETTINGS, watch_timeout_s=1) as cache:
            await eventually(lambda: bool(cache.warnings("team-a")))
            (warning,) = cache.warnings("team-a")
            assert warning.startswith('ResourceQuota "gpus" limits GPUs or units, which DRA')
            devices = {"gpu.metagpu.io.deviceclass.resource.k8s.io/devices": "4"}
            api.put(for_put(quota("shares", devices)))
            await eventually(lambda: not cache.warnings("team-a"))
    finally:
        await client.close()
