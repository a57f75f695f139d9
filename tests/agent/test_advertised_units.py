"""``metagpu_gpu_units_advertised``: what the kubelet lists for our resource, per GPU.

The alert "plugin not registered while GPUs exist" (chart/rules) reads it: a
GPU metagpu serves whose units the kubelet does not list as allocatable. Real
PodResources gRPC (the harness answers ``GetAllocatableResources``), metrics
scraped over HTTP.
"""

from __future__ import annotations

from certs.kube import open_api_client
from plugin.agent.agent import AgentRuntime
from tests.agent.test_ownership_runtime import R, scrape, value
from tests.agent.test_runtime import U0, U1, Env, env  # noqa: F401 - env is a fixture
from tests.harness.podresources import running_pod_resources


async def test_units_the_kubelet_lists_per_gpu_and_zero_while_the_plugin_is_not_registered(
    env: Env,  # noqa: F811 - the fixture
) -> None:
    env.write_gpus([])
    async with running_pod_resources(env.kubelet_sock) as kubelet:
        # Only GPU 0's units are registered; another resource's devices do not count.
        kubelet.advertise(R, [f"{U0}::{n}" for n in range(100)])
        kubelet.advertise("nvidia.com/gpu.shared", [f"{U1}::{n}" for n in range(4)])
        async with AgentRuntime(env.config(), open_api=open_api_client) as rt:
            snapshot = (await rt.agent.next_cycle()).snapshot
            gpu0, gpu1 = snapshot.gpu(U0), snapshot.gpu(U1)
            assert gpu0 is not None
            assert gpu1 is not None
            assert (gpu0.units_advertised, gpu1.units_advertised) == (100, 0)
            samples = await scrape(rt.metrics_port)
            assert value(samples, "metagpu_gpu_units_advertised", gpu_uuid=U0) == [100]
            assert value(samples, "metagpu_gpu_units_advertised", gpu_uuid=U1) == [0]
            assert value(samples, "metagpu_gpu_units_total", gpu_uuid=U1) == [100]


async def test_no_registration_at_all_reads_zero_on_every_gpu(
    env: Env,  # noqa: F811 - the fixture
) -> None:
    env.write_gpus([])
    async with (
        running_pod_resources(env.kubelet_sock),
        AgentRuntime(env.config(), open_api=open_api_client) as rt,
    ):
        await rt.agent.next_cycle()
        samples = await scrape(rt.metrics_port)
        assert value(samples, "metagpu_gpu_units_advertised", gpu_uuid=U0) == [0]
        assert value(samples, "metagpu_gpu_units_advertised", gpu_uuid=U1) == [0]
