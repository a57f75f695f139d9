"""A real Prometheus on loopback scrapes the agent, the webhook and the extender.

The agent runs on three simulated GPUs as ``metagpu agent`` does (PodResources
over gRPC, pods from the fake API server, processes placed in containers):
four pods hold 25 units each of GPU 0, one of them over its memory share; a
pod holds 50 units of GPU 1, which another device plugin also hands to a pod
of its own; GPU 2 cannot be read (unhealthy). The webhook serves TLS and has
answered a review; the extender has answered a filter. Prometheus (Debian's
``prometheus``, on a temp dir) scrapes the three every second and loads the
alert and usage rules.

Then every query of both dashboards must return series, and the GPU-hours of
the four quarter shares over a window must equal those of one whole GPU over
the same window.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import yaml

from certs.files import generate_bundle
from certs.kube import open_api_client
from plugin.agent import pods as pods_module
from plugin.agent.agent import AgentRuntime
from plugin.api.config import PluginConfig
from tests.agent.builders import A100, gpu_uuid, place_in_container, pod, ref
from tests.extender.test_cluster import cluster, running
from tests.harness.kube_api import FakeKubeApi
from tests.harness.podresources import running_pod_resources
from tests.monitoring.catalog import (
    PROMETHEUS_MISSING,
    REPO_ROOT,
    RULES_FILE,
    USAGE_RULES_FILE,
    prometheus,
)
from tests.monitoring.test_dashboards import FILES, expressions
from tests.webhook.waiting import eventually
from webhook.config import WebhookConfig
from webhook.server import running_webhook

R: Final = "cnvrg.io/metagpu"
OTHER: Final = "nvidia.com/gpu"
U0, U1, U2 = gpu_uuid(0), gpu_uuid(1), gpu_uuid(2)
QUARTERS: Final = ("a", "b", "c", "d")
VARIABLES: Final = {"$__rate_interval": "1m", "$node": "node-a", "$gpu": ".*"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def prometheus_server(config: dict[str, Any], work: Path) -> Iterator[str]:
    binary = prometheus()
    if binary is None:
        pytest.skip(PROMETHEUS_MISSING)
    work.mkdir(parents=True, exist_ok=True)
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Api:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def get(self, path: str, **params: str) -> Any:
        async with self.session.get(f"{self.url}{path}", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/query", query=expr)
        return data["result"]  # type: ignore[no-any-return]

    async def ready(self) -> bool:
        try:
            async with self.session.get(f"{self.url}/-/ready") as resp:
                return resp.status == 200
        except aiohttp.ClientConnectionError:
            return False


def gpus_file(path: Path, pids: dict[str, int]) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "live_pids_only": True,
                "gpus": [
                    {
                        "uuid": U0,
                        "name": A100,
                        "memory_mib": 81920,
                        "utilization_percent": 70,
                        "processes": [
                            {"pid": pids["a"], "used_memory_mib": 30000, "utilization_percent": 40},
                            {"pid": pids["b"], "used_memory_mib": 1000, "utilization_percent": 30},
                        ],
                    },
                    {
                        "uuid": U1,
                        "name": A100,
                        "memory_mib": 81920,
                        "processes": [
                            {"pid": pids["x"], "used_memory_mib": 2000, "utilization_percent": 10}
                        ],
                    },
                    {"uuid": U2, "name": A100, "memory_mib": 81920, "fail": "usage"},
                ],
            }
        )
    )


@contextlib.asynccontextmanager
async def sleepers(names: tuple[str, ...]) -> AsyncIterator[dict[str, int]]:
    """One idle process per name, to stand for a container's GPU process."""
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(300)")
        for _ in names
    ]
    try:
        yield {name: proc.pid for name, proc in zip(names, procs, strict=True)}
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def test_every_dashboard_query_returns_series_and_quarter_shares_add_up(
    short_tmp_path: Path,
    tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    kube_config_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if prometheus() is None:
        pytest.skip(PROMETHEUS_MISSING)
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    cluster(fake)  # node-a and node-b with GPU ledgers, a pending pod: the extender's view
    for name in (*QUARTERS, "x"):
        fake.put(pod(name, namespace="team" if name == "x" else "ml"))
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    bundle = generate_bundle(
        tmp_path / "tls", now=dt.datetime.now(dt.UTC), ip_addresses=["127.0.0.1"]
    )
    webhook_config = WebhookConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "tls": {"cert_file": str(bundle.cert_file), "key_file": str(bundle.key_file)},
            "kubernetes": {"enabled": False},
            "shutdown_timeout_s": 2,
        }
    )
    agent_config = PluginConfig.model_validate(
        {
            "gpus_file": str(tmp_path / "gpus.yaml"),
            "agent": {
                "node_name": "node-a",
                "socket_dir": str(short_tmp_path / "run"),
                "pod_resources_socket": str(short_tmp_path / "kubelet.sock"),
                "metrics_listen": "127.0.0.1:0",
                "proc_root": str(proc_root),
                "interval_s": 0.2,
                "memory_enforcement": "report",
            },
        }
    )
    async with (
        sleepers(("a", "b", "x")) as pids,
        running_pod_resources(short_tmp_path / "kubelet.sock") as kubelet,
    ):
        place_in_container(proc_root, pids["a"], ref("a"))
        place_in_container(proc_root, pids["b"], ref("b"))
        place_in_container(proc_root, pids["x"], ref("x", namespace="team"))
        gpus_file(tmp_path / "gpus.yaml", pids)
        kubelet.advertise(R, [f"{u}::{n}" for u in (U0, U1, U2) for n in range(100)])
        kubelet.advertise(OTHER, [U1])
        for i, name in enumerate(QUARTERS):
            units = [f"{U0}::{n}" for n in range(25 * i, 25 * (i + 1))]
            kubelet.assign("ml", name, "main", R, units)
        kubelet.assign("team", "x", "main", R, [f"{U1}::{n}" for n in range(50)])
        kubelet.assign("other", "y", "cuda", OTHER, [U1])

        async with (
            AgentRuntime(agent_config, open_api=open_api_client) as agent,
            running_webhook(webhook_config) as webhook,
            running(kube_config_env) as extender,
            aiohttp.ClientSession() as session,
        ):
            # One answer each, so latency histograms and request counters have data.
            review = json.loads(
                (REPO_ROOT / "tests/fixtures/admission/pod-0.333-gpu.json").read_text()
            )
            ssl_context = ssl.create_default_context(cafile=str(bundle.ca_file))
            async with session.post(webhook.mutate_url, json=review, ssl=ssl_context) as resp:
                assert resp.status == 200
            filter_request = json.loads(
                (
                    REPO_ROOT / "tests/fixtures/scheduler-extender/filter-30-units-two-nodes.json"
                ).read_text()
            )
            status, _ = await extender.post("filter", filter_request)
            assert status == 200

            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES_FILE), str(USAGE_RULES_FILE)],
                "scrape_configs": [
                    {
                        "job_name": "metagpu-agent-metrics",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{agent.metrics_port}"],
                                "labels": {"node": "node-a"},
                            }
                        ],
                    },
                    {
                        "job_name": "metagpu-webhook",
                        "scheme": "https",
                        "tls_config": {"ca_file": str(bundle.ca_file)},
                        "static_configs": [{"targets": [f"127.0.0.1:{webhook.port}"]}],
                    },
                    {
                        "job_name": "metagpu-scheduler",
                        "static_configs": [
                            {"targets": [extender.url.removeprefix("http://").rstrip("/")]}
                        ],
                    },
                ],
            }
            with prometheus_server(config, tmp_path / "prometheus") as url:
                api = Api(session, url)
                await eventually(api.ready, timeout_s=30)

                async def scraped_twice() -> bool:
                    # Every target up, and two scrapes of each: rate() has data.
                    ups = await api.query("count_over_time(up[1m]) >= 3 and up == 1")
                    return len(ups) == 3

                await eventually(scraped_twice, timeout_s=30)

                async def conflict_seen() -> bool:
                    return bool(await api.query("metagpu_share_conflict"))

                await eventually(conflict_seen, timeout_s=30)

                empty = []
                for path in FILES:
                    for where, template in expressions(json.loads(path.read_text())):
                        expr = template
                        for variable, value in VARIABLES.items():
                            expr = expr.replace(variable, value)
                        if not await api.query(expr):
                            empty.append(f"{path.name} {where}: {expr}")
                assert empty == [], "\n".join(empty)

                # GPU-hours over the same 10 s window at 1 s steps: four quarter shares of
                # GPU 0 hold exactly as much as GPU 0 itself.
                shares = await api.query(
                    f'sum(sum_over_time((metagpu_container_units{{gpu_uuid="{U0}"}}'
                    " / on (instance, gpu_uuid) group_left () "
                    f'(metagpu_gpu_units_total{{gpu_uuid="{U0}"}} > 0))[10s:1s])) / 3600'
                )
                whole = await api.query(
                    f'sum_over_time((metagpu_gpu_units_total{{gpu_uuid="{U0}"}} > bool 0)'
                    "[10s:1s]) / 3600"
                )
                (share_hours,) = [float(s["value"][1]) for s in shares]
                (gpu_hours,) = [float(s["value"][1]) for s in whole]
                assert gpu_hours > 0
                assert share_hours == pytest.approx(gpu_hours, rel=1e-12)

                # The rules load in the real server too (no evaluation errors).
                groups = (await api.get("/api/v1/rules"))["groups"]
                assert {g["name"] for g in groups} >= {"metagpu-gpus", "metagpu-usage"}
                broken = [r["name"] for g in groups for r in g["rules"] if r["health"] == "err"]
                assert broken == []
