"""The binder's API calls over one aiohttp session: Bindings out, pods in (adapter).

Why not kubernetes-asyncio's generated ``create_namespaced_pod_binding`` (the
binder's path before): its session is made with ``trust_env=True``, so aiohttp
looks up ``~/.netrc`` and the proxy environment in the default thread pool on
*every* request, two thread hops per bind, each queued behind the other
binds' in a pool of ``min(32, CPUs + 4)`` threads (six on a two-core node);
and the generated call checks its parameters, walks the body model by model
and ``json.dumps`` it again per call. Together about half the CPU of a bind,
and the binds in flight queue for the pool (``tests/benchmarks/extender_bind.py``,
``docs/benchmarks.md``). Here a bind is one POST of bytes encoded once.

Kept exactly as kubernetes-asyncio sets them up, from the ``ApiClient`` the
rest of the extender uses:

* **TLS**: the connector is the one kubernetes-asyncio's own
  ``RESTClientObject`` builds from the client's ``Configuration`` (the CA
  bundle, a client certificate, ``verify_ssl``, ``tls_server_name``), so the
  API server's certificate is verified against the same CA, the same way;
* **credentials**: the ``Authorization`` header comes from
  ``ApiClient.update_params_for_auth`` on every request, which runs the
  ``Configuration``'s refresh hook: the in-cluster loader re-reads the rotated
  service-account token file (bound tokens rotate hourly), a kubeconfig's
  exec plugin or OIDC provider refreshes;
* **proxy**: ``Configuration.proxy``, else the environment's
  (``HTTPS_PROXY``/``NO_PROXY``), resolved once when the client opens (aiohttp
  resolved it per request; a running process's environment does not change);
* the ``ApiClient``'s default headers (its ``User-Agent``).

Not kept: ``~/.netrc``. aiohttp refuses a netrc login together with the bearer
token, so no working set-up relied on it.

The connection limit is the caller's (the binder sizes it to the binds it
lets in flight), so a bind never waits for a connection another bind holds.
Every call is bounded by ``timeout_s`` in total: waiting for a connection,
connecting, the TLS handshake, sending, and reading the answer.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from types import TracebackType
from typing import Final
from urllib.parse import quote

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.rest import RESTClientObject
from yarl import URL

logger = logging.getLogger(__name__)

JSON: Final = "application/json"
AUTH_SETTINGS: Final = ["BearerToken"]
"""What kubernetes-asyncio's generated calls of the core API ask ``update_params_for_auth`` for."""


class ApiCallError(Exception):
    """The call got no HTTP answer (timeout, refused connection, TLS); ``str()`` says which."""


class BindingClient:
    """``POST pods/{name}/binding`` and ``GET pods/{name}``, bytes in and out.

    Use as ``async with BindingClient(api, connections=..., timeout_s=...) as client``;
    the session and its connections close when the block exits.
    """

    def __init__(self, api: ApiClient, *, connections: int, timeout_s: float) -> None:
        if connections < 1:
            raise ValueError(f"connections must be at least 1, got {connections}")
        self._api = api
        self._connections = connections
        self.timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._base = (api.configuration.host or "").rstrip("/")
        self._rest: RESTClientObject | None = None
        self._session: aiohttp.ClientSession | None = None
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None
        self._proxy_headers: dict[str, str] | None = None
        self._server_hostname: str | None = None

    async def __aenter__(self) -> BindingClient:
        cfg = self._api.configuration
        # kubernetes-asyncio's own connector: its TLS context, our connection limit.
        rest = RESTClientObject(cfg, maxsize=self._connections)
        self._rest = rest
        self._session = aiohttp.ClientSession(
            connector=rest.pool_manager.connector,
            connector_owner=False,
            trust_env=False,
        )
        self._server_hostname = rest.server_hostname or None
        self._proxy_headers = rest.proxy_headers or None
        if rest.proxy:
            self._proxy = URL(rest.proxy)
        else:
            with suppress(LookupError):
                self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(self._base))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session, self._session = self._session, None
        rest, self._rest = self._rest, None
        if session is not None:
            await session.close()
        if rest is not None:
            await rest.close()  # closes the connector and its connections

    @property
    def connections(self) -> int:
        """The most connections (so calls) the client holds at once."""
        return self._connections

    def pod_url(self, namespace: str, name: str) -> str:
        return f"{self._base}/api/v1/namespaces/{quote(namespace, safe='')}/pods/" + quote(
            name, safe=""
        )

    async def create_binding(self, *, namespace: str, name: str, body: bytes) -> tuple[int, bytes]:
        """POST an encoded Binding; the HTTP status and the answer's body."""
        return await self._call("POST", self.pod_url(namespace, name) + "/binding", body)

    async def read_pod(self, *, namespace: str, name: str) -> tuple[int, bytes]:
        """GET the pod; the HTTP status and the answer's body (the Pod's JSON on 200)."""
        return await self._call("GET", self.pod_url(namespace, name), None)

    async def _call(self, method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
        session = self._session
        if session is None:
            raise ApiCallError("the API client is closed")
        headers = dict(self._api.default_headers)
        headers["Accept"] = JSON
        if body is not None:
            headers["Content-Type"] = JSON
        queries: list[tuple[str, str]] = []
        # Every request: the refresh hook re-reads a rotated token, as the generated calls do.
        await self._api.update_params_for_auth(headers, queries, AUTH_SETTINGS)
        try:
            async with session.request(
                method,
                url,
                data=body,
                params=queries or None,
                headers=headers,
                timeout=self._timeout,
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
                proxy_headers=self._proxy_headers,
                server_hostname=self._server_hostname,
            ) as resp:
                return resp.status, await resp.read()
        except TimeoutError:
            raise ApiCallError(f"timed out after {self.timeout_s:g}s") from None
        except aiohttp.ClientError as exc:
            raise ApiCallError(f"{type(exc).__name__}: {exc}") from exc
