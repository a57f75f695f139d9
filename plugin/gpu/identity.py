"""GPU identity remembered across rediscoveries (pure).

A GPU that falls off the bus answers nothing, not even its UUID: NVML's
``nvmlDeviceGetHandleByIndex`` fails with ``GPU is lost`` and discovery can
only say "something at index 1". Advertising that under a made-up name
(``GPU-unknown-index-1``) makes the kubelet see a hundred devices vanish and a
hundred new ones appear, and Allocate hand a container a GPU that does not
exist. :class:`GpuIdentityBook` remembers what every earlier discovery since
the process started saw (UUID, PCI bus ID, minor number, ...) and puts it back:

* a GPU discovery cannot identify, at an index where a GPU was seen before
  whose UUID is not found elsewhere now, is that GPU: it keeps its UUID,
  device IDs and size, and stays Unhealthy with the driver's reason;
* a GPU seen before that the driver no longer lists at all is kept too,
  Unhealthy ("no longer listed by the driver"), so its shares stay visible,
  unless the driver renumbered another GPU into its index;
* a GPU never seen with its identity since start is left out
  (:attr:`Reconciled.unidentified`): there is no honest name to advertise.

The device plugin keeps one book for its lifetime (kubelet restarts and
SIGHUP keep it); the node agent keeps its own, seeded from the plugin's
board file, so both name a lost GPU alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from plugin.api.gpus import GpuInfo

GONE_REASON = (
    "no longer listed by the driver (fallen off the bus?): reset the GPU "
    "(nvidia-smi -r) or reboot the node"
)


@dataclass(frozen=True)
class Reconciled:
    """One discovery with remembered identities put back."""

    gpus: tuple[GpuInfo, ...]
    """Every GPU to serve, each under its real identity, in index order."""
    unidentified: tuple[GpuInfo, ...] = ()
    """GPUs whose identity discovery could not read and no earlier discovery
    knew: not served at all (their ``uuid`` is a placeholder)."""


@dataclass
class GpuIdentityBook:
    """What earlier discoveries saw, by UUID. Not thread-safe: one owner."""

    _known: dict[str, GpuInfo] = field(default_factory=dict)

    def learn(self, infos: Iterable[GpuInfo]) -> None:
        """Remember fully described GPUs (another component's discovery, e.g. the
        plugin's board file for the agent)."""
        for info in infos:
            if info.identity_known and info.unhealthy_reason is None:
                self._known[info.uuid] = dataclasses.replace(info, unhealthy_reason=None)

    def known(self) -> dict[str, GpuInfo]:
        return dict(self._known)

    def reconcile(self, infos: Sequence[GpuInfo]) -> Reconciled:
        """``infos`` (one discovery, any order) with identities put back; learns
        the GPUs it describes fully."""
        self.learn(infos)
        found = {g.uuid for g in infos if g.identity_known}
        by_index = {g.index: g for g in self._known.values() if g.uuid not in found}
        served: list[GpuInfo] = []
        unidentified: list[GpuInfo] = []
        for info in infos:
            if info.identity_known:
                served.append(self._fill(info))
                continue
            earlier = by_index.pop(info.index, None)
            if earlier is None:
                unidentified.append(info)
                continue
            found.add(earlier.uuid)
            served.append(dataclasses.replace(earlier, unhealthy_reason=info.unhealthy_reason))
        taken = {g.index for g in served} | {g.index for g in unidentified}
        for earlier in self._known.values():
            # One whose index another GPU holds now was renumbered away by the
            # driver; its index-based device IDs would clash, so it is not kept.
            if earlier.uuid not in found and earlier.index not in taken:
                served.append(dataclasses.replace(earlier, unhealthy_reason=GONE_REASON))
        served.sort(key=lambda g: (g.index, g.uuid))
        return Reconciled(gpus=tuple(served), unidentified=tuple(unidentified))

    def _fill(self, info: GpuInfo) -> GpuInfo:
        """A GPU whose UUID was read but whose description failed part-way keeps
        what an earlier discovery knew of it (name, memory, bus ID, minor)."""
        earlier = self._known.get(info.uuid)
        if info.unhealthy_reason is None or earlier is None:
            return info
        return dataclasses.replace(
            earlier, index=info.index, unhealthy_reason=info.unhealthy_reason
        )
