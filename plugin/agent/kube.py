"""Adapter: the agent's writes to the Kubernetes API (Events, Node labels).

Every call here is best effort: the API server being down or refusing (RBAC,
admission) is logged and the agent keeps accounting, enforcing and serving
``mgctl`` with what it knows. The exact verbs used are declared in
:mod:`plugin.agent.permissions` and checked by the tests against the fake API.
The client itself comes from an :data:`ApiOpener`: :func:`certs.kube.open_api_client`,
the one place metagpu loads its credentials, handed in by the ``metagpu agent``
command (:mod:`metagpu.agent`) because no module of plugin may import certs.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeAlias, cast

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from plugin.agent.labels import full_label_patch, label_patch

logger = logging.getLogger(__name__)

ApiOpener: TypeAlias = Callable[[], AbstractAsyncContextManager[tuple[client.ApiClient, str]]]
"""Opens an API client with loaded credentials, closed on exit; yields ``(client, source)``.

The shape of :func:`certs.kube.open_api_client` called with no arguments."""

REQUEST_TIMEOUT_S = 10.0
"""One API request may take this long; the cycle is never held up longer."""


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

    Never reads the Node: the first write (and the first after a failed one)
    sets every owned label, to its value or removed
    (:func:`~plugin.agent.labels.full_label_patch`); later ones patch only the
    labels whose desired value changed since the last successful write.
    """

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self._core = client.CoreV1Api(api)
        self.node_name = node_name
        self._current: dict[str, str] | None = None
        """The owned labels as last written; None: unknown (write them all)."""

    async def sync(self, desired: Mapping[str, str]) -> bool:
        """Make the labels match ``desired``; True if a patch was sent. Never raises."""
        current = self._current
        patch = full_label_patch(desired) if current is None else label_patch(current, desired)
        if not patch:
            return False
        # A merge patch of metadata.labels: None removes a label, others are
        # untouched, and no resourceVersion means no conflict with other writers.
        options: dict[str, Any] = {
            "_content_type": "application/merge-patch+json",
            "_request_timeout": REQUEST_TIMEOUT_S,
        }
        try:
            await self._core.patch_node(self.node_name, {"metadata": {"labels": patch}}, **options)
        except Exception as exc:
            self._current = None  # what the Node carries now is unknown: write all next time
            logger.warning(
                "could not update node labels: %s",
                describe_api_error(exc),
                extra={"node": self.node_name},
            )
            return False
        merged = {**(current or {}), **patch}
        self._current = {key: value for key, value in merged.items() if value is not None}
        logger.info("node labels updated", extra={"node": self.node_name, "labels": patch})
        return True
