"""The extender's own preemption: evict the victims through the Eviction API, and say so (adapter).

Used only where kube-scheduler cannot preempt for a fraction itself (no node
passes the filter, yet every node's *total* is enough, so its dry run finds
nothing to evict; :mod:`plugin.extender.preemption_book`). For each
:class:`~plugin.extender.preemption_book.Proposal`, after its hand-over time:

1. if ``preemptVerb`` took the pod over meanwhile, do nothing;
2. evict each victim with a policy/v1 ``Eviction`` (``pods/{name}/eviction``,
   the pod's UID as precondition, its own grace period): the API server checks
   the victim's PodDisruptionBudget, adds the ``DisruptionTarget`` condition and
   deletes the pod gracefully, as ``kubectl drain`` does. kube-scheduler deletes
   its victims without asking budgets (it only prefers victims that violate none);
   the extender cannot override a budget, and does not try;
3. a refusal (429: the budget allows no disruption now; or any other error)
   ends the attempt: the nomination is withdrawn, the refused pod is spared for
   ``spare_s`` so the next attempt chooses others, and the preemptor gets a
   Warning event saying which pod and why;
4. Events (core/v1): ``Preempted`` on each victim (kube-scheduler's reason, with
   the preemptor as ``related``), ``Preempting`` on the preemptor, naming the
   node, GPUs and victims.

:meth:`Evictor.start` never blocks the filter call: each proposal runs in a
task of its own, kept and cancelled on :meth:`Evictor.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio import client as k8s_client

from plugin.extender.metrics import EvictionOutcome, ExtenderMetrics
from plugin.extender.preemption import Victim
from plugin.extender.preemption_book import Proposal
from plugin.extender.service import ExtenderCore
from plugin.kube.listwatch import status_message

logger = logging.getLogger(__name__)

COMPONENT: Final = "metagpu-scheduler"
"""The Events' source: the scheduler whose extender preempts."""


class Evictor:
    """Use as ``async with Evictor(api, core, metrics) as evictor``."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        core: ExtenderCore,
        metrics: ExtenderMetrics,
        *,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._v1 = k8s_client.CoreV1Api(api)
        self._core = core
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._instance = socket.gethostname()

    async def __aenter__(self) -> Evictor:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def start(self, proposal: Proposal) -> None:
        task = asyncio.create_task(
            self._run(proposal), name=f"metagpu-extender-preempt-{proposal.preemptor.uid}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def idle(self) -> None:
        """Wait until no proposal is being worked on (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("preemption task failed", exc_info=task.exception())

    # ------------------------------------------------------------------ run
    async def _run(self, proposal: Proposal) -> None:
        core, pod, plan = self._core, proposal.preemptor, proposal.plan
        delay = proposal.evict_at - self._clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if core.book.proposal(pod.uid) is not proposal:
            self._metrics.preemptions.labels("extender", "handed_over").inc()
            logger.info(
                "preemption left to kube-scheduler (preemptVerb named victims for the pod)",
                extra={"namespace": pod.namespace, "pod": pod.name, "node": plan.node},
            )
            return
        try:
            for victim in plan.victims:
                outcome, problem = await self._evict(victim)
                self._metrics.evictions.labels(outcome).inc()
                if outcome == "evicted":
                    logger.info(
                        "evicted a lower-priority pod for a fraction",
                        extra={
                            "namespace": victim.namespace,
                            "pod": victim.name,
                            "node": plan.node,
                            "preemptor": f"{pod.namespace}/{pod.name}",
                        },
                    )
                    await self._event(
                        about=_ref(victim.namespace, victim.name, victim.uid),
                        related=_ref(pod.namespace, pod.name, pod.uid),
                        kind="Normal",
                        reason="Preempted",
                        message=f"Preempted by pod {pod.namespace}/{pod.name} ({pod.uid}) "
                        f"on node {plan.node}: {COMPONENT} frees GPU "
                        f"{', '.join(plan.gpus)} for a pod of priority {pod.priority}",
                    )
                if outcome in ("evicted", "gone"):
                    continue
                self._give_up(proposal, victim, outcome, problem)
                await self._event(
                    about=_ref(pod.namespace, pod.name, pod.uid),
                    related=_ref(victim.namespace, victim.name, victim.uid),
                    kind="Warning",
                    reason="PreemptionFailed",
                    message=f"{COMPONENT} could not evict {victim.namespace}/{victim.name} "
                    f"on node {plan.node} to free a GPU for this pod: {problem}; the next "
                    "attempt chooses other pods",
                )
                return
            self._metrics.preemptions.labels("extender", "evicted").inc()
            names = ", ".join(f"{v.namespace}/{v.name}" for v in plan.victims)
            await self._event(
                about=_ref(pod.namespace, pod.name, pod.uid),
                related=None,
                kind="Normal",
                reason="Preempting",
                message=f"{COMPONENT} evicted {len(plan.victims)} lower-priority pod(s) on "
                f"node {plan.node} ({names}); GPU {', '.join(plan.gpus)} is held for this pod "
                f"for up to {core.preemption.nomination_timeout_s:g}s",
            )
        finally:
            core.book.finish(proposal)

    def _give_up(self, proposal: Proposal, victim: Victim, outcome: str, problem: str) -> None:
        core, pod = self._core, proposal.preemptor
        core.book.spare(victim.uid, until=self._clock() + core.preemption.spare_s)
        core.ledger.withdraw(pod.uid)
        self._metrics.preemptions.labels(
            "extender", "refused" if outcome == "refused" else "failed"
        ).inc()
        logger.warning(
            "preemption stopped: the API did not evict a victim",
            extra={
                "namespace": pod.namespace,
                "pod": pod.name,
                "victim": f"{victim.namespace}/{victim.name}",
                "node": proposal.plan.node,
                "problem": problem,
            },
        )

    async def _evict(self, victim: Victim) -> tuple[EvictionOutcome, str]:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": victim.name, "namespace": victim.namespace},
            "deleteOptions": {"preconditions": {"uid": victim.uid}},
        }
        try:
            status, text = await _call(
                self._v1.create_namespaced_pod_eviction(
                    victim.name,
                    victim.namespace,
                    cast(Any, body),
                    _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                )
            )
        except TimeoutError:
            return "failed", f"the eviction timed out after {self._timeout_s:g}s"
        except Exception as exc:
            return "failed", f"the eviction failed: {type(exc).__name__}: {exc}"
        if status // 100 == 2:
            return "evicted", ""
        if status == 404:
            return "gone", ""
        if status == 409 and b"Precondition failed" in text:
            return "gone", ""  # another pod of that name now: ours is gone
        outcome: EvictionOutcome = "refused" if status == 429 else "failed"
        return outcome, f"HTTP {status}: {status_message(text)}"

    async def _event(
        self,
        *,
        about: dict[str, str],
        related: dict[str, str] | None,
        kind: str,
        reason: str,
        message: str,
    ) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{about['name']}.", "namespace": about["namespace"]},
            "involvedObject": about,
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "action": "Preempting",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if related is not None:
            body["related"] = related
        try:
            status, text = await _call(
                self._v1.create_namespaced_event(
                    about["namespace"],
                    cast(Any, body),
                    _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                )
            )
        except Exception as exc:
            logger.warning("could not record an event: %s: %s", type(exc).__name__, exc)
            return
        if status // 100 != 2:
            logger.warning("could not record an event: HTTP %s: %s", status, status_message(text))


def _ref(namespace: str, name: str, uid: str) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


async def _call(pending: Any) -> tuple[int, bytes]:
    resp = cast(aiohttp.ClientResponse, await pending)
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()
