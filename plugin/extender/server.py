"""The HTTP(S) shell around the extender's verbs (adapter): app factory, handlers, runner.

``POST /filter``, ``/prioritize``, ``/bind`` and ``/preempt`` take the upstream JSON
(:mod:`plugin.extender.protocol`). Two error channels, as for the webhook:

* the *request* is unusable (not JSON, not the message the verb expects, too
  large): HTTP 400 (413) with a plain-text message; the scheduler reports
  ``failed filter with extender ... code 400`` and retries the pod later;
* the *pod* cannot be placed, or the cache is not synced yet: HTTP 200 with
  the reason in ``FailedNodes`` / ``Error``, which kube-scheduler puts in the
  pod's FailedScheduling event.

Bodies are read and answers written by :mod:`plugin.api.jsonwire` (orjson), as
the webhook's are: the answers run to 35-80 KB at 1,000 nodes, which the
standard library encodes in about half a millisecond per call, orjson in a
twentieth of that.

``GET /healthz`` (the process answers), ``/readyz`` (Nodes and Pods listed)
and ``/metrics`` share the port. TLS is optional: the chart runs the extender
as a sidecar of kube-scheduler and listens on loopback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Protocol

from aiohttp import web

from plugin.api import jsonwire
from plugin.api.settings import split_listen
from plugin.extender.config import ExtenderConfig
from plugin.extender.metrics import METRICS_CONTENT_TYPE, ExtenderMetrics, Verb
from plugin.extender.preemption_book import Proposal
from plugin.extender.protocol import (
    ExtenderBindingArgs,
    ProtocolError,
    filter_result,
    parse_args,
    parse_binding,
    parse_preemption,
)
from plugin.extender.service import ExtenderCore

logger = logging.getLogger(__name__)

JSON: Final = "application/json"


class Readiness(Protocol):
    @property
    def ready(self) -> bool: ...


class BindPort(Protocol):
    async def bind(self, args: ExtenderBindingArgs) -> str: ...


class EvictPort(Protocol):
    def start(self, proposal: Proposal) -> None: ...


@dataclass
class ExtenderState:
    config: ExtenderConfig
    core: ExtenderCore
    cache: Readiness
    binder: BindPort
    metrics: ExtenderMetrics = field(default_factory=ExtenderMetrics)
    evictor: EvictPort | None = None
    """Evicts for the extender's own preemptions; None: the extender never evicts
    (``preemptVerb`` still answers)."""
    clock: Callable[[], float] = time.time


STATE_KEY: Final = web.AppKey("metagpu_extender_state", ExtenderState)

NOT_SYNCED: Final = (
    "metagpu scheduler extender has not listed the cluster's Nodes and Pods yet; "
    "the pod will be retried"
)


def create_app(state: ExtenderState) -> web.Application:
    app = web.Application(client_max_size=state.config.max_body_bytes)
    app[STATE_KEY] = state
    app.router.add_post("/filter", handle_filter)
    app.router.add_post("/prioritize", handle_prioritize)
    app.router.add_post("/bind", handle_bind)
    app.router.add_post("/preempt", handle_preempt)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/metrics", handle_metrics)
    return app


def create_metrics_app(state: ExtenderState) -> web.Application:
    """The second listener's app (``metrics_listen``): what Prometheus and probes read,
    and nothing that decides or binds, so it may face the pod network."""
    app = web.Application(client_max_size=1024)
    app[STATE_KEY] = state
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/metrics", handle_metrics)
    return app


async def _serve(
    request: web.Request, verb: Verb, answer: Callable[[object], Awaitable[object]]
) -> web.Response:
    state = request.app[STATE_KEY]
    started = time.perf_counter()
    outcome = "error"
    try:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(
                status=413,
                text=f"request body is larger than max_body_bytes "
                f"({state.config.max_body_bytes} bytes)\n",
            )
        try:
            body = jsonwire.loads(raw, what="an extender request")
        except jsonwire.JsonBodyError as exc:
            return _bad_request(verb, f"{verb}: {exc}")
        try:
            async with asyncio.timeout(state.config.request_timeout_s):
                result = await answer(body)
        except ProtocolError as exc:
            return _bad_request(verb, f"{verb}: {exc}")
        except TimeoutError:
            logger.warning("extender request timed out", extra={"verb": verb})
            return web.Response(
                status=503,
                text=f"{verb}: not answered within request_timeout_s "
                f"({state.config.request_timeout_s:g}s); the scheduler will retry\n",
            )
        outcome = "ok"
        return web.Response(body=jsonwire.dumps(result), content_type=JSON)
    finally:
        state.metrics.requests.labels(verb, outcome).inc()
        state.metrics.duration.labels(verb).observe(time.perf_counter() - started)


def _bad_request(verb: str, message: str) -> web.Response:
    logger.warning("refused a malformed extender request: %s", message, extra={"verb": verb})
    return web.Response(status=400, text=message + "\n")


async def handle_filter(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]

    async def answer(body: object) -> object:
        args = parse_args(body)
        if not state.cache.ready:
            return filter_result(args, (), {}, error=NOT_SYNCED)
        result, waits_because = state.core.filter_with_reason(args)
        state.metrics.nodes_failed.inc(
            len(result["FailedNodes"]) + len(result["FailedAndUnresolvableNodes"])
        )
        if waits_because is not None:
            state.metrics.unschedulable.labels(waits_because).inc()
        if state.evictor is not None and not result["NodeNames"]:
            proposal = state.core.consider_preemption(args, result, now=state.clock())
            if proposal is not None:
                state.metrics.preemptions.labels("extender", "nominated").inc()
                logger.info(
                    "preempting for a fraction: no single GPU has room without lower-priority pods",
                    extra={
                        "namespace": proposal.preemptor.namespace,
                        "pod": proposal.preemptor.name,
                        "node": proposal.plan.node,
                        "gpus": list(proposal.plan.gpus),
                        "victims": [f"{v.namespace}/{v.name}" for v in proposal.plan.victims],
                    },
                )
                state.evictor.start(proposal)
        return result

    return await _serve(request, "filter", answer)


async def handle_prioritize(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]

    async def answer(body: object) -> object:
        args = parse_args(body)
        return state.core.prioritize(args)

    return await _serve(request, "prioritize", answer)


async def handle_bind(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]

    async def answer(body: object) -> object:
        args = parse_binding(body)
        if not state.cache.ready:
            return {"Error": NOT_SYNCED}
        error = await state.binder.bind(args)
        if not error:
            state.metrics.binds.labels("bound").inc()
        else:
            state.metrics.binds.labels("failed" if "Binding" in error else "refused").inc()
            logger.warning(
                "bind refused: %s",
                error,
                extra={"namespace": args.PodNamespace, "pod": args.PodName, "node": args.Node},
            )
        return {"Error": error}

    return await _serve(request, "bind", answer)


async def handle_preempt(request: web.Request) -> web.Response:
    """``preemptVerb``: ExtenderPreemptionArgs in, ExtenderPreemptionResult out."""
    state = request.app[STATE_KEY]

    async def answer(body: object) -> object:
        args = parse_preemption(body)
        if not state.cache.ready:
            # No victims named on a half-known cluster: an empty map keeps no node, and
            # kube-scheduler retries the pod.
            return {"NodeNameToMetaVictims": {}}
        return state.core.preempt(args, now=state.clock())

    return await _serve(request, "preempt", answer)


async def handle_healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def handle_readyz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    ready = state.cache.ready
    report = {
        "ready": ready,
        "nodes": state.core.ledger.node_count,
        "assumed_pods": sum(1 for _ in state.core.ledger.assumed()),
    }
    return web.Response(
        text=json.dumps(report) + "\n", status=200 if ready else 503, content_type=JSON
    )


async def handle_metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    # The gauges of state are read when scraped: counting the reservations after every
    # request cost each bind of a burst a pass over all the others' (tests/benchmarks/
    # extender_bind.py).
    state.metrics.assumed.set(sum(1 for _ in state.core.ledger.assumed()))
    state.metrics.nodes.set(state.core.ledger.node_count)
    return web.Response(
        body=state.metrics.exposition(), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )


class running_extender:  # noqa: N801 - used like a function: `async with running_extender(s)`
    """Serve ``state`` on ``state.config.listen`` (and the metrics-only app on
    ``metrics_listen`` when set); stop when the block exits.

    A class, not an async generator, so the sockets close when the block exits.
    """

    def __init__(self, state: ExtenderState) -> None:
        self._state = state
        self._runners: list[web.AppRunner] = []
        self.url = ""
        self.metrics_url = ""

    async def __aenter__(self) -> running_extender:
        config = self._state.config
        context: ssl.SSLContext | None = None
        if config.tls.cert_file is not None and config.tls.key_file is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(config.tls.cert_file, config.tls.key_file)
        try:
            self.url = await self._start(create_app(self._state), config.host, config.port, context)
            logger.info("serving the scheduler extender", extra={"url": self.url})
            if config.metrics_listen is not None:
                host, port = split_listen(config.metrics_listen, example="0.0.0.0:8451")
                self.metrics_url = await self._start(
                    create_metrics_app(self._state), host, port, None
                )
                logger.info(
                    "serving the extender's metrics and probes (no verbs)",
                    extra={"url": self.metrics_url, "listen": config.metrics_listen},
                )
        except BaseException:
            await self._stop()
            raise
        return self

    async def _start(
        self, app: web.Application, host: str, port: int, context: ssl.SSLContext | None
    ) -> str:
        config = self._state.config
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=config.shutdown_timeout_s
        )
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, host, port, ssl_context=context)
        await site.start()
        bound = int(runner.addresses[0][1])
        shown = host if host not in ("", "0.0.0.0") else "127.0.0.1"
        shown = f"[{shown}]" if ":" in shown else shown
        return f"{'https' if context else 'http'}://{shown}:{bound}"

    async def _stop(self) -> None:
        runners, self._runners = self._runners, []
        for runner in reversed(runners):
            await asyncio.shield(runner.cleanup())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()
