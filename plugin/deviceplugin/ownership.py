"""Adapter: withdraw the GPUs another device plugin also hands out (one owner per GPU).

Every ``interval_s`` (and once before the plugin registers), read what the
kubelet knows of every resource (:class:`~plugin.deviceplugin.podresources.PodResourcesReader`),
ask the pure core (:func:`plugin.placement.ownership.find_foreign_claims`)
which of the GPUs we serve another resource advertises or has allocated, and
put those on the :class:`~plugin.gpu.health_monitor.HealthBoard`: their
meta-devices go Unhealthy through the real ``ListAndWatch``, with a reason that
names the other resource, and come back when it lets go. The board logs each
change once.

There is no switch for this: a plugin that does not know about metagpu cannot
share a GPU with it safely. What the check cannot do is logged, once per
change of state: the PodResources socket not mounted, or the kubelet not
answering (the last known claims are kept, never healed on a failed read).

The Kubernetes Event on the Node, the metric and the mgctl view come from the
node agent, which reads the same API with the same core and already has the
API credentials, the Event writer and the metrics endpoint; the device plugin
keeps needing no Kubernetes API access for this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Final, Protocol

from plugin.api.gpus import GpuInfo
from plugin.deviceplugin.podresources import NodeDevices
from plugin.gpu.health_monitor import HealthBoard
from plugin.kubelet.podresources import PodResourcesError
from plugin.placement.ownership import Ownership, find_foreign_claims

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S: Final = 10.0
"""How often the claims are read again. A conflict that starts between checks is
the kubelet allocating another plugin's device it already advertised; the check
before registration and every 10 s after bound how long both can hand it out."""


class NodeDevicesSource(Protocol):
    """The kubelet's PodResources API (a
    :class:`~plugin.deviceplugin.podresources.PodResourcesReader`)."""

    async def read(self) -> NodeDevices: ...

    async def close(self) -> None: ...


class OwnershipWatch:
    """Keeps ``board``'s foreign claims equal to what the kubelet reports."""

    def __init__(
        self,
        board: HealthBoard,
        source: NodeDevicesSource,
        *,
        gpus: Callable[[], Sequence[GpuInfo]],
        own_resources: Callable[[], Collection[str]],
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self._board = board
        self._source = source
        self._gpus = gpus
        self._own = own_resources
        self.interval_s = interval_s
        self.problem: str | None = None
        """Why the last check could not read the kubelet; None when it could."""
        self.checks = 0
        """Completed checks (successful or not); tests wait on it."""
        self._checked = asyncio.Event()

    async def check(self) -> Ownership | None:
        """One check; the claims found (None: unreadable, the board is left as it was)."""
        try:
            try:
                devices = await self._source.read()
            except PodResourcesError as exc:
                self._note(str(exc))
                return None
            self._note(None)
            ownership = find_foreign_claims(
                self._gpus(), devices.allocatable, devices.assigned, own_resources=self._own()
            )
            self._board.set_foreign(ownership.reasons())
            return ownership
        finally:
            self.checks += 1
            self._wake()

    async def wait_checked(self, checks: int) -> int:
        """Return once more than ``checks`` checks have completed (for tests and tools)."""
        while self.checks <= checks:
            await self._checked.wait()
        return self.checks

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled (the first check is the caller's,
        before the plugin registers)."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()

    def _wake(self) -> None:
        checked, self._checked = self._checked, asyncio.Event()
        checked.set()

    def _note(self, problem: str | None) -> None:
        """Log when reading starts failing and when it works again, never per check:
        while it keeps failing only :attr:`problem` follows the latest reason (the
        failing call can differ from one check to the next)."""
        before, self.problem = self.problem, problem
        if (before is None) == (problem is None):
            return
        if problem is None:
            logger.info("PodResources readable again: checking GPU ownership")
        else:
            logger.error(
                "cannot check whether another device plugin hands out our GPUs "
                "(keeping the last known answer): %s",
                problem,
            )
