"""The HTTPS adapter: the 400 channel, health, readiness, metrics, the embedded default."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import logging
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from certs.files import BundlePaths
from certs.issue import inspect_cert, verify_chain
from tests.conftest import load_admission_fixture
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.http import ReviewClient
from webhook.config import WebhookConfig
from webhook.model import NamespaceFacts
from webhook.server import RunningWebhook, running_webhook

HALF = "pod-half-gpu.json"


def review(**changes: Any) -> dict[str, Any]:
    data = load_admission_fixture(HALF)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return data


_DELETE: Any = object()


@pytest.mark.parametrize(
    ("body", "content_type", "must_contain"),
    [
        pytest.param(b"{not json", "application/json", "request body is not JSON", id="not-json"),
        pytest.param(b"\xff\xfe", "application/json", "not UTF-8 JSON", id="not-utf8"),
        pytest.param(b"[1, 2]", "application/json", "must be a JSON object", id="array"),
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000, "application/json", "nested too deeply", id="deep"
        ),
        pytest.param(
            review(), "text/plain", "Content-Type must be application/json", id="text-plain"
        ),
        pytest.param(review(), None, "Content-Type must be application/json", id="no-content-type"),
        pytest.param(
            review(apiVersion="admission.k8s.io/v1beta1"),
            "application/json",
            "unsupported review apiVersion='admission.k8s.io/v1beta1'",
            id="v1beta1",
        ),
        pytest.param(review(kind="Pod"), "application/json", "kind='Pod'", id="wrong-kind"),
        pytest.param(review(request=None), "application/json", "has no request", id="no-request"),
        pytest.param(review(**{"request.uid": ""}), "application/json", "request.uid", id="no-uid"),
        pytest.param(
            review(**{"request.operation": "PATCH"}),
            "application/json",
            "request.operation",
            id="operation",
        ),
        pytest.param(
            review(**{"request.kind": "Pod"}), "application/json", "request.kind", id="kind-str"
        ),
        pytest.param(
            review(**{"request.object": None}),
            "application/json",
            "request.object is required",
            id="no-object",
        ),
        pytest.param(
            review(**{"request.object.spec.containers": {}}),
            "application/json",
            "request.object is not a valid Pod: spec.containers must be a list",
            id="pod-shape",
        ),
        pytest.param(
            review(**{"request.dryRun": "yes"}),
            "application/json",
            "request.dryRun",
            id="dry-run-str",
        ),
    ],
)
async def test_unusable_reviews_get_400_and_server_stays_up(
    client: ReviewClient, body: bytes | dict[str, Any], content_type: str | None, must_contain: str
) -> None:
    answer = await client.post(body, content_type=content_type)
    assert answer.status == 400
    assert must_contain in answer.text
    assert (await client.post(review())).status == 200


async def test_oversized_body_is_refused(ca_bundle: BundlePaths) -> None:
    config = webhook_config(ca_bundle, max_body_bytes=64 * 1024)
    big = review(**{"request.object.metadata.annotations": {"x": "y" * 70_000}})
    async with running_webhook(config) as hook, aiohttp.ClientSession() as session:
        c = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        answer = await c.post(big)
        assert answer.status == 400
        assert "larger than max_body_bytes (65536 bytes)" in answer.text

        async def chunks() -> Any:  # no Content-Length: the limit applies while reading
            data = json.dumps(big).encode()
            for i in range(0, len(data), 8192):
                yield data[i : i + 8192]

        async with session.post(
            c.url + "/mutate",
            data=chunks(),
            headers={"Content-Type": "application/json"},
            ssl=c.ssl_context,
        ) as r:
            assert r.status == 400
            assert "larger than max_body_bytes" in await r.text()
        assert (await c.post(review())).status == 200


async def test_wrong_method_and_path(client: ReviewClient) -> None:
    assert (await client.get("/mutate")).status == 405
    assert (await client.post(review(), path="/validate")).status == 404


async def test_health_ready_and_metrics(client: ReviewClient, webhook: RunningWebhook) -> None:
    assert (await client.get("/healthz")).text == "ok\n"
    ready = await client.get("/readyz")
    assert ready.status == 200
    report = json.loads(ready.text)
    assert report["ready"] is True
    assert report["tls"]["serial"] == f"{webhook.tls.current.info.serial:x}"

    await client.post(review())  # mutated
    await client.post(load_admission_fixture("pod-no-gpu.json"))  # unchanged
    await client.post(load_admission_fixture("pod-0.333-gpu.json"))  # denied
    await client.post(b"nope")  # error
    samples = scrape((await client.get("/metrics")).text)
    for name, labels, value in (
        ("metagpu_webhook_requests_total", {"outcome": "allowed-mutated", "target": "pod"}, 1),
        ("metagpu_webhook_requests_total", {"outcome": "allowed-unchanged", "target": "pod"}, 1),
        ("metagpu_webhook_requests_total", {"outcome": "denied", "target": "pod"}, 1),
        ("metagpu_webhook_requests_total", {"outcome": "error", "target": "invalid"}, 1),
        ("metagpu_webhook_request_duration_seconds_count", {"outcome": "allowed-mutated"}, 1),
        (
            "metagpu_webhook_tls_cert_not_after_seconds",
            {},
            webhook.tls.current.info.not_after.timestamp(),
        ),
    ):
        assert samples[(name, tuple(sorted(labels.items())))] == value


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text → ``{(sample name, sorted labels): value}``."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class FakeNamespaces:
    """A NamespaceSource with scripted facts and readiness.

    ``cached=True`` answers every name without I/O (a synced cache);
    ``cached=False`` makes every review take the awaited lookup (a miss).
    """

    def __init__(
        self, facts: dict[str, NamespaceFacts], *, ready: bool = True, cached: bool = True
    ) -> None:
        self._facts = facts
        self._cached = cached
        self.ready = ready
        self.status = "fake"
        self.asked: list[tuple[str, str]] = []

    def cached(self, name: str) -> NamespaceFacts | None:
        if not self._cached:
            return None
        self.asked.append(("cached", name))
        return self._facts.get(name, NamespaceFacts())

    async def facts(self, name: str) -> NamespaceFacts:
        await asyncio.sleep(0)  # a real miss suspends: let the rest of the batch go on
        self.asked.append(("fetched", name))
        return self._facts.get(name, NamespaceFacts())


@pytest.mark.parametrize("how", ["cached", "fetched"])
async def test_namespace_facts_reach_the_rules_and_the_warnings(
    ca_bundle: BundlePaths, how: str
) -> None:
    source = FakeNamespaces(
        {"team-a": NamespaceFacts(compute_policy="fixed", warnings=("namespace cache degraded",))},
        cached=how == "cached",
    )
    async with (
        running_webhook(webhook_config(ca_bundle), namespaces=source) as hook,
        aiohttp.ClientSession() as session,
    ):
        c = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        answer = await c.post(review())
        not_ours = await c.post(load_admission_fixture("pod-update-no-gpu.json"))
    assert source.asked == [(how, "team-a")]  # pod UPDATE needs no namespace facts
    assert not_ours.status == 200
    assert "namespace cache degraded" in answer.response["warnings"]
    ops: dict[str, Any] = {op["path"]: op.get("value") for op in answer.patch}
    assert ops["/metadata/annotations/metagpu.io~1compute-policy"] == "fixed"
    env = ops["/spec/containers/0/env"]
    assert {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "50"} in env


async def test_readiness_waits_for_the_namespace_source(ca_bundle: BundlePaths) -> None:
    source = FakeNamespaces({}, ready=False)
    async with (
        running_webhook(webhook_config(ca_bundle), namespaces=source) as hook,
        aiohttp.ClientSession() as session,
    ):
        c = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        assert (await c.get("/readyz")).status == 503
        assert (await c.post(review())).status == 200  # serving does not wait
        source.ready = True
        assert (await c.get("/readyz")).status == 200
        hook.state.draining = True
        answer = await c.get("/readyz")
        assert answer.status == 503
        assert json.loads(answer.text)["draining"] is True


async def test_embedded_default_generates_then_reuses_its_ca(tmp_path: Path) -> None:
    config = WebhookConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "tls": {"generate_dir": str(tmp_path / "tls")},
            "kubernetes": {"enabled": False},
        }
    )
    async with running_webhook(config) as hook:
        assert hook.ca_file == tmp_path / "tls" / "ca.crt"
        info = inspect_cert((tmp_path / "tls" / "tls.crt").read_bytes())
        assert set(info.dns_names) == {"localhost"}
        assert set(info.ip_addresses) == {"127.0.0.1", "::1"}
        first_ca = hook.ca_file.read_bytes()
        async with aiohttp.ClientSession() as session:
            c = ReviewClient(session, hook.url, client_context(hook.ca_file))
            assert (await c.post(review())).status == 200
    async with running_webhook(config) as hook:
        assert hook.ca_file is not None
        assert hook.ca_file.read_bytes() == first_ca


def _local_config(directory: Path) -> WebhookConfig:
    return WebhookConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "tls": {"generate_dir": str(directory)},
            "kubernetes": {"enabled": False},
        }
    )


async def test_embedded_default_renews_the_serving_certificate_and_keeps_its_ca(
    tmp_path: Path,
) -> None:
    """The CA a developer trusted (or pasted into a kind cluster's caBundle) stays."""
    config = _local_config(tmp_path)
    async with running_webhook(config):
        pass
    first = {name: (tmp_path / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt")}
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=300)  # serving cert due, CA not
    async with running_webhook(config, clock=lambda: later) as hook:
        served = hook.tls.current.info
    assert (tmp_path / "ca.crt").read_bytes() == first["ca.crt"]
    assert (tmp_path / "ca.key").read_bytes() == first["ca.key"]
    assert (tmp_path / "tls.crt").read_bytes() != first["tls.crt"]
    assert served.serial == inspect_cert((tmp_path / "tls.crt").read_bytes()).serial
    verify_chain((tmp_path / "tls.crt").read_bytes(), first["ca.crt"], now=later)


async def test_embedded_default_renews_a_due_ca_with_its_own_key(tmp_path: Path) -> None:
    config = _local_config(tmp_path)
    async with running_webhook(config):
        pass
    first_ca, first_key = (tmp_path / "ca.crt").read_bytes(), (tmp_path / "ca.key").read_bytes()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=3000)  # the 10-year CA is due
    async with running_webhook(config, clock=lambda: later):
        pass
    assert (tmp_path / "ca.crt").read_bytes() != first_ca
    assert (tmp_path / "ca.key").read_bytes() == first_key
    # a client that trusted the first CA certificate still accepts the new serving certificate
    verify_chain((tmp_path / "tls.crt").read_bytes(), first_ca, now=later)


async def test_embedded_default_replaces_a_bundle_without_a_ca_key(tmp_path: Path) -> None:
    """Earlier versions kept no ca.key: such a CA cannot sign, so it is replaced, once."""
    config = _local_config(tmp_path)
    async with running_webhook(config):
        pass
    (tmp_path / "ca.key").unlink()
    old_ca = (tmp_path / "ca.crt").read_bytes()
    async with running_webhook(config):
        pass
    new_ca = (tmp_path / "ca.crt").read_bytes()
    assert new_ca != old_ca
    assert (tmp_path / "ca.key").exists()
    async with running_webhook(config) as hook:
        assert hook.ca_file is not None
        assert hook.ca_file.read_bytes() == new_ca


async def test_untrusted_client_cannot_connect(webhook: RunningWebhook) -> None:
    ctx = ssl.create_default_context()  # system CAs only: our CA is not among them
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(webhook.url + "/healthz", ssl=ctx)


async def test_ipv6_listen(ca_bundle: BundlePaths, tmp_path: Path) -> None:
    config = WebhookConfig.model_validate(
        {
            "listen": "[::1]:0",
            "tls": {"generate_dir": str(tmp_path)},
            "kubernetes": {"enabled": False},
        }
    )
    try:
        async with running_webhook(config) as hook:
            assert hook.url.startswith("https://[::1]:")
            assert hook.ca_file is not None
            async with aiohttp.ClientSession() as session:
                c = ReviewClient(session, hook.url, client_context(hook.ca_file))
                assert (await c.post(review())).status == 200
    except OSError as exc:  # a host without IPv6 loopback
        pytest.skip(f"no IPv6 loopback: {exc}")


async def test_concurrent_requests_are_independent(client: ReviewClient) -> None:
    """Reviews answered in one batch get exactly the answers they get one at a time.

    A mix of outcomes (mutated, denied, unchanged, refused with 400) with a
    distinct uid each, sent 40 at once so that the server batches them.
    """
    sources = [
        review(),
        load_admission_fixture("pod-0.333-gpu.json"),
        load_admission_fixture("pod-update-no-gpu.json"),
        None,  # not JSON: a 400
    ]
    bodies: list[bytes] = []
    for i in range(40):
        source = sources[i % len(sources)]
        if source is None:
            bodies.append(b'{"apiVersion": "admission.k8s.io/v1", "uid-%d' % i)
            continue
        data = copy.deepcopy(source)
        data["request"]["uid"] = f"uid-{i}"
        bodies.append(json.dumps(data).encode())
    alone = [await client.post(b) for b in bodies]
    together = await asyncio.gather(*(client.post(b) for b in bodies))
    assert [(a.status, a.text) for a in together] == [(a.status, a.text) for a in alone]
    assert {a.status for a in alone} == {200, 400}
    assert [a.response["uid"] for a in together if a.status == 200] == [
        f"uid-{i}" for i in range(40) if i % len(sources) != 3
    ]


async def test_denials_are_logged_with_the_object_reference(
    client: ReviewClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="webhook.server")
    denied = await client.post(load_admission_fixture("pod-0.333-gpu.json"))
    mutated = await client.post(review())
    assert denied.status == 200
    assert denied.response["allowed"] is False
    assert mutated.status == 200
    records = {r.getMessage().split(":")[0]: r for r in caplog.records}
    assert records["denied"].__dict__["object_name"] == "third"
    assert records["denied"].__dict__["namespace"] == "team-a"
    assert records["mutated"].__dict__["operations"] == len(mutated.patch)


def _broken_admit(*args: object, **kwargs: object) -> None:
    """Stands in for the rules to play a bug in them."""
    raise RuntimeError("boom")


async def test_a_bug_in_the_rules_is_a_500_and_the_server_stays_up(
    client: ReviewClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import webhook.server

    monkeypatch.setattr(webhook.server, "admit", _broken_admit)
    answer = await client.post(review())
    assert answer.status == 500
    assert "internal error reviewing uid 6a07c661" in answer.text
    assert any("internal error while reviewing" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert (await client.post(review())).status == 200


async def test_a_bug_after_a_namespace_lookup_is_a_500_too(
    ca_bundle: BundlePaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review that waited for its namespace (not cached) is answered off the batch."""
    import webhook.server

    source = FakeNamespaces({}, cached=False)
    async with (
        running_webhook(webhook_config(ca_bundle), namespaces=source) as hook,
        aiohttp.ClientSession() as session,
    ):
        c = ReviewClient(session, hook.url, client_context(ca_bundle.ca_file))
        monkeypatch.setattr(webhook.server, "admit", _broken_admit)
        answer = await c.post(review())
        monkeypatch.undo()
        after = await c.post(review())
        samples = scrape((await c.get("/metrics")).text)
    errors = samples[("metagpu_webhook_requests_total", (("outcome", "error"), ("target", "pod")))]
    assert source.asked == [("fetched", "team-a"), ("fetched", "team-a")]
    assert answer.status == 500
    assert "internal error reviewing uid 6a07c661" in answer.text
    assert after.status == 200
    assert errors == 1


def _half_gpu_body(transform: Any) -> bytes:
    data = review()
    transform(data["request"]["object"]["spec"]["containers"][0])
    return json.dumps(data).encode()


def _set_gpu(container: dict[str, Any], value: object) -> None:
    for side in ("limits", "requests"):
        container["resources"][side]["nvidia.com/gpu"] = value


@pytest.mark.parametrize(
    ("body", "must_contain"),
    [
        pytest.param(
            _half_gpu_body(lambda c: c.update(name="\ud800")),
            "request body is not JSON",
            id="lone-surrogate-was-a-500",
        ),
        pytest.param(
            _half_gpu_body(lambda c: _set_gpu(c, float("nan"))),
            "NaN is not a JSON number",
            id="nan-quantity",
        ),
        pytest.param(
            _half_gpu_body(lambda c: _set_gpu(c, float("inf"))),
            "Infinity is not a JSON number",
            id="infinite-quantity",
        ),
    ],
)
async def test_what_is_not_json_is_refused_although_python_reads_it(
    client: ReviewClient, body: bytes, must_contain: str
) -> None:
    """``json.loads`` takes NaN, Infinity and lone surrogates; JSON does not, nor do we (400)."""
    answer = await client.post(body)
    assert answer.status == 400
    assert must_contain in answer.text


async def test_quantities_sent_as_json_numbers_are_read_exactly(client: ReviewClient) -> None:
    answer = await client.post(_half_gpu_body(lambda c: _set_gpu(c, 0.5)))
    assert answer.status == 200
    assert answer.response["allowed"] is True
    limits = {op["path"]: op.get("value") for op in answer.patch}
    assert limits["/spec/containers/0/resources/limits/cnvrg.io~1metagpu"] == "50"
    third = await client.post(_half_gpu_body(lambda c: _set_gpu(c, 0.333)))
    assert third.response["allowed"] is False
    assert (
        "nvidia.com/gpu 0.333 is not a whole number of units" in third.response["status"]["message"]
    )
