"""Adapter: the agent's writes to the Kubernetes API (Events, Node labels, GPU ledger).

Every call here is best effort: the API server being down or refusing (RBAC,
admission) is logged and the agent keeps accounting, enforcing and serving
``mgctl`` with what it knows. The exact verbs used are declared in
:mod:`plugin.agent.permissions` and checked by the tests against the fake API.
The client itself comes from an :data:`ApiOpener`: :func:`certs.kube.open_api_client`,
the one place metagpu loads its credentials, handed in by the ``metagpu agent``
command (:mod:`metagpu.agent`) because no module of plugin may import certs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from kubernetes_asyncio import client

from plugin.agent.labels import full_label_patch, label_patch
from plugin.agent.ledger import encode_ledger, ledger_key
from plugin.api.scheduling import ANNOTATION_GPU_LEDGER, ANNOTATION_LEDGER_REFRESH, NodeLedger
from plugin.kube.errors import (
    ApiOpener as ApiOpener,  # noqa: PLC0414 - re-exported
)
from plugin.kube.errors import (
    describe_api_error as describe_api_error,  # noqa: PLC0414 - re-exported
)

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
"""One API request may take this long; the cycle is never held up longer."""


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


class LedgerPublisher:
    """Keeps the ``metagpu.io/gpu-ledger`` annotation of one Node equal to the agent's ledger.

    Writes when the ledger changed (:func:`~plugin.agent.ledger.ledger_key`:
    everything but its time) since the last successful write, and when the last write
    is ``refresh_s`` old even if it did not (with the annotation
    ``metagpu.io/gpu-ledger-refresh-s`` saying so: the extender then tells a ledger
    whose agent is gone), by a merge patch of those annotations (the ``nodes``
    ``patch`` the labels already use; the Node is never read). A failed write is
    retried at the next cycle.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        max_bytes: int,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self.node_name = node_name
        self.max_bytes = max_bytes
        self.refresh_s = refresh_s
        self._clock = clock
        self._written: Any = None
        """:func:`ledger_key` of the ledger last written; None: unknown."""
        self._written_at = 0.0

    async def publish(self, ledger: NodeLedger) -> bool:
        """Write ``ledger`` if it changed or its refresh is due; True if a patch was sent.
        Never raises."""
        key = ledger_key(ledger)
        now = self._clock()
        if key == self._written and now - self._written_at < self.refresh_s:
            return False
        try:
            text = encode_ledger(ledger, max_bytes=self.max_bytes)
        except ValueError as exc:
            logger.error("%s", exc, extra={"node": self.node_name})
            return False
        refreshed = key == self._written
        if not await self._patch(text, what="GPU ledger", refresh_s=self.refresh_s):
            self._written = None
            return False
        self._written = key
        self._written_at = now
        (logger.debug if refreshed else logger.info)(
            "GPU ledger refreshed" if refreshed else "GPU ledger updated",
            extra={"node": self.node_name, "gpus": len(ledger.gpus), "bytes": len(text)},
        )
        return True

    async def withdraw(self) -> bool:
        """Remove the annotation (publishing is turned off): a ledger nobody keeps
        current must not go on steering the extender. Never raises."""
        self._written = None
        return await self._patch(None, what="GPU ledger removal")

    async def _patch(self, value: str | None, *, what: str, refresh_s: float | None = None) -> bool:
        refresh = f"{refresh_s:g}" if value is not None and refresh_s is not None else None
        body = {
            "metadata": {
                "annotations": {ANNOTATION_GPU_LEDGER: value, ANNOTATION_LEDGER_REFRESH: refresh}
            }
        }
        options: dict[str, Any] = {
            "_content_type": "application/merge-patch+json",
            "_request_timeout": REQUEST_TIMEOUT_S,
        }
        try:
            await self._core.patch_node(self.node_name, body, **options)
        except Exception as exc:
            logger.warning(
                "could not write the %s: %s",
                what,
                describe_api_error(exc),
                extra={"node": self.node_name},
            )
            return False
        return True
