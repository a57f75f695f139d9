"""The ``metagpu dev --dra`` session: the DRA kubelet plugin and a simulated kubelet.

The plugin is the real :class:`plugin.dra.runtime.DraPlugin` on the simulated GPUs of
``make run``, serving ``v1.DRAPlugin`` and the registration service on real unix
sockets; :class:`metagpu.dra_kubelet_sim.DraKubelet` registers it the way a kubelet
v1.36.2 did (``GetInfo``, ``NotifyRegistrationStatus``, the health stream) and sends
``NodePrepareResources``/``NodeUnprepareResources`` over the real protos. The DRA
plugin's tests replay the captured kubelet calls through the same simulated kubelet.

No API server runs here (``make run`` has none for anything): the claims live in
memory behind the one method the plugin reads them through, and the slice shown is
the one the plugin would publish (:mod:`metagpu.dev_dra`). Allocation is the
scheduler's rule, played by :func:`metagpu.dev_dra.allocate_claim`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from metagpu.dev_dra import (
    DRA_PROMPT_HELP,
    SCHEDULER_MESSAGE,
    AllocateClaim,
    Allocated,
    CreateClaim,
    DeleteClaim,
    DevClaims,
    DraCommand,
    PrepareClaim,
    ShowClaims,
    ShowSlice,
    UnprepareClaim,
    allocate_claim,
    asked_of,
    consumed_of,
    parse_dra_prompt,
)
from metagpu.dev_prompt import PromptError, Quit, ShowHelp
from metagpu.dev_session import (
    DevOptions,
    prepare_gpus_file,
    prompt_loop,
    read_stdin_in_background,
    say,
    shown,
)
from metagpu.dra_kubelet_sim import DraKubelet, DraKubeletSimError, HealthStream
from plugin.api.dra_waiting import free_per_device
from plugin.api.quantity import MIB, format_mib
from plugin.api.settings import ConfigError, load_config
from plugin.dra.cdi import spec_file_prefix
from plugin.dra.config import ENV_PREFIX, DraConfig
from plugin.dra.runtime import DraPlugin
from plugin.gpu.simulated import load_gpus_file
from plugin.kube.errors import ApiOpener
from webhook.config import DraConfig as WebhookDraConfig
from webhook.dra import Shape, claim_template, memory_for_units
from webhook.model import DraSettings

READY_LINE: Final = "metagpu dev --dra is running"
"""First line of the banner; tests wait for it."""
NODE_NAME: Final = "dev-node"
"""The simulated node: the slice's ``nodeName`` and pool."""
START_TIMEOUT_S: Final = 30.0
"""Generous: a cold start on a loaded 2-core machine imports grpc."""
STOP_TIMEOUT_S: Final = 20.0

logger = logging.getLogger(__name__)


@dataclass
class _DraSession:
    config: DraConfig
    plugin: DraPlugin
    kubelet: DraKubelet
    claims: DevClaims
    settings: DraSettings
    """How the webhook's DRA mode sizes a claim's memory, for ``claim``."""


def run_dra_dev(options: DevOptions) -> int:
    """Run the DRA session until stopped; returns the exit code (0 on a normal stop)."""
    return asyncio.run(_main(options))


def _no_api_server() -> Any:
    raise ConfigError("metagpu dev --dra has no API server: the claims are in memory")


async def _main(options: DevOptions) -> int:
    run_dir = options.run_dir.absolute()
    gpus_file = prepare_gpus_file(options.gpus_file, run_dir)
    config = load_config(
        DraConfig,
        env=os.environ,
        env_prefix=ENV_PREFIX,
        flags={
            "node_name": NODE_NAME,
            "plugins_dir": run_dir / "plugins",
            "registry_dir": run_dir / "plugins_registry",
            "cdi_dir": run_dir / "cdi",
            "gpus_file": gpus_file,
            "runtime_check": "off",  # no Node to read
        },
    )
    config.cdi_dir.mkdir(parents=True, exist_ok=True)
    claims = DevClaims()
    no_api: ApiOpener = _no_api_server
    plugin = DraPlugin(config, open_api=no_api, claims=claims.read)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    read_stdin_in_background(loop, lines)
    plugin_stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(plugin_stop), name="dra-plugin")
    try:
        await _wait_started(plugin, task=task, stop=stop)
        if stop.is_set():
            return 0
        async with _registered(config) as (kubelet, info, health):
            session = _DraSession(config, plugin, kubelet, claims, _settings(config, gpus_file))
            first = await health.next()
            _banner(session, info, first, gpus_file)
            say(DRA_PROMPT_HELP)
            await prompt_loop(
                lines,
                stop=stop,
                task=task,
                prompt="metagpu dra> ",
                what="the DRA plugin",
                handle=lambda line: _handle_line(session, line),
            )
    finally:
        plugin_stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
        if not task.done():
            task.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    say("metagpu dev --dra stopped")
    return 0


