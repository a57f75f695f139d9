"""Adapter: the agent's writes to the Kubernetes API (Events, Node labels) and its client.

Every call here is best effort: the API server being down or refusing (RBAC,
admission) is logged and the agent keeps accounting, enforcing and serving
``mgctl`` with what it knows. The exact verbs used are declared in
:mod:`plugin.agent.permissions` and checked by the tests against the fake API.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, cast

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from plugin.agent.labels import label_patch

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
"""One API request may take this long; the cycle is never held up longer."""


class KubeUnavailableError(Exception):
    """No in-cluster service account and no kubeconfig: the agent runs without the API."""


async def open_api_client() -> client.ApiClient:
    """An API client from the pod's service account, else from ``KUBECONFIG``/``~/.kube``."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as incluster:
        try:
            # The library reads KUBECONFIG once, at import; read it now.
            await config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
            )
        except (config.ConfigException, OSError) as kubeconfig:
            raise KubeUnavailableError(
                f"no Kubernetes API credentials: not in a pod ({incluster}) and no usable "
                f"kubeconfig ({kubeconfig})"
            ) from kubeconfig
    return client.ApiClient(configuration=configuration)


def describe_api_error(exc: BaseException) -> str:
    """``403 Forbidden: nodes "n1" is forbidden: ...`` from an ApiException, else ``str()``."""
    if isinstance(exc, ApiException):
        message = exc.reason or ""
        body = exc.body
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                message = json.loads(body).get("message", message)
        return f"{exc.status} {message}".strip()
    return f"{type(exc).__name__}: {exc}"


class KubeEventSink:
    """Writes ``events.k8s.io/v1`` Events (an :class:`~plugin.agent.enforcement.EventSink`)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._events = client.EventsV1Api(api)

    async def record(self, event: Mapping[str, Any]) -> None:
        namespace = event["metadata"]["namespace"]
        try:
            await self._events.create_namespaced_event(
                namespace, cast(Any, dict(event)), _request_timeout=REQUEST_TIMEOUT_S
            )
        except Exception as exc:  # an Event is worth a log line, never a crash
            logger.warning(
                "could not record Event %s: %s",
                event.get("reason"),
                describe_api_error(exc),
                extra={"namespace": namespace, "pod": event["regarding"]["name"]},
            )


class NodeLabeler:
    """Keeps the ``metagpu.io/*`` labels of one Node equal to the desired values.

    Reads the Node once, then patches only when the desired labels differ from
    what it last saw; after a failed patch it reads the Node again next time,
    so a label someone else changed meanwhile is corrected, not assumed.
    """

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self._core = client.CoreV1Api(api)
        self.node_name = node_name
        self._current: dict[str, str] | None = None

    async def sync(self, desired: Mapping[str, str]) -> bool:
        """Make the labels match ``desired``; True if a patch was sent. Never raises."""
        try:
            if self._current is None:
                node = await self._core.read_node(
                    self.node_name, _request_timeout=REQUEST_TIMEOUT_S
                )
                self._current = dict(node.metadata.labels or {})
            patch = label_patch(self._current, desired)
            if not patch:
                return False
            # A merge patch of metadata.labels: None removes a label, others are
            # untouched, and no resourceVersion means no conflict with other writers.
            options: dict[str, Any] = {
                "_content_type": "application/merge-patch+json",
                "_request_timeout": REQUEST_TIMEOUT_S,
            }
            await self._core.patch_node(self.node_name, {"metadata": {"labels": patch}}, **options)
        except Exception as exc:
            self._current = None
            logger.warning(
                "could not update node labels: %s",
                describe_api_error(exc),
                extra={"node": self.node_name},
            )
            return False
        for key, value in patch.items():
            if value is None:
                self._current.pop(key, None)
            else:
                self._current[key] = value
        logger.info("node labels updated", extra={"node": self.node_name, "labels": patch})
        return True
