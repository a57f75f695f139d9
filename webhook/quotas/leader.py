"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it (adapter).

Several webhook replicas may run the quota mirror; only the one holding the
Lease writes. The algorithm is client-go's ``tools/leaderelection``
(``tryAcquireOrRenew``) with its default timings (component-base
``RecommendedDefaultLeaderElectionConfiguration``: lease 15 s, renew
deadline 10 s, retry period 2 s):

* a candidate reads the Lease every ``retry_period_s``; it may take it when
  it does not exist, has no holder, or has not changed for
  ``leaseDurationSeconds`` *as observed by this process's monotonic clock*
  (never by comparing the holder's ``renewTime`` with our wall clock, so
  clock skew between nodes does not matter);
* taking and renewing are a replace carrying the ``resourceVersion`` read,
  so of two candidates at most one succeeds (the other gets 409 Conflict);
* the leader renews every ``retry_period_s``; when it has not renewed for
  ``renew_deadline_s`` it stops its work (and waits for it to stop) before
  anything else. Since ``renew_deadline_s`` < ``lease_duration_s``, it has
  stopped writing before any other candidate may take the Lease;
* on a clean stop (SIGTERM) it releases the Lease (empty holder, duration
  1 s, like client-go's ``ReleaseOnCancel``), so another replica takes over
  within one retry period instead of a whole lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, cast

from kubernetes_asyncio import client as k8s_client

from webhook.quotas.calls import Answer, call_api, raw_options

logger = logging.getLogger(__name__)

MICRO_TIME: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
"""``metav1.MicroTime`` as the API server writes it (RFC 3339, microseconds, UTC)."""

JITTER_FACTOR: Final = 1.2
"""client-go's ``JitterFactor``: renew_deadline must exceed retry_period × this."""


@dataclass(frozen=True)
class LeaseTiming:
    """Seconds; client-go requires lease > renew deadline > retry period × 1.2."""

    lease_duration_s: int = 15
    """Whole seconds: the Lease's ``leaseDurationSeconds`` is an integer."""
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError(
                f"lease_duration_s ({self.lease_duration_s}) must be greater than "
                f"renew_deadline_s ({self.renew_deadline_s})"
            )
        if not self.renew_deadline_s > JITTER_FACTOR * self.retry_period_s:
            raise ValueError(
                f"renew_deadline_s ({self.renew_deadline_s}) must be greater than "
                f"{JITTER_FACTOR} × retry_period_s ({self.retry_period_s})"
            )


def default_identity() -> str:
    """``<hostname>_<uuid>`` (client-go's convention): the pod name, unique per start."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def _now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime(MICRO_TIME)


class LeaderElector:
    """Runs ``work`` only while holding the Lease; see the module docstring."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        timing: LeaseTiming,
        work_name: str,
        release_on_cancel: bool = True,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        """``work_name`` (``quota mirror``, ``claim-template controller``) names the work in
        the logs and its task: one process may run two electors on two Leases."""
        self._leases = k8s_client.CoordinationV1Api(api)
        self._work_name = work_name
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self._timing = timing
        self._release_on_cancel = release_on_cancel
        self._on_change = on_change
        self._observed: dict[str, Any] | None = None
        """The Lease spec as last read or written."""
        self._observed_at = 0.0
        """Monotonic time at which :attr:`_observed` last changed."""
        self._observed_rv = ""
        self._renewed_at = 0.0
        self.leading = False

    # ------------------------------------------------------------------ run
    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Acquire, run ``work`` while leading, and again after losing the Lease; forever."""
        try:
            while True:
                await self._acquire()
                await self._lead(work)
        finally:
            if self._release_on_cancel:
                await self._release()

    async def _acquire(self) -> None:
        logger.info(
            "waiting to lead the %s",
            self._work_name,
            extra={"lease": f"{self._namespace}/{self._name}", "identity": self.identity},
        )
        loop = asyncio.get_running_loop()
        while True:
            sent = loop.time()
            if await self._attempt():
                self._renewed_at = sent
                return
            await asyncio.sleep(self._timing.retry_period_s)

    async def _lead(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._set_leading(True)
        worker = asyncio.create_task(work(), name=f"metagpu-{self._work_name.replace(' ', '-')}")
        renewer = asyncio.create_task(self._renew_until_lost(), name="metagpu-lease-renew")
        try:
            await asyncio.wait({worker, renewer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (worker, renewer):
                task.cancel()
            for task in (worker, renewer):
                with contextlib.suppress(asyncio.CancelledError):
                    try:
                        await task
                    except Exception:
                        logger.exception("%s stopped with an error", self._work_name)
            self._set_leading(False)
        # Lost the Lease, or the work ended: stand back for one period before trying again.
        await asyncio.sleep(self._timing.retry_period_s)

    def _set_leading(self, leading: bool) -> None:
        self.leading = leading
        logger.info(
            "leading the %s" if leading else "stopped leading the %s",
            self._work_name,
            extra={"lease": f"{self._namespace}/{self._name}", "identity": self.identity},
        )
        if self._on_change is not None:
            self._on_change(leading)

    async def _renew_until_lost(self) -> None:
        """Returns when the Lease could not be renewed for ``renew_deadline_s``."""
        loop = asyncio.get_running_loop()
        timing = self._timing
        while True:
            await asyncio.sleep(timing.retry_period_s)
            deadline = self._renewed_at + timing.renew_deadline_s
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    logger.warning(
                        "could not renew the quota mirror's Lease in time; stepping down",
                        extra={"renew_deadline_s": timing.renew_deadline_s},
                    )
                    return
                sent = loop.time()
                ok = False
                try:
                    async with asyncio.timeout(remaining):
                        ok = await self._attempt()
                except TimeoutError:
                    ok = False
                if ok:
                    self._renewed_at = sent
                    break
                await asyncio.sleep(min(timing.retry_period_s, max(deadline - loop.time(), 0)))

    # -------------------------------------------------------------- attempts
    async def _attempt(self) -> bool:
        """client-go's ``tryAcquireOrRenew``: True when we hold the Lease now."""
        try:
            return await self._try_acquire_or_renew()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("Lease request failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            return False

    async def _try_acquire_or_renew(self) -> bool:
        loop = asyncio.get_running_loop()
        now_text = _now_text()
        got = await call_api(
            lambda: self._leases.read_namespaced_lease(self._name, self._namespace, **raw_options())
        )
        if got.status == 404:
            spec = self._spec(holder=self.identity, acquired=now_text, renewed=now_text, moves=0)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": spec,
            }
            made = await call_api(
                lambda: self._leases.create_namespaced_lease(
                    self._namespace, cast(Any, body), **raw_options()
                )
            )
            return self._written(made, loop.time())
        if not got.ok or got.obj is None:
            self._log_refused("read", got)
            return False
        current = got.obj.get("spec") or {}
        if current != self._observed:
            self._observed, self._observed_at = current, loop.time()
        holder = current.get("holderIdentity") or ""
        duration = current.get("leaseDurationSeconds") or self._timing.lease_duration_s
        if holder and holder != self.identity and self._observed_at + float(duration) > loop.time():
            return False
        mine = holder == self.identity
        moves = int(current.get("leaseTransitions") or 0)
        spec = self._spec(
            holder=self.identity,
            acquired=current.get("acquireTime") if mine else now_text,
            renewed=now_text,
            moves=moves if mine else moves + 1,
        )
        body = dict(got.obj)
        body["spec"] = spec
        put = await call_api(
            lambda: self._leases.replace_namespaced_lease(
                self._name, self._namespace, cast(Any, body), **raw_options()
            )
        )
        return self._written(put, loop.time())

    def _spec(self, *, holder: str, acquired: Any, renewed: str, moves: int) -> dict[str, Any]:
        return {
            "holderIdentity": holder,
            "leaseDurationSeconds": self._timing.lease_duration_s,
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": moves,
        }

    def _written(self, answer: Answer, now: float) -> bool:
        if answer.ok and answer.obj is not None:
            self._observed, self._observed_at = answer.obj.get("spec") or {}, now
            return True
        if answer.status != 409:  # 409: another candidate was faster; normal
            self._log_refused("write", answer)
        return False

    def _log_refused(self, what: str, answer: Answer) -> None:
        logger.warning(
            "the API refused a Lease %s",
            what,
            extra={"status": answer.status, "reason": answer.message},
        )

    async def _release(self) -> None:
        """Give the Lease up (empty holder), bounded by the renew deadline; best effort."""
        try:
            async with asyncio.timeout(self._timing.renew_deadline_s):
                got = await call_api(
                    lambda: self._leases.read_namespaced_lease(
                        self._name, self._namespace, **raw_options()
                    )
                )
                if not got.ok or got.obj is None:
                    return
                spec = got.obj.get("spec") or {}
                if spec.get("holderIdentity") != self.identity:
                    return
                now_text = _now_text()
                body = dict(got.obj)
                body["spec"] = {
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "acquireTime": now_text,
                    "renewTime": now_text,
                    "leaseTransitions": spec.get("leaseTransitions") or 0,
                }
                put = await call_api(
                    lambda: self._leases.replace_namespaced_lease(
                        self._name, self._namespace, cast(Any, body), **raw_options()
                    )
                )
                if put.ok:
                    logger.info("released the quota mirror's Lease")
        except Exception as exc:
            logger.warning(
                "could not release the quota mirror's Lease; another replica takes over "
                "when it expires",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
