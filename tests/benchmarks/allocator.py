"""Benchmark: GetPreferredAllocation and Allocate latency, ListAndWatch message size.

Usage: ``python tests/benchmarks/allocator.py [--quick]``

For a node of 8 GPUs × 100 units and one of 16 GPUs × 1000 units, half
occupied in a fragmented pattern, it measures p50/p99 of

* the pure policy (:func:`plugin.placement.allocation.preferred_allocation`) and the pure
  Allocate path (ID validation + :func:`plugin.deviceplugin.container_spec.build_container_spec`);
* the same two calls through the real gRPC server over a unix socket, with
  the kubelet's messages (``metagpu.kubelet_sim.PluginClient``): both the
  round trip the client sees and the time the handler spends inside the
  server process (the plugin's own latency, without the transport);
* a baseline measured in the same run: an empty RPC (``PreStartContainer``) on
  the same channel, i.e. what gRPC itself costs here;

and the serialized size of the complete ListAndWatch message. Targets (issue
4): p99 < 1 ms for 8×100 and < 10 ms for 16×1000. Each is judged twice, for
the plugin (in server) and for the round trip, on the median of the p99s of
consecutive blocks of the run (:func:`tests.benchmarks._stats.block_p99`);
the pooled p99 is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from metagpu.kubelet_sim import PluginClient
from plugin._pb import deviceplugin_v1beta1_pb2 as pb
from plugin._pb import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from plugin.api.config import PluginConfig
from plugin.api.resources import DEFAULT_RESOURCE_NAME, ResourceName
from plugin.deviceplugin.container_spec import build_container_spec
from plugin.deviceplugin.server import PluginServer
from plugin.deviceplugin.servicer import DevicePluginServicer
from plugin.gpu.backend import GpuInfo
from plugin.gpu.health_monitor import HealthBoard
from plugin.placement.allocation import preferred_allocation
from plugin.placement.devices import DeviceTable
from tests.benchmarks._stats import block_p99, percentile, timed_ms

TARGETS_MS = {(8, 100): 1.0, (16, 1000): 10.0}


def node(gpu_count: int, units: int, *, seed: int = 4) -> tuple[DeviceTable, list[str]]:
    """A node where each GPU is 0-100% occupied (seeded), about half overall."""
    infos = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{i:08x}-1b2f-4c8e-9a61-0f2d3c4b5a01",
            name="NVIDIA A100-SXM4-80GB",
            memory_mib=81920,
            minor_number=i,
            pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
            numa_node=i * 2 // gpu_count,
        )
        for i in range(gpu_count)
    ]
    table = DeviceTable(
        ResourceName(DEFAULT_RESOURCE_NAME), infos, units_per_gpu=units, id_strategy="uuid"
    )
    rnd = random.Random(seed)
    occupancy = [rnd.choice([0.0, 0.0, 0.3, 0.5, 0.8, 1.0]) for _ in range(gpu_count)]
    available: list[str] = [
        d.id
        for d in table.devices
        if rnd.random() >= occupancy[d.gpu.position]  # fragmented, not contiguous
    ]
    rnd.shuffle(available)  # the kubelet's order is arbitrary
    return table, available


async def interleaved(
    calls: list[Callable[[], Awaitable[object]]], rounds: int
) -> list[list[float]]:
    """Milliseconds per call, one of each call per round."""
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for fn, out in zip(calls, samples, strict=True):
            start = time.perf_counter()
            await fn()
            out.append((time.perf_counter() - start) * 1000)
    return samples


def row(label: str, samples: list[float], blocks: int) -> str:
    """p50 and pooled p99 of every sample; with several blocks, also the p99 a target
    is judged on: the median of the blocks' p99s, with their range."""
    line = (
        f"  {label:<34} p50 {statistics.median(samples):7.3f} ms  "
        f"p99 {percentile(samples, 99):7.3f} ms"
    )
    if blocks > 1:
        tail, low, high = block_p99(samples, blocks)
        line += f"  block p99 {tail:7.3f} ms [{low:.3f}-{high:.3f}]"
    return line + f"  (n={len(samples)})"


def serve(gpu_count: int, units: int, socket_path: str, results: Connection) -> None:
    """The plugin side, in its own process as on a node (the kubelet is another process).

    Each handler is timed inside this process (what the plugin itself spends
    answering, after gRPC has delivered the request and before it sends the
    answer); the samples go back to the coordinator through ``results``.
    """

    async def run() -> None:
        table, _ = node(gpu_count, units)
        stop = asyncio.Event()
        servicer = DevicePluginServicer(
            table=table, config=PluginConfig(units_per_gpu=units), board=HealthBoard(), stop=stop
        )
        handler_ms: dict[str, list[float]] = {}
        for name in ("GetPreferredAllocation", "Allocate"):
            setattr(
                servicer, name, _timed(getattr(servicer, name), handler_ms.setdefault(name, []))
            )
        server = PluginServer(
            servicer, resource=table.resource, socket_path=Path(socket_path), stop=stop
        )
        await server.start()
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, done.set_result, None)
        await done
        await server.stop(grace_s=0)
        results.send(handler_ms)
        results.close()

    asyncio.run(run())


