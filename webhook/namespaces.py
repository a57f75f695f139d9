"""Namespace facts for the rules, from a watch-backed cache of Namespaces (adapter).

The rules need two things from a pod's Namespace: its
``metagpu.io/compute-policy`` annotation and its ``metagpu.io/inject`` label.
Reading them must never block or fail pod creation by surprise, so:

* a background task lists every Namespace once, then watches for changes
  (:class:`plugin.kube.listwatch.ListWatch`, shared with the scheduler
  extender: reconnecting from the last resourceVersion, re-listing on 410 Gone,
  backing off on errors), so almost every lookup is a dict hit;
* a cache miss (a namespace created a moment ago, or the list not done yet)
  makes **one** GET bounded by ``namespace_lookup_timeout_s``; concurrent misses
  for the same name share it;
* any failure (timeout, 403, API down) answers with the config defaults and a
  warning that the AdmissionResponse carries to the user; after a failure the
  same name is not retried for :data:`FAILURE_RETRY_S`, so a broken API costs
  each pod creation nothing;
* ``/readyz`` waits for the initial list for at most ``initial_sync_timeout_s``;
  if the list never completes (RBAC missing, API slow), the webhook reports
  ready anyway, logs a warning, and keeps answering with GET-per-miss and
  defaults, because an unready webhook with ``failurePolicy: Fail`` would block
  every pod in the cluster.

Without a reachable cluster (``kubernetes.enabled: auto`` outside a cluster and
without a kubeconfig, or ``false``) :class:`StaticNamespaces` answers with the
config defaults and no warning: running on config alone is then the intent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Protocol, cast

import aiohttp
from kubernetes_asyncio import client as k8s_client

from certs.kube import KubeCredentialsError, load_credentials, status_fields
from plugin.api.resources import ANNOTATION_COMPUTE_POLICY, LABEL_INJECT, is_dns_label
from plugin.kube.listwatch import WATCH_TIMEOUT_S, ListWatch
from webhook.config import KubernetesConfig
from webhook.metrics import WebhookMetrics
from webhook.model import NO_NAMESPACE_FACTS, NamespaceFacts

logger = logging.getLogger(__name__)

FAILURE_RETRY_S: Final = 5.0
MAX_FAILED_NAMES: Final = 1024
"""Bound on the names remembered as "lookup failed moments ago": the names come
from reviews, so without one a client could grow the set without end."""
"""After a failed GET, the same namespace answers from defaults for this long."""


class KubernetesUnavailableError(Exception):
    """``kubernetes.enabled: true`` but no usable cluster configuration was found."""


class NamespaceSource(Protocol):
    """Where the server gets namespace facts from (the cache, or config alone)."""

    @property
    def ready(self) -> bool: ...

    @property
    def status(self) -> str: ...

    def cached(self, name: str) -> NamespaceFacts | None:
        """The facts when they are known without I/O, else None (then call :meth:`facts`).

        The server answers most reviews in a synchronous batch
        (:mod:`webhook.batching`); only a namespace this returns None for
        takes the awaited path.
        """
        ...

    async def facts(self, name: str) -> NamespaceFacts: ...


class StaticNamespaces:
    """No cluster: every namespace has no annotations; the config defaults apply."""

    def __init__(self, metrics: WebhookMetrics | None = None) -> None:
        self._metrics = metrics

    @property
    def ready(self) -> bool:
        return True

    @property
    def status(self) -> str:
        return "disabled (running on config alone)"

    def cached(self, name: str) -> NamespaceFacts:
        if self._metrics is not None:
            self._metrics.namespace_lookup("disabled")
        return NO_NAMESPACE_FACTS

    async def facts(self, name: str) -> NamespaceFacts:
        return self.cached(name)

    async def __aenter__(self) -> StaticNamespaces:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def invalid_namespace_facts(name: str) -> NamespaceFacts:
    """The defaults, with a warning, for a review whose namespace is not a DNS label."""
    shown = name if len(name) <= 80 else f"{name[:80]}... ({len(name)} characters)"
    return NamespaceFacts(
        warnings=(
            f"namespace {shown!r} is not a valid namespace name (a DNS label: at most 63 "
            "lower-case letters, digits or '-'); the webhook defaults were applied",
        )
    )


def facts_of(namespace: Mapping[str, Any]) -> NamespaceFacts:
    """The facts a Namespace object carries (raw; the rules validate them)."""
    meta = namespace.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    policy = annotations.get(ANNOTATION_COMPUTE_POLICY)
    inject = labels.get(LABEL_INJECT)
    if policy is None and inject is None:
        return NO_NAMESPACE_FACTS
    return NamespaceFacts(
        compute_policy=policy if isinstance(policy, str) else None,
        inject=inject if isinstance(inject, str) else None,
    )


def cluster_wanted(config: KubernetesConfig, env: Mapping[str, str]) -> bool:
    """Whether to use the API: ``auto`` means in a cluster, or with a kubeconfig."""
    if config.enabled == "auto":
        return bool(
            env.get("KUBERNETES_SERVICE_HOST") or config.kubeconfig or env.get("KUBECONFIG")
        )
    return bool(config.enabled)


async def new_api_client(config: KubernetesConfig, env: Mapping[str, str]) -> k8s_client.ApiClient:
    """An API client with the credentials :func:`certs.kube.load_credentials` finds:
    ``kubernetes.kubeconfig`` when set, else in-cluster, else ``KUBECONFIG``.

    The same order as bootstrap and the node agent, so a pod never runs as two
    identities. Raises :class:`KubernetesUnavailableError`.
    """
    configuration = k8s_client.Configuration()
    try:
        source = await load_credentials(configuration, kubeconfig=config.kubeconfig, env=env)
    except KubeCredentialsError as exc:
        raise KubernetesUnavailableError(f"cannot configure the Kubernetes client: {exc}") from exc
    logger.info("reading namespaces from the Kubernetes API", extra={"credentials": source})
    return k8s_client.ApiClient(configuration=configuration)


class NamespaceCache:
    """Watch-backed namespace facts; use as ``async with NamespaceCache(...) as cache``."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        config: KubernetesConfig,
        metrics: WebhookMetrics | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._api = api
        self._v1 = k8s_client.CoreV1Api(api)
        self._config = config
        self._metrics = metrics
        self._cache: dict[str, NamespaceFacts] = {}
        """Namespaces with metagpu settings."""
        self._known: set[str] = set()
        """Namespaces that exist but carry no metagpu settings (a hit, not a miss)."""
        self._failed_until: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Task[NamespaceFacts]] = {}
        self._synced = asyncio.Event()
        self._gave_up = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listwatch = ListWatch(
            "namespaces",
            self._v1.list_namespace,
            on_list=self._listed,
            on_event=self._event,
            watch_timeout_s=watch_timeout_s,
        )

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> NamespaceCache:
        self._tasks = [
            asyncio.create_task(self._run(), name="metagpu-webhook-namespace-watch"),
            asyncio.create_task(self._sync_deadline(), name="metagpu-webhook-namespace-sync"),
        ]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for task in [*self._tasks, *self._inflight.values()]:
            task.cancel()
        for task in [*self._tasks, *self._inflight.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._api.close()

    @property
    def ready(self) -> bool:
        return self._synced.is_set() or self._gave_up

    @property
    def status(self) -> str:
        if self._synced.is_set():
            return f"synced ({len(self._cache)} namespaces with metagpu settings)"
        if self._gave_up:
            return (
                f"degraded: not synced after {self._config.initial_sync_timeout_s:g}s; "
                "each lookup makes one GET"
            )
        return "syncing"

    async def wait_synced(self) -> None:
        """Wait until the initial list is in (tests; the server uses :attr:`ready`)."""
        await self._synced.wait()

    # --------------------------------------------------------------- lookup
    def cached(self, name: str) -> NamespaceFacts | None:
        """Cache hits, and names whose last GET failed moments ago (no new GET yet).

        A name that is not a DNS label names no namespace: it is answered with the
        defaults at once, never looked up, remembered or logged in full.
        """
        cached = self._cache.get(name)
        if cached is not None:
            self._count("cache")
            return cached
        if self._synced.is_set() and name in self._known:
            self._count("cache")
            return NO_NAMESPACE_FACTS
        if self._failed_until.get(name, 0.0) > asyncio.get_running_loop().time():
            self._count("error")
            return self._failure(name, "the last lookup failed moments ago")
        if not is_dns_label(name):
            self._count("error")
            return invalid_namespace_facts(name)
        return None

    async def facts(self, name: str) -> NamespaceFacts:
        known = self.cached(name)
        if known is not None:
            return known
        task = self._inflight.get(name)
        if task is None:
            task = asyncio.create_task(self._get(name), name=f"metagpu-webhook-ns-get-{name}")
            self._inflight[name] = task
            task.add_done_callback(lambda _: self._inflight.pop(name, None))
        return await asyncio.shield(task)

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.namespace_lookup(result)  # type: ignore[arg-type]

    def _failure(self, name: str, why: str) -> NamespaceFacts:
        return NamespaceFacts(
            warnings=(
                f"could not read namespace {name!r} ({why}); its {ANNOTATION_COMPUTE_POLICY} "
                f"annotation and {LABEL_INJECT} label were not applied, the webhook defaults were",
            )
        )

    async def _get(self, name: str) -> NamespaceFacts:
        """One bounded GET. Never raises (cancellation aside): whatever goes wrong
        (timeout, API down, a token file that a refresh found empty, a body that is
        not a Namespace) answers with the defaults, and the name backs off."""
        timeout_s = self._config.namespace_lookup_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                resp = _raw(
                    await self._v1.read_namespace(
                        name,
                        _preload_content=False,
                        _request_timeout=aiohttp.ClientTimeout(total=timeout_s),
                    )
                )
                try:
                    body = await resp.read()
                finally:
                    resp.release()
            if resp.status != 200:
                return self._failed(name, f"HTTP {resp.status}: {status_fields(body)[0]}")
            try:
                namespace = json.loads(body)
            except ValueError:
                return self._failed(name, "the API answered with something that is not JSON")
            if not isinstance(namespace, dict):
                return self._failed(name, "the API answered with JSON that is not an object")
            facts = facts_of(namespace)
        except TimeoutError:
            return self._failed(name, f"timed out after {timeout_s:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return self._failed(name, f"API unreachable: {exc}")
        except Exception as exc:  # asyncio.CancelledError is not an Exception: it propagates
            logger.warning(
                "namespace lookup raised unexpectedly", extra={"namespace": name}, exc_info=True
            )
            return self._failed(name, f"{type(exc).__name__}: {exc}")
        self._remember(name, facts)
        self._count("get")
        return facts

    def _failed(self, name: str, why: str) -> NamespaceFacts:
        logger.warning(
            "namespace lookup failed; using the webhook defaults for it",
            extra={"namespace": name, "reason": why},
        )
        now = asyncio.get_running_loop().time()
        failed = self._failed_until
        if len(failed) >= MAX_FAILED_NAMES:
            for old in [n for n, until in failed.items() if until <= now]:
                del failed[old]
            while len(failed) >= MAX_FAILED_NAMES:  # all still fresh: drop the oldest
                del failed[next(iter(failed))]
        failed[name] = now + FAILURE_RETRY_S
        self._count("error")
        return self._failure(name, why)

    def _remember(self, name: str, facts: NamespaceFacts) -> None:
        if facts is NO_NAMESPACE_FACTS:
            self._cache.pop(name, None)
            self._known.add(name)
        else:
            self._cache[name] = facts

    def _forget(self, name: str) -> None:
        self._cache.pop(name, None)
        self._known.discard(name)

    # ---------------------------------------------------------- list/watch
    async def _sync_deadline(self) -> None:
        try:
            await asyncio.wait_for(self._synced.wait(), self._config.initial_sync_timeout_s)
        except TimeoutError:
            self._gave_up = True
            logger.warning(
                "namespace cache has not synced; reporting ready anyway: each namespace "
                "lookup makes one bounded GET and falls back to the config defaults on failure",
                extra={"after_s": self._config.initial_sync_timeout_s},
            )

    async def _run(self) -> None:
        await self._listwatch.run()

    def _listed(self, items: Sequence[dict[str, Any]]) -> None:
        cache: dict[str, NamespaceFacts] = {}
        known: set[str] = set()
        for item in items:
            name = (item.get("metadata") or {}).get("name")
            if not isinstance(name, str):
                continue
            facts = facts_of(item)
            if facts is NO_NAMESPACE_FACTS:
                known.add(name)
            else:
                cache[name] = facts
        self._cache, self._known = cache, known
        if not self._synced.is_set():
            self._synced.set()
            logger.info("namespace cache synced", extra={"namespaces": len(cache) + len(known)})

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        if kind == "DELETED":
            self._forget(name)
        else:
            self._known.discard(name)
            self._remember(name, facts_of(obj))


def _raw(response: object) -> aiohttp.ClientResponse:
    """With ``_preload_content=False`` the generated client returns the aiohttp response
    (its annotations say otherwise); reading it ourselves skips model deserialisation."""
    return cast(aiohttp.ClientResponse, response)


async def open_namespace_source(
    config: KubernetesConfig,
    *,
    metrics: WebhookMetrics | None = None,
    env: Mapping[str, str] | None = None,
) -> NamespaceCache | StaticNamespaces:
    """The source to use for ``config``: a cache when a cluster is wanted and usable.

    With ``enabled: auto`` a broken kubeconfig degrades to config alone (logged);
    with ``enabled: true`` it raises :class:`KubernetesUnavailableError`.
    """
    env = os.environ if env is None else env
    if not cluster_wanted(config, env):
        logger.info("no Kubernetes cluster configured; namespace annotations are not read")
        return StaticNamespaces(metrics)
    try:
        api = await new_api_client(config, env)
    except KubernetesUnavailableError:
        if config.enabled is True:
            raise
        logger.warning(
            "Kubernetes client could not be configured; running on config alone",
            exc_info=True,
        )
        return StaticNamespaces(metrics)
    return NamespaceCache(api, config=config, metrics=metrics)
