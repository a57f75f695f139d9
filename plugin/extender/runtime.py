"""The extender process: API client, ledger cache, binder and its session, HTTP server (adapter)."""

from __future__ import annotations

import asyncio
import logging

from plugin.api.commands import freeze_heap
from plugin.extender.binder import Binder
from plugin.extender.bindings import BindingClient
from plugin.extender.cache import LedgerCache
from plugin.extender.config import ExtenderConfig
from plugin.extender.evictor import Evictor
from plugin.extender.metrics import ExtenderMetrics
from plugin.extender.opener import ApiOpener
from plugin.extender.server import ExtenderState, running_extender
from plugin.extender.service import ExtenderCore

logger = logging.getLogger(__name__)


async def serve(config: ExtenderConfig, *, open_api: ApiOpener, stop: asyncio.Event) -> None:
    """Run until ``stop`` is set. The server listens at once (``/healthz``); the verbs
    answer "not synced" until the first list of Nodes and Pods is in."""
    core = ExtenderCore(
        resource=config.resource_name,
        default_policy=config.placement_policy,
        assume_timeout_s=config.assume_timeout_s,
        preemption=config.preemption,
    )
    metrics = ExtenderMetrics()
    async with open_api(config.kubeconfig) as (api, source):
        logger.info("reading nodes and pods from the Kubernetes API", extra={"credentials": source})
        async with (
            LedgerCache(
                api,
                core,
                on_expired=metrics.expired.inc,
                on_nominated=lambda _: metrics.preemptions.labels("scheduler", "nominated").inc(),
            ) as cache,
            Evictor(api, core, metrics, timeout_s=config.api_timeout_s) as evictor,
            BindingClient(
                api, connections=config.max_binds_in_flight, timeout_s=config.api_timeout_s
            ) as bindings,
        ):
            binder = Binder(
                bindings,
                core,
                in_flight=cache.binds_in_flight,
                max_in_flight=config.max_binds_in_flight,
            )
            state = ExtenderState(
                config,
                core,
                cache,
                binder,
                metrics,
                evictor=evictor if config.preemption.enabled else None,
            )
            async with running_extender(state):
                try:
                    await asyncio.wait_for(cache.wait_synced(), config.initial_sync_timeout_s)
                    core.warm()
                    # The ledger of every node, just listed, lives as long as the
                    # process: out of the full passes that would walk it (30-40 ms
                    # at 1,000 nodes, every few hundred filter calls).
                    freeze_heap()
                except TimeoutError:
                    logger.warning(
                        "nodes and pods not listed yet; every verb answers 'not synced' "
                        "(the scheduler retries) until they are",
                        extra={"after_s": config.initial_sync_timeout_s},
                    )
                await stop.wait()
