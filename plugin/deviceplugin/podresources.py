"""Adapter: what every device plugin on the node advertises and has handed out (PodResources v1).

The device plugin's reading of the kubelet's ``v1.PodResourcesLister``
(``/var/lib/kubelet/pod-resources/kubelet.sock``, through the shared client
:class:`plugin.kubelet.podresources.PodResourcesClient`):
``GetAllocatableResources`` for every resource's devices and ``List`` for
every container's. It answers in the upstream-shaped values of
:mod:`plugin.placement.ownership`, so the ownership check never sees protobuf.
The node agent reads the same API in its own terms
(:mod:`plugin.agent.podresources`); the two components never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from plugin._pb import podresources_v1_pb2 as pb
from plugin.kubelet.podresources import PodResourcesClient
from plugin.placement.ownership import AssignedDevices, ResourceDevices


@dataclass(frozen=True)
class NodeDevices:
    """One reading: every resource's devices, and every container's."""

    allocatable: tuple[ResourceDevices, ...]
    assigned: tuple[AssignedDevices, ...]


class PodResourcesReader:
    """Reads :class:`NodeDevices` from the kubelet; one instance per plugin process.

    Raises :class:`plugin.kubelet.podresources.PodResourcesError` for every failure.
    """

    def __init__(self, socket_path: Path, *, timeout_s: float) -> None:
        self._client = PodResourcesClient(
            socket_path, timeout_s=timeout_s, mount_into="the device plugin container"
        )

    async def read(self) -> NodeDevices:
        """Both calls, allocatable first (a device assigned in between is then in both)."""
        allocatable = await self._client.get_allocatable_resources()
        listed = await self._client.list()
        return node_devices_from_responses(allocatable, listed)

    async def close(self) -> None:
        """Close the channel; the next read opens a new one."""
        await self._client.close()


def node_devices_from_responses(
    allocatable: pb.AllocatableResourcesResponse, listed: pb.ListPodResourcesResponse
) -> NodeDevices:
    """The two protobuf answers as plain values, entry for entry (the core joins them)."""
    return NodeDevices(
        allocatable=tuple(
            ResourceDevices(d.resource_name, tuple(d.device_ids)) for d in allocatable.devices
        ),
        assigned=tuple(
            AssignedDevices(pod.namespace, pod.name, c.name, d.resource_name, tuple(d.device_ids))
            for pod in listed.pod_resources
            for c in pod.containers
            for d in c.devices
        ),
    )
