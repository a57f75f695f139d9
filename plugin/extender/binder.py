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
Any failure (an HTTP error, a timeout, no answer) drops the reservation and
returns a message; kube-scheduler puts it in the pod's FailedScheduling event
and retries the pod. A Binding that timed out here may still have been
applied by the API server: the pod watch then sees the pod bound with its
assignment and the ledger cache counts its units again
(:mod:`plugin.extender.cache`), as after a restart.

Throughput: kube-scheduler binds every pod in a goroutine of its own
(``bindingCycle``) and POSTs the extender's ``bind`` verb from there, so a
burst of pods arrives as many binds at once. Each costs one POST of a Binding
encoded once (:mod:`plugin.extender.bindings`, one aiohttp session whose
connection limit is ``max_in_flight``). At most ``max_in_flight`` binds run at
once; one more is refused at once, before it reserves anything, with a
message saying so (the scheduler retries the pod after its back-off): past
that many the API server is not answering, and queueing more here would only
turn them into timeouts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final, Protocol, cast

from plugin.api import jsonwire
from plugin.api.scheduling import ANNOTATION_ASSIGNED_GPUS
from plugin.extender.pods import PodSpecError
from plugin.extender.protocol import ExtenderBindingArgs
from plugin.extender.service import ExtenderCore
from plugin.kube.listwatch import status_message

logger = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT: Final = 128
"""See :attr:`plugin.extender.config.ExtenderConfig.max_binds_in_flight`."""


class BindingApi(Protocol):
    """The two API calls of a bind (:class:`plugin.extender.bindings.BindingClient`).

    Both return the HTTP status and the answer's body, and raise an exception
    whose ``str()`` says why when no answer came (timeout, connection, TLS).
    """

    @property
    def timeout_s(self) -> float: ...

    async def create_binding(
        self, *, namespace: str, name: str, body: bytes
    ) -> tuple[int, bytes]: ...

    async def read_pod(self, *, namespace: str, name: str) -> tuple[int, bytes]: ...


class Binder:
    """Binds pods for the ``bind`` verb; :meth:`bind` never raises (cancellation aside)."""

    def __init__(
        self,
        api: BindingApi,
        core: ExtenderCore,
        *,
        in_flight: set[str] | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self._api = api
        self._core = core
        self._in_flight = in_flight if in_flight is not None else set()
        """UIDs whose Binding is being written (the cache keeps their reservations)."""
        self._max_in_flight = max_in_flight
        self._running = 0
        """Binds between the gate and their answer (pod read, decision, Binding)."""
        self._clock = clock

    @property
    def running(self) -> int:
        """Binds in flight now."""
        return self._running

    async def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; ``""`` when done, else why not (ExtenderBindingResult.Error)."""
        who = f"pod {args.PodNamespace}/{args.PodName}"
        if self._running >= self._max_in_flight:
            return (
                f"cannot bind {who}: {self._running} binds are in flight already, the most "
                f"this extender runs at once (max_binds_in_flight {self._max_in_flight}); "
                "the API server is answering slowly, the scheduler will retry the pod"
            )
        self._running += 1
        try:
            return await self._bind(args, who)
        finally:
            self._running -= 1

    async def _bind(self, args: ExtenderBindingArgs, who: str) -> str:
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
        """The pod, when no filter call left its ask (an extender restarted in between)."""
        try:
            status, body = await self._api.read_pod(namespace=args.PodNamespace, name=args.PodName)
        except Exception as exc:
            return None, f"reading the pod failed: {exc}"
        if status != 200:
            return None, f"reading the pod failed: HTTP {status}: {status_message(body)}"
        try:
            pod = jsonwire.loads(body, what="a Pod")
        except jsonwire.JsonBodyError as exc:
            return None, f"reading the pod failed: {exc}"
        if not isinstance(pod, dict):
            return None, "reading the pod failed: the answer is not a Pod"
        uid = (pod.get("metadata") or {}).get("uid")
        if uid != args.PodUID:
            return None, f"the pod now has UID {uid}, the scheduler asked for {args.PodUID}"
        return cast(dict[str, Any], pod), ""

    async def _create_binding(self, args: ExtenderBindingArgs, assignment: str) -> str:
        body = jsonwire.dumps(
            {
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
        )
        try:
            status, text = await self._api.create_binding(
                namespace=args.PodNamespace, name=args.PodName, body=body
            )
        except Exception as exc:
            return f"creating the Binding failed: {exc}"
        if status // 100 != 2:
            return f"creating the Binding failed: HTTP {status}: {status_message(text)}"
        return ""
