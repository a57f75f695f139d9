"""The HTTPS shell around the rules (adapter): app factory, handlers, TLS, runner.

``POST /mutate`` reads the body, then queues it: the reviews that arrived in
one event-loop iteration are decoded, judged by :func:`webhook.admission.admit`
and encoded back to back in one callback (:mod:`webhook.batching`), which keeps
the parser's and the rules' code in cache under load. The namespace facts come
from the cache without I/O; a namespace it does not know is looked up (the only
I/O) by the request's own handler, off the batch.
``GET /healthz`` (the process answers), ``/readyz`` (namespace cache synced or
given up on, not draining) and ``/metrics`` (Prometheus) share the port and
the certificate: the kubelet probes with ``scheme: HTTPS`` and skips
verification.

Two error channels, as in kopf's ``_serve``:

* the *review* is unusable (not JSON, wrong ``Content-Type``, larger than
  ``max_body_bytes``, not ``admission.k8s.io/v1``, an object that is not shaped
  like its kind): HTTP 400 with a plain-text message. The API server reports it
  as a webhook failure; the server stays up.
* the *pod* breaks policy: HTTP 200, ``allowed: false`` and ``status.message``,
  which kubectl shows the user as the reason.

TLS: :class:`certs.tls.ReloadingTLS` builds the listener's context once and
points every new handshake at the newest good certificate, so a rotated
Secret is served without a restart and without touching open connections; a
``cleanup_ctx`` task polls the files. Without ``tls.cert_file`` the embedded
default generates (or reuses) a local CA (:mod:`webhook.embedded`).

Connections (:mod:`webhook.connections`): the listener is ours, not an
aiohttp site, so each connection has a budget, a deadline for its handshake,
headers, body and answer, and an idle timeout longer than the API server's.

Shutdown (after SIGTERM, handled once at the top by the CLI): readiness turns
503, the listener keeps accepting for ``drain_delay_s`` (endpoints take a
moment to drop the pod), then it stops accepting, closes connections that hold
no complete request headers, and keeps reading and answering every request
whose headers had arrived, for at most ``shutdown_timeout_s``; it ends as soon
as the last is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import gc
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final

from aiohttp import hdrs, web

from certs.tls import Rejection, ReloadingTLS, ServingPair
from webhook import logguard
from webhook.admission import Target, admit, classify, namespace_to_look_up
from webhook.batching import Batcher
from webhook.claimtemplate_service import claim_templates
from webhook.clienttext import MAX_MESSAGE_BYTES, trim_text
from webhook.config import WebhookConfig
from webhook.connections import Listener, fit_to_fd_limit
from webhook.embedded import ensure_local_bundle
from webhook.metrics import METRICS_CONTENT_TYPE, Outcome, WebhookMetrics
from webhook.model import (
    NO_NAMESPACE_FACTS,
    Decision,
    Denial,
    NamespaceFacts,
    PodShapeError,
    RuleSettings,
)
from webhook.namespaces import NamespaceSource
from webhook.quotas.service import namespace_source, quota_mirror
from webhook.review import (
    AdmissionRequest,
    ReviewError,
    decode_review,
    encode_response,
)

logger = logging.getLogger(__name__)

MUTATE_PATH: Final = "/mutate"
JSON: Final = "application/json"
LINGER_S: Final = 2.0
MAX_BIG_REVIEWS: Final = 4
"""Big reviews held at once, from their body to their answer: at most 4 x (4 MiB
body + its answer) pinned by clients that post big reviews and never read."""
BIG_REVIEW_BYTES: Final = 256 * 1024
"""Reviews larger than this are judged in a worker thread, one at a time
(:func:`_review_big`): eight clients posting 4 MB reviews back to back once
made a small review wait 668 ms, each big one a long turn of the event loop.
Real pods are a few KiB; the API server's limit is 3 MiB."""


