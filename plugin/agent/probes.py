"""Adapter: the agent's TCP endpoint: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz``.

* ``/metrics``: the text exposition of :class:`~plugin.agent.metrics.AgentMetrics`.
* ``/healthz`` (liveness): 200 while cycles keep finishing; 503 once none has
  finished for ``3 × interval + 30 s`` (a wedged driver call or a dead loop), so
  the kubelet restarts a stuck agent but not a merely slow one.
* ``/readyz`` (readiness): 200 once the first cycle finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from plugin.agent.metrics import AgentMetrics
from plugin.api.agent_config import DEFAULT_METRICS_LISTEN
from plugin.api.settings import split_listen

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeState:
    """Live views into the agent for the probes."""

    metrics: AgentMetrics
    last_cycle_age_s: Callable[[], float | None]
    """Seconds since the last finished cycle; None before the first."""
    stuck_after_s: float


STATE = web.AppKey("state", ProbeState)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    age = state.last_cycle_age_s()
    if age is not None and age > state.stuck_after_s:
        return web.Response(
            status=503, text=f"no accounting cycle finished for {age:.0f} s; the agent is stuck\n"
        )
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[STATE].last_cycle_age_s() is None:
        return web.Response(status=503, text="first accounting cycle not finished yet\n")
    return web.Response(text="ok\n")


def build_app(state: ProbeState) -> web.Application:
    app = web.Application()
    app[STATE] = state
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


class ProbeServer:
    """Serves :func:`build_app` on ``HOST:PORT``; an async context manager."""

    def __init__(self, state: ProbeState, listen: str) -> None:
        self.host, self.port = split_listen(listen, example=DEFAULT_METRICS_LISTEN)
        self._runner = web.AppRunner(
            build_app(state), handle_signals=False, shutdown_timeout=1.0, access_log=None
        )

    async def __aenter__(self) -> ProbeServer:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the real one when 0 was asked for
        logger.info(
            "metrics and probes listening", extra={"url": f"http://{self.host}:{self.port}/metrics"}
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self._runner.cleanup())
