"""Bind: decide the GPUs, reserve them, and create the Binding that records them (adapter).

One API write. ``pods/binding`` accepts ``metadata.annotations`` and the API
server sets them on the pod in the same update that sets ``spec.nodeName``
(``pkg/registry/core/pod/storage/storage.go``, ``setPodHostAndAnnotations``).
So the assignment (``metagpu.io/assigned-gpus``) and the binding land
together or not at all: a node never sees a pod bound to it without its
assignment, and a failed bind leaves no annotation behind to clean up.

The Binding carries the pod's UID, as kube-scheduler's default binder sends
it, so a pod deleted and re-created under the same name is never bound on
the old one's decision (the API server answers 409).

Concurrency: :meth:`ExtenderCore.decide_bind` decides and reserves before the
first await, so two binds in flight for one node never take the same units.
Any failure drops the reservation and returns a message; kube-scheduler puts
it in the pod's FailedScheduling event and retries the pod.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import client as k8s_client

from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS
from plugin.extender.pods import PodSpecError
from plugin.extender.protocol import ExtenderBindingArgs
from plugin.extender.service import ExtenderCore
from plugin.kube.listwatch import status_message

logger = logging.getLogger(__name__)


class Binder:
    """Binds pods for the ``bind`` verb; :meth:`bind` never raises (cancellation aside)."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        core: ExtenderCore,
        *,
        in_flight: set[str] | None = None,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._v1 = k8s_client.CoreV1Api(api)
        self._core = core
        self._in_flight = in_flight if in_flight is not None else set()
        self._timeout_s = timeout_s
        self._clock = clock

    async def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; ``""`` when done, else why not (ExtenderBindingResult.Error)."""
        who = f"pod {args.PodNamespace}/{args.PodName}"
        ask = self._core.remembered_ask(args.PodUID)
        if ask is None:
            pod, problem = await self._read_pod(args)
            if pod is None:
                return f"cannot bind {who}: {problem}"
            try:
                ask = self._core.ask_of(pod)
            except PodSpecError as exc:
                return f"cannot bind {who}: cannot read its request: {exc}"
        decision = self._core.decide_bind(
            ask,
            node=args.Node,
            pod_uid=args.PodUID,
            namespace=args.PodNamespace,
            pod=args.PodName,
            now=self._clock(),
        )
        if isinstance(decision, str):
            return f"cannot bind {who} to node {args.Node}: {decision}"
        # Reserved from here on: every way out below either keeps it (bound) or drops it.
        self._in_flight.add(args.PodUID)
        try:
            problem = await self._create_binding(args, decision.assignment.model_dump_json())
        except BaseException:
            self._core.ledger.forget(args.PodUID)
            raise
        finally:
            self._in_flight.discard(args.PodUID)
        if problem:
            self._core.ledger.forget(args.PodUID)
            return f"cannot bind {who} to node {args.Node}: {problem}"
        logger.info(
            "bound pod with its GPU assignment",
            extra={
                "namespace": args.PodNamespace,
                "pod": args.PodName,
                "node": args.Node,
                "gpus": {c.container: c.gpus for c in decision.assignment.containers},
            },
        )
        return ""

    async def _read_pod(self, args: ExtenderBindingArgs) -> tuple[dict[str, Any] | None, str]:
        try:
            status, body = await self._call(
                self._v1.read_namespaced_pod(
                    args.PodName,
                    args.PodNamespace,
                    _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                )
            )
        except Exception as exc:
            return None, f"reading the pod failed: {type(exc).__name__}: {exc}"
        if status != 200:
            return None, f"reading the pod failed: HTTP {status}: {status_message(body)}"
        pod = json.loads(body)
        uid = (pod.get("metadata") or {}).get("uid")
        if uid != args.PodUID:
            return None, f"the pod now has UID {uid}, the scheduler asked for {args.PodUID}"
        return cast(dict[str, Any], pod), ""

    async def _create_binding(self, args: ExtenderBindingArgs, assignment: str) -> str:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": args.PodName,
                "namespace": args.PodNamespace,
                "uid": args.PodUID,
                "annotations": {ANNOTATION_ASSIGNED_GPUS: assignment},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.Node},
        }
        try:
            status, text = await self._call(
                self._v1.create_namespaced_pod_binding(
                    args.PodName,
                    args.PodNamespace,
                    cast(Any, body),
                    _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                )
            )
        except TimeoutError:
            return f"creating the Binding timed out after {self._timeout_s:g}s"
        except Exception as exc:
            return f"creating the Binding failed: {type(exc).__name__}: {exc}"
        if status // 100 != 2:
            return f"creating the Binding failed: HTTP {status}: {status_message(text)}"
        return ""

    @staticmethod
    async def _call(pending: Any) -> tuple[int, bytes]:
        resp = cast(aiohttp.ClientResponse, await pending)
        try:
            return resp.status, await resp.read()
        finally:
            resp.release()
