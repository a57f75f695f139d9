"""Where the quota pieces meet the webhook process: what starts, with which client (adapter).

Two lifecycles, each an async context manager so the server's
``cleanup_ctx`` (and ``metagpu quota-mirror``) own them like everything else:

* :func:`namespace_source` opens the namespace source of
  :mod:`webhook.namespaces` and, when it reads a cluster, a
  :class:`~webhook.quotas.cache.QuotaCache` beside it, composed by
  :class:`~webhook.quotas.cache.QuotaAwareNamespaces`;
* :func:`quota_mirror` runs the leader-elected mirror in the background when
  :func:`mirror_wanted` says so, and stops it (releasing the Lease) on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, Final

from kubernetes_asyncio import client as k8s_client

from certs.kube import SERVICE_ACCOUNT_NAMESPACE_FILE
from webhook.config import WebhookConfig
from webhook.metrics import WebhookMetrics
from webhook.namespaces import (
    KubernetesUnavailableError,
    NamespaceCache,
    NamespaceSource,
    cluster_wanted,
    new_api_client,
    open_namespace_source,
)
from webhook.quotas.cache import QuotaAwareNamespaces, QuotaCache
from webhook.quotas.controller import run_quota_mirror
from webhook.quotas.leader import LeaseTiming, default_identity
from webhook.quotas.mirror import MirrorSettings

logger = logging.getLogger(__name__)

IN_CLUSTER_ENV: Final = "KUBERNETES_SERVICE_HOST"


class QuotaMirrorConfigError(ValueError):
    """The mirror was asked for but cannot run as configured (says what to set)."""


def mirror_settings(config: WebhookConfig) -> MirrorSettings:
    return MirrorSettings(
        resource_name=config.resource_name,
        units_per_gpu=config.units_per_gpu,
        claim_device_class=config.dra.device_class_name if config.mode == "dra" else None,
    )


def mirror_wanted(config: WebhookConfig, env: Mapping[str, str]) -> bool:
    """``quota_mirror.enabled``; ``auto`` is on in a cluster that the webhook reads."""
    enabled = config.quota_mirror.enabled
    if enabled == "auto":
        return bool(env.get(IN_CLUSTER_ENV)) and config.kubernetes.enabled is not False
    return enabled


def lease_namespace(config: WebhookConfig, *, namespace_file: str | None = None) -> str:
    """``quota_mirror.lease_namespace``, else the pod's own namespace.

    Raises :class:`QuotaMirrorConfigError` outside a pod without the setting.
    """
    if config.quota_mirror.lease_namespace:
        return config.quota_mirror.lease_namespace
    path = namespace_file or str(SERVICE_ACCOUNT_NAMESPACE_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            found = fh.read().strip()
    except OSError:
        found = ""
    if not found:
        raise QuotaMirrorConfigError(
            "quota_mirror.lease_namespace is not set and this is not a pod (no "
            f"{path}); set it (--lease-namespace, METAGPU_WEBHOOK_QUOTA_MIRROR__LEASE_NAMESPACE) "
            "to the namespace the Lease should live in"
        )
    return found


def lease_timing(config: WebhookConfig) -> LeaseTiming:
    mirror = config.quota_mirror
    return LeaseTiming(
        lease_duration_s=mirror.lease_duration_s,
        renew_deadline_s=mirror.renew_deadline_s,
        retry_period_s=mirror.retry_period_s,
    )


@contextlib.asynccontextmanager
async def namespace_source(
    config: WebhookConfig,
    *,
    metrics: WebhookMetrics | None = None,
    env: Mapping[str, str],
) -> AsyncIterator[NamespaceSource]:
    """The namespace source, with quota warnings when it reads a cluster."""
    source = await open_namespace_source(config.kubernetes, metrics=metrics, env=env)
    async with source:
        if not isinstance(source, NamespaceCache):
            yield source
            return
        api = await new_api_client(config.kubernetes, env)
        async with QuotaCache(api, settings=mirror_settings(config)) as quotas:
            yield QuotaAwareNamespaces(source, quotas)


@contextlib.asynccontextmanager
async def quota_mirror(
    config: WebhookConfig,
    *,
    env: Mapping[str, str],
    on_change: Callable[[bool], None] | None = None,
) -> AsyncIterator[asyncio.Task[None] | None]:
    """Run the mirror in the background when wanted; yields its task (None when off).

    Raises :class:`QuotaMirrorConfigError` or
    :class:`~webhook.namespaces.KubernetesUnavailableError` before starting
    when it is wanted but cannot run.
    """
    if not mirror_wanted(config, env):
        logger.info("quota mirror is off", extra={"enabled": config.quota_mirror.enabled})
        yield None
        return
    timing = lease_timing(config)
    settings = mirror_settings(config)
    async with elected_in_background(
        config,
        env,
        setting="quota_mirror.enabled",
        agent="metagpu-quota-mirror",
        task_name="metagpu-quota-mirror-election",
        stopped="quota mirror stopped; GPU quotas are no longer mirrored",
        run=lambda api, namespace, identity: run_quota_mirror(
            api,
            settings=settings,
            lease_name=config.quota_mirror.lease_name,
            lease_namespace=namespace,
            identity=identity,
            timing=timing,
            on_change=on_change,
        ),
    ) as task:
        yield task


Elected = Callable[[k8s_client.ApiClient, str, str], Coroutine[Any, Any, None]]
"""Leader-elected work, given its API client, the Lease namespace and the identity."""


@contextlib.asynccontextmanager
async def elected_in_background(
    config: WebhookConfig,
    env: Mapping[str, str],
    *,
    setting: str,
    agent: str,
    task_name: str,
    stopped: str,
    run: Elected,
) -> AsyncIterator[asyncio.Task[None]]:
    """Run leader-elected ``run`` in the background of the webhook process; yields its task.

    The lifecycle the quota mirror and DRA mode's claim-template controller share: refused
    before anything starts when no cluster is configured or the Lease namespace cannot be
    told (``setting`` is what asked for it); its own API client, whose ``User-Agent``
    (``agent``/identity) tells its requests apart in the API server's audit log; the
    identity ``quota_mirror.identity`` or a fresh one; ``stopped`` logged if the work ever
    ends by itself; on exit cancelled (its Lease released) and its client closed."""
    if not cluster_wanted(config.kubernetes, env) or config.kubernetes.enabled is False:
        raise KubernetesUnavailableError(
            f"{setting} is true but no Kubernetes cluster is configured "
            "(run in a pod, or give kubernetes.kubeconfig / KUBECONFIG)"
        )
    namespace = lease_namespace(config)
    api = await new_api_client(config.kubernetes, env)
    identity = config.quota_mirror.identity or default_identity()
    api.user_agent = f"{agent}/{identity}"
    task = asyncio.create_task(run(api, namespace, identity), name=task_name)
    task.add_done_callback(functools.partial(_log_unexpected_exit, stopped))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()


async def serve_quota_mirror(config: WebhookConfig, *, env: Mapping[str, str] | None = None) -> int:
    """``metagpu quota-mirror``: run until SIGTERM or SIGINT, release the Lease, return 0.

    Signals are handled here, once, at the top (as :func:`webhook.server.serve`);
    ``quota_mirror.enabled: auto`` counts as on, since the command was asked for.
    """
    env = os.environ if env is None else env
    if config.quota_mirror.enabled == "auto":
        mirror = config.quota_mirror.model_copy(update={"enabled": True})
        config = config.model_copy(update={"quota_mirror": mirror})
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        logger.info("stopping on signal", extra={"signal": sig.name})
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        async with quota_mirror(config, env=env) as task:
            assert task is not None  # enabled above
            await asyncio.wait(
                {task, asyncio.create_task(stop.wait(), name="metagpu-quota-mirror-stop")},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if task.done() and not task.cancelled() and task.exception() is not None:
                return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def _log_unexpected_exit(stopped: str, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(stopped, exc_info=task.exception())
