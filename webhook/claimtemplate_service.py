"""Where DRA mode's claim-template controller meets the webhook process (adapter).

Like :func:`webhook.quotas.service.quota_mirror`: an async context manager the
server's ``cleanup_ctx`` owns, running the leader-elected controller in the
background when :func:`controller_wanted` says so, and stopping it (releasing
its Lease) on exit. The Lease shares ``quota_mirror``'s namespace, identity
and timings; only its name (``dra.lease_name``) is its own. The same leader writes
the Events saying why a DRA pod waits (``dra.explain_waiting``,
:mod:`webhook.dra_waiting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping

from webhook.claimtemplate_controller import run_claim_templates
from webhook.config import WebhookConfig
from webhook.dra_waiting import ExplainSettings
from webhook.metrics import DraWaitingStats
from webhook.model import DraSettings
from webhook.quotas.service import IN_CLUSTER_ENV, elected_in_background, lease_timing

logger = logging.getLogger(__name__)


def controller_wanted(config: WebhookConfig, env: Mapping[str, str]) -> bool:
    """``dra.controller`` in ``mode: dra``; ``auto`` is on in a cluster the webhook reads."""
    if config.mode != "dra":
        return False
    enabled = config.dra.controller
    if enabled == "auto":
        return bool(env.get(IN_CLUSTER_ENV)) and config.kubernetes.enabled is not False
    return enabled


def explain_settings(config: WebhookConfig) -> ExplainSettings | None:
    """The waiting-pod Events' settings, or None with ``dra.explain_waiting`` off."""
    if not config.dra.explain_waiting:
        return None
    return ExplainSettings(driver=config.dra.driver_name, refresh_s=config.dra.explain_refresh_s)


@contextlib.asynccontextmanager
async def claim_templates(
    config: WebhookConfig,
    *,
    env: Mapping[str, str],
    on_change: Callable[[bool], None] | None = None,
    metrics: DraWaitingStats | None = None,
) -> AsyncIterator[asyncio.Task[None] | None]:
    """Run the controller in the background when wanted; yields its task (None when off).

    ``metrics`` gets the waiting-pod explainer's figures while this replica leads."""
    if not controller_wanted(config, env):
        if config.mode == "dra":
            logger.warning(
                "DRA mode without the claim-template controller: pods wait until someone "
                "creates the ResourceClaimTemplates they name",
                extra={"controller": config.dra.controller},
            )
        yield None
        return
    timing = lease_timing(config)
    async with elected_in_background(
        config,
        env,
        setting="dra.controller",
        agent="metagpu-claim-templates",
        task_name="metagpu-claim-templates-election",
        stopped="claim-template controller stopped; new DRA share shapes get no template",
        run=lambda api, namespace, identity: run_claim_templates(
            api,
            dra=DraSettings.of(config.dra),
            lease_name=config.dra.lease_name,
            lease_namespace=namespace,
            identity=identity,
            timing=timing,
            on_change=on_change,
            explain=explain_settings(config),
            metrics=metrics,
        ),
    ) as task:
        yield task
