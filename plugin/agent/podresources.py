"""Adapter: which container holds which meta-devices, from the kubelet PodResources API v1.

The kubelet's answer comes from its device-manager checkpoint, so it is right
after a restart of the agent, the device plugin or the kubelet itself; the
agent keeps nothing of its own and asks again every cycle (a ``List`` is
answered from memory in milliseconds). The original MetaGPU instead listed
every pod in the cluster and exec'd ``printenv`` into each GPU container.

On a DRA node the same answer names each container's claim devices
(``dynamic_resources``); those of the agent's driver are turned into shares by
:class:`~plugin.agent.dra_shares.DraShareReader` from the DRA plugin's CDI specs, in a
worker thread (file reads), and join the allocations as any other.

The connection, timeouts and errors are the shared client's
(:class:`plugin.kubelet.podresources.PodResourcesClient`); this module turns
its answers into the agent's :class:`~plugin.agent.accounting.Allocation` and
:class:`~plugin.placement.ownership.ResourceDevices` values. Every failure is a
:class:`plugin.kubelet.podresources.PodResourcesError`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from plugin._pb import podresources_v1_pb2 as pb
from plugin.agent.accounting import Allocation
from plugin.agent.containers import ContainerKey
from plugin.agent.dra_shares import ClaimDevice, DraShareReader
from plugin.kubelet.podresources import PodResourcesClient
from plugin.placement.ownership import ResourceDevices


class PodResourcesReader:
    """The agent's two readings of the kubelet: allocations and allocatable devices."""

    def __init__(
        self, socket_path: Path, *, timeout_s: float, dra: DraShareReader | None = None
    ) -> None:
        """``dra``: how claim devices of the DRA driver become shares (None: they are
        ignored, as before the agent knew DRA)."""
        self._client = PodResourcesClient(
            socket_path, timeout_s=timeout_s, mount_into="the agent container"
        )
        self._dra = dra

    async def list_allocations(self) -> tuple[Allocation, ...]:
        """Every container's devices, all resources (the caller filters by name), and
        its DRA shares (resource: the driver's name)."""
        response = await self._client.list()
        allocations = allocations_from_response(response)
        if self._dra is None:
            return allocations
        claims = claim_devices_from_response(response, driver=self._dra.driver)
        if not claims:  # a device-plugin node never reads the CDI directory
            return allocations
        return allocations + await asyncio.to_thread(self._dra.resolve, claims)

    async def list_allocatable(self) -> tuple[ResourceDevices, ...]:
        """Every device the kubelet knows, of every resource (``GetAllocatableResources``):
        how the agent sees GPUs another device plugin also advertises."""
        return allocatable_from_response(await self._client.get_allocatable_resources())

    async def close(self) -> None:
        """Close the channel; the next call opens a new one."""
        await self._client.close()


def allocations_from_response(response: pb.ListPodResourcesResponse) -> tuple[Allocation, ...]:
    """The protobuf answer as plain values: one per (container, resource) with devices.

    The kubelet sends one ``ContainerDevices`` per device (per NUMA node), so
    the entries of one container and resource are joined here, each ID once."""
    merged: dict[tuple[ContainerKey, str], dict[str, None]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            key = ContainerKey(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if devices.device_ids:
                    ids = merged.setdefault((key, devices.resource_name), {})
                    ids.update(dict.fromkeys(devices.device_ids))
    return tuple(
        Allocation(key=key, resource=resource, device_ids=tuple(ids))
        for (key, resource), ids in merged.items()
    )


def claim_devices_from_response(
    response: pb.ListPodResourcesResponse, *, driver: str
) -> tuple[ClaimDevice, ...]:
    """Every container's claim devices of ``driver`` (``dynamic_resources``), as sent.

    ``cdi_devices`` are kept as the kubelet lists them (with its repeats, which
    :func:`plugin.agent.dra_shares.allocations_of_claims` removes)."""
    found: list[ClaimDevice] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            key = ContainerKey(pod.namespace, pod.name, container.name)
            for claim in container.dynamic_resources:
                name = f"{claim.claim_namespace}/{claim.claim_name}"
                for resource in claim.claim_resources:
                    if resource.driver_name != driver:
                        continue
                    found.append(
                        ClaimDevice(
                            key=key,
                            claim=name,
                            driver=resource.driver_name,
                            pool=resource.pool_name,
                            device=resource.device_name,
                            cdi_ids=tuple(d.name for d in resource.cdi_devices),
                        )
                    )
    return tuple(found)


def allocatable_from_response(
    response: pb.AllocatableResourcesResponse,
) -> tuple[ResourceDevices, ...]:
    """``GetAllocatableResources`` as plain values: every resource's devices, each ID once."""
    merged: dict[str, dict[str, None]] = {}
    for devices in response.devices:
        merged.setdefault(devices.resource_name, {}).update(dict.fromkeys(devices.device_ids))
    return tuple(ResourceDevices(name, tuple(ids)) for name, ids in merged.items())