@dataclass
class WebhookState:
    """Everything the handlers share; one per app, stored under :data:`STATE_KEY`."""

    config: WebhookConfig
    settings: RuleSettings
    metrics: WebhookMetrics
    tls: ReloadingTLS | None = None
    namespaces: NamespaceSource | None = None
    """Set by the app's start-up (or injected by tests); None before start-up."""
    draining: bool = False
    env: Mapping[str, str] | None = None
    """Environment for ``kubernetes.enabled: auto`` detection (``os.environ`` when None)."""
    listener: Listener | None = None
    """The connections (set once listening; None for an app served some other way)."""
    big_reviews: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One review larger than :data:`BIG_REVIEW_BYTES` judged at a time (:func:`_review_big`)."""
    big_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_BIG_REVIEWS))
    """Big reviews read, judged or being sent at once (:func:`_handle_big`)."""


STATE_KEY: Final = web.AppKey("metagpu_webhook_state", WebhookState)
REVIEWS_KEY: Final = web.AppKey("metagpu_webhook_reviews", Batcher[tuple[bytes, float], "Reviewed"])


def create_app(state: WebhookState) -> web.Application:
    """The aiohttp application: routes, state, and the background tasks' lifecycles."""
    app = web.Application(client_max_size=state.config.max_body_bytes)
    app.on_response_prepare.append(_answering)
    app[STATE_KEY] = state
    app[REVIEWS_KEY] = Batcher(functools.partial(_review, state))
    app.router.add_post(MUTATE_PATH, handle_mutate)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/metrics", handle_metrics)
    app.cleanup_ctx.append(_namespace_source)
    app.cleanup_ctx.append(_quota_mirror)
    app.cleanup_ctx.append(_claim_templates)
    if state.tls is not None:
        app.cleanup_ctx.append(_certificate_watch)
    return app


# ------------------------------------------------------------ handlers
async def handle_mutate(request: web.Request) -> web.Response:
    """Checks what aiohttp can check, then queues the body for :func:`_review`.

    The review itself runs in a batch with the others that arrived in the same
    event-loop iteration (:mod:`webhook.batching`); only a namespace the
    cache does not know comes back here to be looked up (the one await).
    """
    state = request.app[STATE_KEY]
    started = time.perf_counter()
    max_bytes = state.config.max_body_bytes
    # The API server sends exactly "application/json": compare the raw header first and
    # parse it (parameters such as charset are fine) only when it differs.
    if request.headers.get("Content-Type") != JSON and request.content_type != JSON:
        given = request.headers.get("Content-Type")
        return _bad_request(
            state, started, f"Content-Type must be {JSON} (an AdmissionReview), got {given!r}"
        )
    length = request.content_length
    if length is not None and length > max_bytes:
        return _bad_request(state, started, _too_large(length, max_bytes))
    if length is None or length > BIG_REVIEW_BYTES:
        return await _handle_big(request, state, started)
    body = await _read_body(request, state, started)
    if isinstance(body, web.Response):
        return body
    reviewed = await request.app[REVIEWS_KEY].submit((body, started))
    if isinstance(reviewed, web.Response):
        return reviewed
    review, target = reviewed.review, reviewed.target
    try:
        facts = await reviewed.source.facts(reviewed.namespace)
        return _answer(state, review, target=target, namespace=facts, started=started)
    except Exception:
        return _internal_error(state, review, target, started)


async def _read_body(
    request: web.Request, state: WebhookState, started: float
) -> bytes | web.Response:
    """The whole body within ``body_timeout_s``, or the answer that says why not."""
    max_bytes = state.config.max_body_bytes
    timeout_s = state.config.connections.body_timeout_s
    try:
        if request.content.is_eof():  # all there (the usual case): no timer to set
            return await request.read()
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _bad_request(state, started, _too_large(None, max_bytes))
    except TimeoutError:
        response = _bad_request(
            state, started, f"request body not complete within {timeout_s:g}s", status=408
        )
        response.force_close()
        return response
    except ConnectionError as exc:  # the client went away mid-body: its business, not ours
        logger.debug("client disconnected before its body arrived", extra={"error": str(exc)})
        return web.Response(status=400, text="incomplete request body\n")


