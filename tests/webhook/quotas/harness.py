"""Quota mirror instances against the fake API server, with what each did and when."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.kube_api import FakeKubeApi, RecordedRequest
from tests.webhook.quotas.builders import SETTINGS
from webhook.config import KubernetesConfig
from webhook.namespaces import new_api_client
from webhook.quotas.controller import QuotaMirror
from webhook.quotas.leader import LeaderElector, LeaseTiming

FAST = LeaseTiming(lease_duration_s=2, renew_deadline_s=1.2, retry_period_s=0.2)
"""A Lease of two seconds (the API stores whole seconds), renewed five times a second: short
for the tests, with room for a loaded machine to renew in time."""

LEASE = "metagpu-quota-mirror"
LEASE_NAMESPACE = "metagpu"


def write_kubeconfig(url: str, path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "fake", "user": {"token": "test-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )
    return path


@dataclass
class Leadership:
    """``(identity, leading, loop time)`` for every change, across instances."""

    changes: list[tuple[str, bool, float]] = field(default_factory=list)

    def record(self, identity: str) -> Callable[[bool], None]:
        def on_change(leading: bool) -> None:
            self.changes.append((identity, leading, asyncio.get_running_loop().time()))

        return on_change

    def leaders(self) -> set[str]:
        state: dict[str, bool] = {}
        for who, leading, _ in self.changes:
            state[who] = leading
        return {who for who, leading in state.items() if leading}

    def intervals(self, now: float) -> list[tuple[str, float, float]]:
        """``(identity, from, to)`` of every term; an open term ends ``now``."""
        open_: dict[str, float] = {}
        done: list[tuple[str, float, float]] = []
        for who, leading, at in self.changes:
            if leading:
                open_[who] = at
            else:
                done.append((who, open_.pop(who), at))
        return done + [(who, start, now) for who, start in open_.items()]


def quota_writes(api: FakeKubeApi) -> list[RecordedRequest]:
    return [r for r in api.writes() if r.resource == "resourcequotas"]


def assert_one_writer(api: FakeKubeApi, leadership: Leadership) -> None:
    """Terms never overlap, and no instance's quota write arrives during another's term."""
    now = asyncio.get_running_loop().time()
    terms = sorted(leadership.intervals(now), key=lambda t: t[1])
    for (a, _, a_end), (b, b_start, _) in itertools.pairwise(terms):
        assert a_end <= b_start, f"{a} still led when {b} started"
    for write in quota_writes(api):
        others = [t for t in terms if t[0] != write.user_agent and t[1] <= write.at <= t[2]]
        assert not others, f"{write.user_agent} wrote {write.path} during {others[0][0]}'s term"


@dataclass
class Instance:
    identity: str
    elector: LeaderElector
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def mirror_instance(
    kubeconfig: Path,
    identity: str,
    leadership: Leadership,
    *,
    timing: LeaseTiming = FAST,
    release_on_cancel: bool = True,
) -> AsyncIterator[Instance]:
    """One replica: its own client (``User-Agent`` = its identity), elector and mirror."""
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig), {})
    api.user_agent = identity
    elector = LeaderElector(
        api,
        name=LEASE,
        namespace=LEASE_NAMESPACE,
        identity=identity,
        timing=timing,
        work_name="quota mirror",
        release_on_cancel=release_on_cancel,
        on_change=leadership.record(identity),
    )
    mirror = QuotaMirror(api, settings=SETTINGS, watch_timeout_s=1)
    task = asyncio.create_task(elector.run(mirror.run), name=f"mirror-{identity}")
    instance = Instance(identity, elector, task)
    try:
        yield instance
    finally:
        await stop(instance)
        await api.close()


async def stop(instance: Instance) -> None:
    instance.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await instance.task
