"""kubernetes-asyncio adapter: credentials for every component, and bootstrap's requests.

:func:`load_credentials` / :func:`open_api_client` are the one way metagpu
finds its Kubernetes credentials (bootstrap, the webhook's namespace cache and
the node agent use them), and :func:`status_fields` the one way it reads an
API error's ``Status`` body.

The only module of ``certs`` that imports kubernetes-asyncio. It implements
:class:`certs.cluster.ClusterApi` with raw JSON in and out
(``_preload_content=False``), so an update sends back exactly the object the
API server returned, with fields this client version has no model for.
HTTP statuses become :class:`certs.cluster.ApiError` subclasses here and
nowhere else; a 403 message names the verb, resource, name, namespace and the
RBAC rule that would allow it.

Nothing here logs request or response bodies: Secrets carry private keys.
(kubernetes-asyncio itself logs response bodies at DEBUG on its
``_preload_content=True`` path, which this adapter does not use.)
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from certs.bootstrap import BootstrapError
from certs.cluster import (
    ApiAlreadyExistsError,
    ApiCall,
    ApiConflictError,
    ApiError,
    ApiForbiddenError,
    ApiNotFoundError,
    ApiUnavailableError,
    Obj,
    forbidden_message,
)
from certs.permissions import ADMISSION_GROUP
from plugin.api.permissions import Permission

DEFAULT_REQUEST_TIMEOUT_S: Final = 10.0
"""Per request. The API server answers these small reads and writes in
milliseconds; ten seconds rides out a leader election without hanging a Job."""

SERVICE_ACCOUNT_NAMESPACE_FILE: Final = Path(
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)
TRANSIENT_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


class KubeCredentialsError(BootstrapError):
    """No usable Kubernetes credentials; the message says what was tried.

    Every caller (bootstrap, the webhook's namespace cache, the node agent)
    catches this. It is a :class:`BootstrapError` so that ``metagpu certs
    bootstrap`` reports it like its other failures (one line, exit 1).
    """


async def load_credentials(
    cfg: client.Configuration,
    *,
    kubeconfig: Path | None = None,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Fill ``cfg``; returns where the credentials came from, for the log.

    The one place metagpu decides which identity it talks to the API as, so a
    pod never runs as two: ``kubeconfig`` (or ``context``) when given; else the
    in-cluster service account; else ``$KUBECONFIG`` (its files joined by
    ``:``); else ``~/.kube/config``. A kubeconfig is loaded with
    ``persist_config=False``, so refreshed tokens are never written back into
    a user's file. ``env`` stands in for ``os.environ`` (read now, not at
    import as kubernetes-asyncio does). Raises :class:`KubeCredentialsError`.
    """
    env = os.environ if env is None else env
    in_cluster: str | None = None
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config(client_configuration=cfg, environ=dict(env))  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:  # OSError: an unreadable token file
            in_cluster = f"no in-cluster service account ({exc}) and "
        else:
            return "in-cluster service account"
    paths = str(kubeconfig) if kubeconfig else env.get("KUBECONFIG") or "~/.kube/config"
    existing = _existing_files(paths)
    if not existing:
        raise KubeCredentialsError(
            f"no Kubernetes credentials: {in_cluster or ''}no kubeconfig file at {paths} "
            "(give one with --kubeconfig or KUBECONFIG)"
        )
    try:
        await config.load_kube_config(
            config_file=os.pathsep.join(existing),
            context=context,
            client_configuration=cfg,
            persist_config=False,
        )
    except Exception as exc:  # the loader raises whatever a malformed file provokes
        raise KubeCredentialsError(
            f"cannot use kubeconfig {paths}: {type(exc).__name__}: {exc}"
        ) from exc
    return f"kubeconfig {os.pathsep.join(existing)}"


def _existing_files(paths: str) -> list[str]:
    return [
        str(Path(p).expanduser())
        for p in paths.split(os.pathsep)
        if p and Path(p).expanduser().is_file()
    ]


@asynccontextmanager
async def open_api_client(
    *, kubeconfig: Path | None = None, context: str | None = None
) -> AsyncIterator[tuple[client.ApiClient, str]]:
    """An ApiClient with loaded credentials, closed on exit; yields ``(client, source)``."""
    cfg = client.Configuration()
    source = await load_credentials(cfg, kubeconfig=kubeconfig, context=context)
    async with client.ApiClient(cfg) as api_client:
        yield api_client, source


def default_namespace(fallback: str) -> str:
    """The pod's own namespace when running in-cluster, else ``fallback``."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or fallback
    except OSError:
        return fallback


class KubeClusterApi:
    """:class:`certs.cluster.ClusterApi` over kubernetes-asyncio."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        permissions: Iterable[Permission] = (),
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._admission = client.AdmissionregistrationV1Api(api_client)
        self._timeout_s = request_timeout_s
        self._permissions = tuple(permissions)

    async def get_secret(self, namespace: str, name: str) -> Obj | None:
        call = ApiCall("get", "secrets", name=name, namespace=namespace)
        return await self._request(
            call,
            lambda: self._core.read_namespaced_secret(name, namespace, **self._raw()),
            missing_ok=True,
        )

    async def create_secret(self, namespace: str, body: Obj) -> Obj:
        name = (body.get("metadata") or {}).get("name")
        call = ApiCall("create", "secrets", name=name, namespace=namespace)
        return await self._required(
            call,
            lambda: self._core.create_namespaced_secret(namespace, cast(Any, body), **self._raw()),
        )

    async def replace_secret(self, namespace: str, name: str, body: Obj) -> Obj:
        call = ApiCall("update", "secrets", name=name, namespace=namespace)
        return await self._required(
            call,
            lambda: self._core.replace_namespaced_secret(
                name, namespace, cast(Any, body), **self._raw()
            ),
        )

    async def get_webhook_config(self, name: str) -> Obj | None:
        call = ApiCall("get", "mutatingwebhookconfigurations", group=ADMISSION_GROUP, name=name)
        return await self._request(
            call,
            lambda: self._admission.read_mutating_webhook_configuration(name, **self._raw()),
            missing_ok=True,
        )

    async def patch_webhook_config(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj:
        call = ApiCall("patch", "mutatingwebhookconfigurations", group=ADMISSION_GROUP, name=name)
        # The client would pick strategic merge for a dict body anyway; say it.
        extra: dict[str, Any] = {"_content_type": STRATEGIC_MERGE_PATCH, **self._raw()}
        if dry_run:
            extra["dry_run"] = "All"
        return await self._required(
            call,
            lambda: self._admission.patch_mutating_webhook_configuration(name, patch, **extra),
        )

    # ------------------------------------------------------------ internals
    def _raw(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self._timeout_s}

    async def _required(self, call: ApiCall, send: Callable[[], Awaitable[Any]]) -> Obj:
        obj = await self._request(call, send)
        assert obj is not None
        return obj

    async def _request(
        self, call: ApiCall, send: Callable[[], Awaitable[Any]], *, missing_ok: bool = False
    ) -> Obj | None:
        try:
            resp = await send()
            async with resp:
                status: int = resp.status
                body: bytes = await resp.read()
        except ApiException as exc:  # raised by the client before anything was sent
            raise ApiError(call, f"cannot {call.describe()}: {exc.reason}") from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiUnavailableError(
                call, f"cannot {call.describe()}: {type(exc).__name__}: {exc}"
            ) from exc
        if 200 <= status < 300:
            try:
                obj: Obj = json.loads(body)
            except ValueError as exc:
                raise ApiError(
                    call, f"cannot {call.describe()}: the response is not JSON", status=status
                ) from exc
            return obj
        if status == 404 and missing_ok:
            return None
        raise self._error(call, status, body)

    def _error(self, call: ApiCall, status: int, body: bytes) -> ApiError:
        message, reason = status_fields(body)
        detail = f"{message} (HTTP {status}{', ' + reason if reason else ''})"
        if status == 403:
            return ApiForbiddenError(
                call, forbidden_message(call, message, self._permissions), status=status
            )
        if status == 404:
            if call.verb == "create" and call.namespace:
                detail = f'namespace "{call.namespace}" does not exist? {detail}'
            return ApiNotFoundError(call, f"cannot {call.describe()}: {detail}", status=status)
        if status == 409:
            kind = ApiAlreadyExistsError if reason == "AlreadyExists" else ApiConflictError
            return kind(call, f"cannot {call.describe()}: {detail}", status=status)
        if status in TRANSIENT_STATUSES:
            return ApiUnavailableError(call, f"cannot {call.describe()}: {detail}", status=status)
        if status == 401:
            detail = f"the API server rejected the credentials (expired token?): {detail}"
        return ApiError(call, f"cannot {call.describe()}: {detail}", status=status)


def status_fields(body: bytes) -> tuple[str, str]:
    """``(message, reason)`` of an API error's ``Status`` body.

    The first 200 characters of the body stand in for the message when it is
    not a Status with a message (a proxy's HTML page, an empty body).
    """
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict):
        message, reason = status.get("message"), status.get("reason")
        if isinstance(message, str) and message:
            return message, reason if isinstance(reason, str) else ""
    return body[:200].decode("utf-8", "replace").strip(), ""