async def _handle_big(request: web.Request, state: WebhookState, started: float) -> web.Response:
    """A review over :data:`BIG_REVIEW_BYTES` (or of unknown length), in one of
    :data:`MAX_BIG_REVIEWS` slots held from reading its body to sending its answer.

    So what big reviews pin is bounded whatever clients do: a client that never
    reads its answer holds a slot until ``write_timeout_s`` drops it, and waiting
    reviews are not read meanwhile (their bytes wait in the kernel, not here).
    Small reviews never wait for a slot.
    """
    listener = state.listener
    conn = listener.connection_of(request.protocol) if listener is not None else None
    if conn is not None:
        conn.handling()  # waiting for a slot may take long; the body timeout still holds
    async with state.big_slots:
        body = await _read_body(request, state, started)
        if isinstance(body, web.Response):
            return body
        response = await _review_big(state, body, started)
        try:  # sent here, in the slot; on_response_prepare starts the write deadline
            await response.prepare(request)
            await response.write_eof()  # returns once the client has taken most of it
        except ConnectionError:
            logger.debug("client went away before taking its answer")
        return response


@dataclass(frozen=True, slots=True)
class NamespaceNeeded:
    """A review that waits for its namespace's facts (not cached: one GET)."""

    review: AdmissionRequest
    target: Target
    source: NamespaceSource
    namespace: str


Reviewed = web.Response | NamespaceNeeded
"""What :func:`_review` gives the handler: the answer, or the lookup it needs first."""


def _review(state: WebhookState, received: tuple[bytes, float]) -> Reviewed:
    """One review, synchronously, from the body to the HTTP answer (run by the batcher)."""
    body, started = received
    try:
        review = decode_review(body)
    except ReviewError as exc:
        return _bad_request(state, started, str(exc))
    target: Target = "other"  # for the metrics, should classify itself fail
    try:
        target = classify(review)
        facts = NO_NAMESPACE_FACTS
        ns_name = namespace_to_look_up(review, target=target)
        source = state.namespaces
        if ns_name is not None and source is not None:
            known = source.cached(ns_name)
            if known is None:
                return NamespaceNeeded(review, target, source, ns_name)
            facts = known
        return _answer(state, review, target=target, namespace=facts, started=started)
    except Exception:
        return _internal_error(state, review, target, started)


def _internal_error(
    state: WebhookState, review: AdmissionRequest, target: Target, started: float
) -> web.Response:
    """A bug, not a bad review: say so (500), count it, keep serving."""
    logger.exception("internal error while reviewing", extra=_ref(review))
    state.metrics.observe("error", target, time.perf_counter() - started)
    return web.Response(
        status=500, text=f"internal error reviewing uid {review['uid']}; see the webhook log\n"
    )


def _answer(
    state: WebhookState,
    review: AdmissionRequest,
    *,
    target: Target,
    namespace: NamespaceFacts,
    started: float,
) -> web.Response:
    """The decision for a checked review, as an HTTP response (200, or 400 for a bad object)."""
    judged = _judge(state, review, target=target, namespace=namespace)
    return _respond(state, review, judged, target=target, started=started)


Judged = tuple[Decision, bytes] | str
"""The decision and the answer's bytes, or why the object is not valid."""


def _judge(
    state: WebhookState, review: AdmissionRequest, *, target: Target, namespace: NamespaceFacts
) -> Judged:
    """Rules and encoding, without side effects: safe to run off the event loop."""
    try:
        decision = admit(review, settings=state.settings, namespace=namespace, target=target)
    except PodShapeError as exc:
        return f"request.object is not a valid {review['kind']['kind']}: {exc}"
    return decision, encode_response(review["uid"], decision)