def _timed(
    method: Callable[[Any, Any], Awaitable[Any]], out: list[float]
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def timed(request: Any, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return await method(request, context)
        finally:
            out.append((time.perf_counter() - start) * 1000)

    return timed


async def scenario(
    gpu_count: int, units: int, rounds: int, blocks: int, socket_dir: Path
) -> tuple[bool, bool]:
    """Print one node's figures; whether the plugin's and the round trip's p99 meet the target."""
    config = PluginConfig(units_per_gpu=units)
    table, available = node(gpu_count, units)
    size = units + units // 2  # 1.5 GPUs: one whole GPU plus a fraction
    placement = preferred_allocation(available, [], size, table=table, policy="binpack")
    chosen = list(placement.ids)
    servicer = DevicePluginServicer(
        table=table, config=config, board=HealthBoard(), stop=asyncio.Event()
    )
    listing = servicer.listing(())

    print(
        f"\n{gpu_count} GPUs × {units} units: {len(table)} meta-devices, {len(available)} "
        f"available, request {size}"
    )
    print(f"  ListAndWatch message: {listing.ByteSize():,} bytes ({len(listing.devices)} devices)")

    # The pure figures get the IDs as the servicer does: fresh strings from a
    # parsed message (the benchmark's own strings would hit dict lookups'
    # identity fast path and flatter the result).
    pref_request = pb.PreferredAllocationRequest()
    pref_request.container_requests.add(available_deviceIDs=available, allocation_size=size)
    alloc_request = pb.AllocateRequest()
    alloc_request.container_requests.add(devices_ids=chosen)
    parsed_pref = pb.PreferredAllocationRequest.FromString(pref_request.SerializeToString())
    parsed_alloc = pb.AllocateRequest.FromString(alloc_request.SerializeToString())
    wire_available = parsed_pref.container_requests[0].available_deviceIDs
    wire_chosen = parsed_alloc.container_requests[0].devices_ids
    pure_pref = timed_ms(
        lambda: preferred_allocation(wire_available, [], size, table=table, policy="binpack"),
        rounds,
    )
    pure_alloc = timed_ms(
        lambda: build_container_spec(table.lookup_all(wire_chosen), config=config), rounds
    )

    socket_path = socket_dir / f"bench-{gpu_count}.sock"
    receive, send = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.get_context("spawn").Process(
        target=serve, args=(gpu_count, units, str(socket_path), send), daemon=True
    )
    process.start()
    client = PluginClient(socket_path)
    # Requests are built once (above), as the kubelet (Go) builds them cheaply:
    # the figures are the plugin's cost plus the transport, not Python's
    # client-side encoding. The second baseline carries the same IDs as
    # GetPreferredAllocation to a handler that ignores them: transport and
    # decoding, no policy.
    payload_request = pb.PreStartContainerRequest(devices_ids=available)
    stub = pb_grpc.DevicePluginStub(client.channel)
    try:
        await client.connect(timeout_s=30)
        for _ in range(max(5, rounds // 10)):  # warm up the channel and caches
            await client.pre_start([])
            await stub.GetPreferredAllocation(pref_request)
            await stub.Allocate(alloc_request)
        # Interleaved, so a noisy neighbour hits the baselines and the calls alike.
        baseline, payload, rpc_pref, rpc_alloc = await interleaved(
            [
                lambda: client.pre_start([]),
                lambda: stub.PreStartContainer(payload_request),
                lambda: stub.GetPreferredAllocation(pref_request),
                lambda: stub.Allocate(alloc_request),
            ],
            rounds,
        )
    finally:
        await client.close()
        process.terminate()
        handler_ms: dict[str, list[float]] = receive.recv() if receive.poll(30) else {}
        process.join(10)
    # The warm-up calls are the first samples; drop them as the client does.
    warm = max(5, rounds // 10)
    server_pref = handler_ms.get("GetPreferredAllocation", [])[warm:]
    server_alloc = handler_ms.get("Allocate", [])[warm:]

    for label, samples in (
        ("baseline: empty RPC (PreStart)", baseline),
        (f"baseline: PreStart with {len(available)} IDs", payload),
        ("GetPreferredAllocation, pure", pure_pref),
        ("GetPreferredAllocation, in server", server_pref),
        ("GetPreferredAllocation, gRPC", rpc_pref),
        ("Allocate, pure", pure_alloc),
        ("Allocate, in server", server_alloc),
        ("Allocate, gRPC", rpc_alloc),
    ):
        print(row(label, samples, blocks))
    target = TARGETS_MS[(gpu_count, units)]

    def tail(samples: list[float]) -> float:
        return block_p99(samples, blocks)[0]

    in_server = max(tail(server_pref), tail(server_alloc))
    worst = max(tail(rpc_pref), tail(rpc_alloc))
    for label, value in (("plugin (in server)", in_server), ("round trip (gRPC)", worst)):
        verdict = "PASS" if value < target else "MISS"
        print(f"  target p99 < {target} ms, {label:<19} {verdict} (worst block p99 {value:.3f} ms)")
    print(
        f"  (the empty RPC's own block p99 is {tail(baseline):.3f} ms here: the transport's "
        "share of every round trip, which the plugin cannot remove)"
    )
    return in_server < target, worst < target


async def main(quick: bool) -> int:
    rounds, blocks = (100, 1) if quick else (2000, 5)
    print(
        f"allocator benchmark ({'quick' if quick else 'full'}: {rounds} rounds per figure; "
        f"p99s judged as the median of {blocks} consecutive blocks' p99)"
    )
    with tempfile.TemporaryDirectory(prefix="mg-bench-", dir="/tmp") as tmp:
        results = [
            await scenario(gpus, units, rounds, blocks, Path(tmp)) for gpus, units in TARGETS_MS
        ]
    # Figures, not a test: a missed target is reported, and the exit code stays 0
    # so a noisy machine does not fail CI's smoke run.
    for label, met in (
        ("plugin (in server)", all(r[0] for r in results)),
        ("round trip (gRPC)", all(r[1] for r in results)),
    ):
        print(
            f"\n{label}: {'all targets met' if met else 'some targets missed (see MISS above)'}",
            end="",
        )
    print()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds; finishes in seconds")
    raise SystemExit(asyncio.run(main(parser.parse_args().quick)))