def _settings(config: DraConfig, gpus_file: Path) -> DraSettings:
    """The webhook's DRA settings for this node: its smallest GPU and the plugin's policy."""
    gpus = load_gpus_file(gpus_file).gpus
    webhook = WebhookDraConfig(
        device_class_name=config.driver_name,
        gpu_memory_mib=min((g.memory_mib for g in gpus), default=config.memory.default_mib),
        memory_step_mib=config.memory.step_mib,
        memory_min_mib=config.memory.min_mib,
    )
    return DraSettings.of(webhook)


async def _wait_started(plugin: DraPlugin, *, task: asyncio.Task[int], stop: asyncio.Event) -> None:
    """Wait for both sockets, or fail fast if the plugin died, or return on stop."""
    started = asyncio.create_task(plugin.started.wait(), name="wait-started")
    stopped = asyncio.create_task(stop.wait(), name="wait-stop")
    try:
        done, _ = await asyncio.wait(
            {started, stopped, task}, return_when=asyncio.FIRST_COMPLETED, timeout=START_TIMEOUT_S
        )
    finally:
        for waiter in (started, stopped):
            waiter.cancel()
    if task in done:
        raise RuntimeError(f"the DRA plugin stopped before serving (exit {task.result()})")
    if not done:
        raise RuntimeError(f"the DRA plugin did not serve within {START_TIMEOUT_S:.0f} s")


@contextlib.asynccontextmanager
async def _registered(
    config: DraConfig,
) -> AsyncIterator[tuple[DraKubelet, dict[str, Any], HealthStream]]:
    """Register the plugin as the kubelet does and open its health stream."""
    async with DraKubelet(config.registry_dir) as kubelet:
        info = await kubelet.register(timeout_s=START_TIMEOUT_S)
        health = kubelet.watch_health()
        try:
            yield kubelet, info, health
        finally:
            health.cancel()


# ------------------------------------------------------------------ output
def _banner(s: _DraSession, info: dict[str, Any], health: dict[str, str], gpus_file: Path) -> None:
    config = s.config
    plan = s.plugin.plan()
    say(f"{READY_LINE} (Ctrl-C stops it)")
    say()
    say(
        f"DRA plugin     {info['name']} on {shown(config.socket_path)}, registered with the "
        f"simulated kubelet through {shown(config.registration_socket_path)}"
    )
    say(f"  GetInfo      {json.dumps(info, sort_keys=True)}")
    say(f"  health       {', '.join(f'{d} {h}' for d, h in sorted(health.items()))}")
    say(
        f"ResourceSlice  {plan.body['metadata']['name']}: {len(plan.devices)} devices "
        f"({', '.join(plan.devices)}), each {config.units_per_gpu} units (`slice` shows it)"
    )
    say(f"  GPUs file    {shown(gpus_file)}")
    say(f"CDI specs      {shown(config.cdi_dir)}")
    say("claims         in memory (no API server): `claim`, then `allocate`, then `prepare`")
    say()


def _slice(s: _DraSession) -> None:
    body = s.plugin.plan().body
    say(yaml.safe_dump(body, sort_keys=False).rstrip())
    _free(s, body)