def _respond(
    state: WebhookState, review: AdmissionRequest, judged: Judged, *, target: Target, started: float
) -> web.Response:
    """Log, count and wrap a judged review (on the event loop: the metrics are not locked)."""
    if isinstance(judged, str):
        return _bad_request(state, started, judged)
    decision, body = judged
    outcome: Outcome
    if isinstance(decision, Denial):
        outcome = "denied"
        logger.info(
            "denied: %s",
            trim_text(decision.message, MAX_MESSAGE_BYTES),
            extra=_ref(review, reason=decision.reason),
        )
    elif decision.patch:
        outcome = "allowed-mutated"
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "mutated", extra=_ref(review, operations=len(decision.patch), dry_run=_dry(review))
            )
    else:
        outcome = "allowed-unchanged"
    state.metrics.observe(outcome, target, time.perf_counter() - started)
    return web.Response(body=body, content_type=JSON)


async def _review_big(state: WebhookState, body: bytes, started: float) -> web.Response:
    """A review over :data:`BIG_REVIEW_BYTES`: decoded and judged in a worker thread.

    The thread holds the GIL only in turns (pure Python gives it up every few
    milliseconds), so the event loop keeps answering small reviews meanwhile;
    one big review at a time, so they cannot pile up in memory either. Logging,
    metrics and the namespace cache stay on the loop.
    """
    async with state.big_reviews:
        try:
            review = await asyncio.to_thread(decode_review, body)
        except ReviewError as exc:
            return _bad_request(state, started, str(exc))
        target: Target = "other"
        try:
            target = classify(review)
            facts = NO_NAMESPACE_FACTS
            ns_name = namespace_to_look_up(review, target=target)
            if ns_name is not None and state.namespaces is not None:
                facts = await state.namespaces.facts(ns_name)
            judged = await asyncio.to_thread(
                functools.partial(_judge, state, review, target=target, namespace=facts)
            )
            return _respond(state, review, judged, target=target, started=started)
        except Exception:
            return _internal_error(state, review, target, started)
        finally:
            if state.listener is not None:
                state.listener.trimmer.soon()  # its tens of MB, given back


async def handle_healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def handle_readyz(request: web.Request) -> web.Response:
    """200 when the namespace cache is synced (or gave up waiting) and not draining."""
    state = request.app[STATE_KEY]
    namespaces = state.namespaces
    ready = not state.draining and namespaces is not None and namespaces.ready
    report: dict[str, object] = {
        "ready": ready,
        "draining": state.draining,
        "namespaces": namespaces.status if namespaces is not None else "starting",
    }
    if state.tls is not None:
        info = state.tls.current.info
        tls: dict[str, object] = {
            "serial": f"{info.serial:x}",
            "not_after": info.not_after.isoformat(),
        }
        rejection = state.tls.rejection
        if rejection is not None:  # still serving the pair above: ready, but say it
            tls["rejected"] = {"reason": rejection.reason, "at": rejection.at.isoformat()}
        report["tls"] = tls
    if state.listener is not None:
        report["connections"] = state.listener.open_connections
    return web.Response(
        text=json.dumps(report) + "\n", status=200 if ready else 503, content_type=JSON
    )


async def handle_metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.Response(
        body=state.metrics.exposition(), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )


def _bad_request(
    state: WebhookState, started: float, message: str, *, status: int = 400
) -> web.Response:
    message = trim_text(message, MAX_MESSAGE_BYTES)
    logger.warning("refused a request that is not a usable AdmissionReview: %s", message)
    state.metrics.observe("error", "invalid", time.perf_counter() - started)
    return web.Response(status=status, text=message + "\n")


async def _answering(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer, 404s included, just before its headers go.

    Tells the connection its request is answered, which is what its deadlines and
    the drain go by (:mod:`webhook.connections`). While draining, every answer
    closes its connection and says so.
    """
    listener = request.app[STATE_KEY].listener
    if listener is None:
        return
    conn = listener.connection_of(request.protocol)
    if conn is None:
        return
    conn.answered()
    if listener.draining:
        response.force_close()
        response.headers[hdrs.CONNECTION] = "close"


def _too_large(length: int | None, limit: int) -> str:
    size = f" ({length} bytes)" if length is not None else ""
    return f"request body{size} is larger than max_body_bytes ({limit} bytes)"


def _dry(review: Mapping[str, object]) -> bool:
    return review.get("dryRun") is True


def _ref(review: Mapping[str, object], **more: object) -> dict[str, object]:
    """Object reference fields for ``extra=`` (kopf's ``k8s_ref``)."""
    kind = review.get("kind")
    return {  # never "name", "msg", ...: LogRecord refuses extras that shadow its own fields
        "uid": review.get("uid"),
        "kind": kind.get("kind") if isinstance(kind, dict) else None,
        "namespace": review.get("namespace"),
        "object_name": review.get("name") or "",
        **more,
    }


# ---------------------------------------------------- background lifecycles
async def _namespace_source(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    if state.namespaces is not None:  # injected (tests): its owner manages its lifecycle
        yield
        return
    env = os.environ if state.env is None else state.env
    async with namespace_source(state.config, metrics=state.metrics, env=env) as source:
        state.namespaces = source
        yield


async def _quota_mirror(app: web.Application) -> AsyncIterator[None]:
    """The leader-elected quota mirror (docs/quotas.md), when the config wants it."""
    state = app[STATE_KEY]
    async with quota_mirror(state.config, env=os.environ if state.env is None else state.env):
        yield


async def _claim_templates(app: web.Application) -> AsyncIterator[None]:
    """DRA mode's claim-template controller (docs/dra.md), when the config wants it."""
    state = app[STATE_KEY]
    env = os.environ if state.env is None else state.env
    async with claim_templates(state.config, env=env, metrics=state.metrics.dra_waiting):
        yield


async def _certificate_watch(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    assert state.tls is not None
    task = asyncio.create_task(
        state.tls.watch(interval_s=state.config.tls.reload_interval_s),
        name="metagpu-webhook-cert-watch",
    )
    task.add_done_callback(_log_unexpected_exit)
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "certificate watch stopped; rotated certificates will not be picked up",
            exc_info=task.exception(),
        )


# ---------------------------------------------------------------- running
@dataclass
class RunningWebhook:
    """A started webhook: where it listens and what it serves."""

    url: str
    """``https://HOST:PORT`` to reach it (a wildcard listen address becomes loopback)."""
    host: str
    port: int
    ca_file: Path | None
    """The generated CA (embedded default), or None when certificates were given."""
    tls: ReloadingTLS
    app: web.Application
    state: WebhookState = field(repr=False)

    @property
    def mutate_url(self) -> str:
        return self.url + MUTATE_PATH

    @property
    def metrics(self) -> WebhookMetrics:
        return self.state.metrics


class running_webhook:  # noqa: N801 - used like a function: `async with running_webhook(c)`
    """Start the webhook for ``config``; stop it (draining) when the block exits.

    A class rather than an async generator so the socket is closed when the
    ``async with`` exits, not when a generator is garbage collected (kopf's
    ``webhacks`` works around exactly that).
    """

    def __init__(
        self,
        config: WebhookConfig,
        *,
        namespaces: NamespaceSource | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._namespaces = namespaces
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._env = env
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._running: RunningWebhook | None = None

    async def __aenter__(self) -> RunningWebhook:
        config = self._config
        metrics = WebhookMetrics()
        ca_file: Path | None = None
        cert_file, key_file = config.tls.cert_file, config.tls.key_file
        if cert_file is None or key_file is None:
            bundle = await asyncio.to_thread(
                ensure_local_bundle, config.tls.generate_dir, now=self._clock()
            )
            cert_file, key_file, ca_file = bundle.cert_file, bundle.key_file, bundle.ca_file

        def on_reload(pair: ServingPair) -> None:
            metrics.cert_not_after.set(pair.info.not_after.timestamp())
            metrics.cert_reloads.inc()

        def on_reject(_: Rejection) -> None:
            metrics.cert_rejections.inc()

        tls = ReloadingTLS(
            cert_file, key_file, clock=self._clock, on_reload=on_reload, on_reject=on_reject
        )
        metrics.cert_not_after.set(tls.current.info.not_after.timestamp())
        state = WebhookState(
            config=config,
            settings=RuleSettings.from_config(config),
            metrics=metrics,
            tls=tls,
            namespaces=self._namespaces,
            env=self._env,
        )
        app = create_app(state)
        limits = config.connections
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=config.shutdown_timeout_s,
            # The listener closes idle connections (idle_timeout_s); aiohttp's own
            # keep-alive timer is only a backstop behind it.
            keepalive_timeout=limits.idle_timeout_s * 2,
            # After an answer sent before its request's body was read (a 400 for a
            # body too large, a 408), read and drop what still comes for this long
            # so the client sees the answer, then close: aiohttp's 10 s default
            # let a client hold the connection for nothing.
            lingering_time=LINGER_S,
        )
        await runner.setup()
        self._runner = runner
        try:
            assert runner.server is not None
            listener = Listener(
                runner.server,
                ssl_context=tls.server_context,
                limits=limits,
                max_connections=fit_to_fd_limit(limits.max_connections),
            )
            addresses = await listener.start(config.host, config.port)
        except BaseException:
            await asyncio.shield(runner.cleanup())
            raise
        self._listener = state.listener = listener
        metrics.watch_connections(
            lambda: listener.open_connections, listener.stats.refused, listener.stats.closed
        )
        port = int(addresses[0][1])
        url = f"https://{_url_host(config.host)}:{port}"
        logger.info(
            "serving AdmissionReview v1",
            extra={"url": url + MUTATE_PATH, "ca_file": str(ca_file) if ca_file else None},
        )
        self._running = RunningWebhook(
            url=url, host=config.host, port=port, ca_file=ca_file, tls=tls, app=app, state=state
        )
        return self._running

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        runner, running, listener = self._runner, self._running, self._listener
        self._runner = self._running = self._listener = None
        if runner is None:
            return
        if running is not None:
            running.state.draining = True
            delay = self._config.drain_delay_s
            if delay > 0:
                logger.info("draining: not ready, still serving", extra={"for_s": delay})
                await asyncio.sleep(delay)
        timeout_s = self._config.shutdown_timeout_s
        logger.info("stopping: answering the requests received", extra={"timeout_s": timeout_s})
        if listener is not None and not await asyncio.shield(listener.drain(timeout_s)):
            logger.warning(
                "requests still unanswered after shutdown_timeout_s; dropping them",
                extra={"timeout_s": timeout_s, "requests": listener.busy},
            )
        await asyncio.shield(runner.cleanup())
        if listener is not None:
            await asyncio.shield(listener.close())
        logger.info("stopped")


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def serve(
    config: WebhookConfig, *, announce: Callable[[RunningWebhook], None] | None = None
) -> int:
    """Run until SIGTERM or SIGINT, then drain and return 0 (``metagpu webhook``).

    Signals are handled here, once, at the top of the process (kopf's
    ``running.py``); the runner is created with ``handle_signals=False``. A
    second signal while draining is logged and otherwise ignored: the drain is
    bounded by ``drain_delay_s + shutdown_timeout_s``.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    logguard.install()  # a flood of clients must not become a flood of log lines

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            logger.warning(
                "already stopping; waiting for in-flight requests", extra={"signal": sig.name}
            )
            return
        logger.info("stopping on signal", extra={"signal": sig.name})
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        async with running_webhook(config) as hook:
            # Everything that exists now (kubernetes-asyncio alone is thousands of
            # classes) lives as long as the process. Freezing it keeps the
            # collector's full passes from walking it again and again, which
            # otherwise stalls the loop for ~40 ms every few thousand reviews
            # (tests/benchmarks/webhook_load.py).
            gc.collect()
            gc.freeze()
            if announce is not None:
                announce(hook)
            await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0