def _free(s: _DraSession, body: dict[str, Any]) -> None:
    free = free_per_device(
        [body], s.claims.allocated(), driver=s.config.driver_name, node_name=NODE_NAME
    )
    say("free per GPU (what the allocated claims left):")
    for d in free:
        total_mib = int(d.memory.total // MIB)
        say(
            f"  {d.device}  {int(d.units_free)}/{int(d.units.total)} units  "
            f"{format_mib(d.memory_free_mib)}/{format_mib(total_mib)} memory"
        )


# ---------------------------------------------------------------- commands
async def _handle_line(s: _DraSession, line: str) -> bool:
    """One prompt line of ``metagpu dev --dra``; False: quit."""
    try:
        command = parse_dra_prompt(line, units_per_gpu=s.config.units_per_gpu)
        if command is None:
            return True
        if isinstance(command, Quit):
            return False
        await _execute(s, command)
    except (PromptError, DraKubeletSimError, OSError) as exc:
        say(f"error: {exc}")
    return True


async def _execute(s: _DraSession, command: DraCommand) -> None:
    if isinstance(command, CreateClaim):
        _create(s, command)
    elif isinstance(command, AllocateClaim):
        _allocate(s, command.number)
    elif isinstance(command, PrepareClaim):
        await _prepare(s, command.number)
    elif isinstance(command, UnprepareClaim):
        await _unprepare(s, command.number)
    elif isinstance(command, DeleteClaim):
        await _delete(s, command.number)
    elif isinstance(command, ShowClaims):
        _show_claims(s)
    elif isinstance(command, ShowSlice):
        _slice(s)
    elif isinstance(command, ShowHelp):
        say(DRA_PROMPT_HELP)


def _create(s: _DraSession, command: CreateClaim) -> None:
    """The claim the controller-manager makes from the template the webhook names."""
    units = command.units
    if command.memory_mib is not None:
        memory_mib = command.memory_mib
    elif units is not None:
        memory_mib = memory_for_units(units, units_per_gpu=s.config.units_per_gpu, dra=s.settings)
    else:  # pragma: no cover - the prompt asks for one of them
        raise PromptError("claim what? units, memory or both")
    shape = Shape(units, memory_mib)
    template = claim_template(shape, namespace="dev", dra=s.settings)
    number = s.claims.create(template["spec"]["spec"])
    say(
        f"claim {number}: dev/claim-{number} from template {template['metadata']['name']} "
        f"asks for {asked_of(s.claims.get(number))} of one {s.config.driver_name} device"
    )


def _allocate(s: _DraSession, number: int) -> None:
    claim = s.claims.get(number)
    if (claim.get("status") or {}).get("allocation"):
        say(f"claim {number} is allocated already: {consumed_of(claim)}")
        return
    result = allocate_claim(
        claim,
        slices=[s.plugin.plan().body],
        allocated=s.claims.allocated(),
        driver=s.config.driver_name,
        node_name=NODE_NAME,
        share_id=str(uuid.uuid4()),
    )
    if isinstance(result, Allocated):
        claim["status"] = {"allocation": result.allocation}
        say(f"claim {number} allocated: {consumed_of(claim)}")
        return
    say(f"claim {number} stays Pending: the scheduler says `{SCHEDULER_MESSAGE}`")
    say(f"  metagpu says: {result}")


async def _prepare(s: _DraSession, number: int) -> None:
    ref = s.claims.ref(number)
    answer = await s.kubelet.prepare([_ref_dict(s, number)])
    entry = answer.get("claims", {}).get(ref.uid, {})
    say(f"NodePrepareResources claim {number}: {json.dumps(entry, sort_keys=True)}")
    if "error" in entry:
        return
    s.claims.prepared.add(number)
    for path in _spec_files(s, number):
        say(f"CDI spec {shown(path)}:")
        say(json.dumps(json.loads(path.read_text()), indent=2))


async def _unprepare(s: _DraSession, number: int) -> None:
    ref = s.claims.ref(number)
    answer = await s.kubelet.unprepare([_ref_dict(s, number)])
    entry = answer.get("claims", {}).get(ref.uid, {})
    s.claims.prepared.discard(number)
    left = len(_spec_files(s, number))
    say(
        f"NodeUnprepareResources claim {number}: {json.dumps(entry, sort_keys=True)}; "
        f"{left} CDI spec file(s) left"
    )


async def _delete(s: _DraSession, number: int) -> None:
    if number in s.claims.prepared:
        await _unprepare(s, number)
    s.claims.get(number)
    del s.claims.claims[number]
    say(f"claim {number} deleted; its share is free again")


def _show_claims(s: _DraSession) -> None:
    if not s.claims.claims:
        say("no claims yet: `claim 0.5`")
        return
    for number, claim in sorted(s.claims.claims.items()):
        where = consumed_of(claim) or "Pending (not allocated)"
        prepared = "prepared" if number in s.claims.prepared else "not prepared"
        say(
            f"  {number}  {claim['metadata']['name']}  {asked_of(claim)}  ->  {where}  [{prepared}]"
        )


def _ref_dict(s: _DraSession, number: int) -> dict[str, str]:
    ref = s.claims.ref(number)
    return {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}


def _spec_files(s: _DraSession, number: int) -> list[Path]:
    prefix = spec_file_prefix(driver=s.config.driver_name, claim_uid=s.claims.ref(number).uid)
    return sorted(s.config.cdi_dir.glob(f"{prefix}*.json"))
