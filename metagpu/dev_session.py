"""The ``metagpu dev`` session: webhook + simulated kubelet + device plugin in one loop.

Nothing here is a mock of the product: the webhook is :func:`webhook.server.running_webhook`
serving real HTTPS with a CA it generated, the device plugin is the real
:class:`plugin.deviceplugin.supervisor.Supervisor` on :class:`plugin.gpu.simulated.SimulatedGpus`,
and it registers over real gRPC with :class:`metagpu.kubelet_sim.KubeletSim`,
which then allocates the way the kubelet does. Only the GPUs and the kubelet
are stand-ins, because this machine has neither.

Beside them runs the real node agent (:class:`plugin.agent.agent.AgentRuntime`) on
the same simulated GPUs and the simulated kubelet's PodResources API, without a
Kubernetes API (no pod watch, labels or Events), so ``top`` at the prompt and
``metagpu top`` in another terminal draw the node as an operator sees one.

The session prints how to try it, makes one demo allocation, and reads
commands on stdin (see :data:`metagpu.dev_prompt.PROMPT_HELP`). It stops on Ctrl-C,
SIGTERM, ``quit``, or end of input from a terminal; everything it started is
stopped and its sockets are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from certs.files import write_atomic
from metagpu.dev_prompt import (
    PROMPT_HELP,
    Allocate,
    InjectXid,
    KillMpsDaemon,
    OtherPlugin,
    PromptCommand,
    PromptError,
    Quit,
    Release,
    Schedule,
    ShowDevices,
    ShowHelp,
    ShowTop,
    parse_prompt,
)
from metagpu.dev_schedule import GpuRow, decide
from metagpu.examples import EXAMPLE_POD, EXAMPLE_REVIEW
from metagpu.kubelet_sim import KubeletSim, KubeletSimError, PluginConnection
from metagpu.top_view import render_screen
from plugin.agent.agent import AgentRuntime
from plugin.agent.mgctl import AgentClient, MgctlError
from plugin.api.config import ENV_PREFIX as PLUGIN_ENV_PREFIX
from plugin.api.config import PluginConfig
from plugin.api.resources import ENV_MPS_PINNED_DEVICE_MEM_LIMIT, parse_replica_id
from plugin.api.settings import ConfigError, load_config
from plugin.deviceplugin.supervisor import Supervisor
from plugin.gpu.health_monitor import HealthBoard
from plugin.gpu.mps import PID_FILE_NAME, MpsNode
from plugin.gpu.simulated import load_gpus_file
from webhook.cli import curl_command
from webhook.config import ENV_PREFIX as WEBHOOK_ENV_PREFIX
from webhook.config import WebhookConfig
from webhook.server import RunningWebhook, running_webhook

REGISTER_TIMEOUT_S: Final = 30.0
"""Generous: a cold start on a loaded 2-core machine imports grpc and NVML shims."""
HEALTH_WAIT_S: Final = 10.0
OWNERSHIP_CHECK_S: Final = 0.5
"""How often the dev plugin asks the simulated kubelet which GPUs other plugins serve
(10 s on a node; shorter here, so `other 1` shows its effect at once)."""
OTHER_RESOURCE: Final = "nvidia.com/gpu"
"""The other device plugin `other <gpu>` pretends to run: NVIDIA's, by GPU UUID."""
STOP_TIMEOUT_S: Final = 20.0
DRA_COMMAND: Final = ".venv/bin/metagpu dev --dra"
"""How to start DRA mode (``make run`` takes no arguments), printed in the banner."""
READY_LINE: Final = "metagpu dev is running"
"""First line of the banner; tests wait for it."""
AGENT_INTERVAL_S: Final = 1.0
"""The dev agent reads every second (5 s on a node), so `top` after `allocate` is current."""
AGENT_WAIT_S: Final = 5.0
"""How long `top` waits for the agent's next reading before drawing the last one."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DevOptions:
    """What ``metagpu dev`` was asked for."""

    run_dir: Path
    listen: str
    gpus_file: Path
    webhook_config: Path | None = None
    plugin_config: Path | None = None
    mps: bool = False
    """The plugin supervises an MPS control daemon: the stand-in (``plugin.gpu.mps_standin``)
    run through the same subprocess path as ``nvidia-cuda-mps-control``."""
    dra: bool = False
    """Run DRA mode instead: the DRA kubelet plugin and its simulated kubelet
    (:mod:`metagpu.dev_dra_session`)."""


@dataclass
class _Session:
    options: DevOptions
    run_dir: Path
    gpus_file: Path
    plugin_config: PluginConfig
    resource: str
    kubelet: KubeletSim
    hook: RunningWebhook
    allocations: dict[int, list[str]] = field(default_factory=dict)
    next_number: int = 1
    board: HealthBoard | None = None
    """The plugin's health board (its MPS daemon state), once it runs."""
    mps_seen: list[MpsNode] = field(default_factory=list)
    """Every MPS state the board went through (a listener), so ``mps kill`` waits on
    what happened rather than on time."""
    mps_changed: asyncio.Event = field(default_factory=asyncio.Event)
    limits: dict[int, str] = field(default_factory=dict)
    """Allocation number → the memory limits Allocate handed out (``CUDA_MPS_…``)."""
    agent: AgentRuntime | None = None
    """The node agent behind `top`; None when it could not start (the banner said why)."""


def run_dev(options: DevOptions) -> int:
    """Run the session until stopped; returns the exit code (0 on a normal stop)."""
    return asyncio.run(_main(options))


def say(text: str = "") -> None:
    """The session talks on stdout (logs go to stderr), flushed so pipes see it at once."""
    print(text, flush=True)


async def _main(options: DevOptions) -> int:
    run_dir = options.run_dir.absolute()
    gpus_file = prepare_gpus_file(options.gpus_file, run_dir)
    plugin_config = load_config(
        PluginConfig,
        file=options.plugin_config,
        env=os.environ,
        env_prefix=PLUGIN_ENV_PREFIX,
        flags={
            "device_plugins_dir": run_dir / "device-plugins",
            "gpus_file": gpus_file,
            "agent.socket_dir": run_dir / "metagpu",
            "agent.pod_resources_socket": run_dir / "pod-resources" / "kubelet.sock",
            **(_mps_flags(run_dir) if options.mps else {}),
        },
    )
    webhook_config = load_config(
        WebhookConfig,
        file=options.webhook_config,
        env=os.environ,
        env_prefix=WEBHOOK_ENV_PREFIX,
        flags={
            "listen": options.listen,
            "tls.generate_dir": run_dir / "webhook-tls",
            "kubernetes.enabled": False,  # no cluster here: config alone
        },
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    read_stdin_in_background(loop, lines)
    try:
        async with (
            KubeletSim(
                plugin_config.device_plugins_dir,
                pod_resources_socket=plugin_config.agent.pod_resources_socket,
            ) as kubelet,
            running_webhook(webhook_config) as hook,
        ):
            supervisor = Supervisor(
                lambda: plugin_config,
                config=plugin_config,
                ownership_interval_s=OWNERSHIP_CHECK_S,
            )
            plugin = asyncio.create_task(supervisor.run(handle_signals=False), name="device-plugin")
            try:
                resource = plugin_config.resources[0].name
                await _wait_registered(kubelet, resource, plugin=plugin, stop=stop)
                if stop.is_set():
                    return 0
                session = _Session(
                    options, run_dir, gpus_file, plugin_config, resource, kubelet, hook
                )
                if supervisor.board is not None:
                    session.board = supervisor.board
                    supervisor.board.add_listener(lambda board: _note_mps(session, board))
                async with _node_agent(plugin_config) as (agent, agent_problem):
                    session.agent = agent
                    _banner(session, agent_problem)
                    await _demo(session)
                    say(PROMPT_HELP)
                    await prompt_loop(
                        lines,
                        stop=stop,
                        task=plugin,
                        prompt="metagpu> ",
                        what="the device plugin",
                        handle=lambda line: _handle_line(session, line),
                    )
            finally:
                supervisor.request_stop()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(plugin), STOP_TIMEOUT_S)
                if not plugin.done():
                    plugin.cancel()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    say("metagpu dev stopped")
    return 0


# ------------------------------------------------------------------ set-up
def _mps_flags(run_dir: Path) -> dict[str, object]:
    """``--mps``: the supervised daemon, the documented stand-in on the simulated GPUs,
    watched and restarted quickly enough to see at the prompt."""
    return {
        "mps.enabled": True,
        "mps.supervise": True,
        "mps.pipe_directory": run_dir / "mps",
        "mps.control_command": [sys.executable, "-m", "plugin.gpu.mps_standin"],
        "mps.health_interval_s": 0.5,
        "mps.restart_backoff_s": 0.5,
    }


@contextlib.asynccontextmanager
async def _node_agent(
    plugin_config: PluginConfig,
) -> AsyncIterator[tuple[AgentRuntime | None, str | None]]:
    """The node agent on the session's GPUs and PodResources socket, or None and why.

    A session without its agent still shows everything else, so a failure to
    start it (a socket path over 108 bytes, a port in use) is reported, not fatal.
    """
    agent = plugin_config.agent.model_copy(
        update={
            "node_name": None,  # no cluster: no pod watch, labels, ledger or Events
            "metrics_listen": "127.0.0.1:0",
            "interval_s": AGENT_INTERVAL_S,
            "label_node": False,
            "publish_ledger": False,
        }
    )
    runtime = AgentRuntime(plugin_config.model_copy(update={"agent": agent}), open_api=_no_cluster)
    try:
        await runtime.__aenter__()
    except Exception as exc:  # every cause is shown the same way: the banner says it
        logger.exception("the node agent did not start")
        yield None, f"{type(exc).__name__}: {exc}"
        return
    try:
        yield runtime, None
    finally:
        await runtime.__aexit__(None, None, None)


def _no_cluster() -> Any:
    """The agent never asks: it has no node name, so it opens no Kubernetes client."""
    raise RuntimeError("metagpu dev has no Kubernetes API")


def _note_mps(s: _Session, board: HealthBoard) -> None:
    node = board.mps_node
    if not s.mps_seen or s.mps_seen[-1] != node:
        s.mps_seen.append(node)
        s.mps_changed.set()


def _mps_line(node: MpsNode) -> str:
    enforces = ", ".join(node.enforces) or "nothing"
    if node.status is None:
        return f"MPS: {node.mode}; enforces {enforces}"
    status = node.status
    line = (
        f"MPS: supervised daemon {status.state} ({status.restarts} restart(s), "
        f"servers {list(status.server_pids)}); enforces {enforces}"
    )
    return line + (f"\n     {status.reason}" if status.state != "up" and status.reason else "")


def prepare_gpus_file(source: Path, run_dir: Path) -> Path:
    """Copy the starting GPUs into the run dir, so editing them never dirties the repo."""
    if not source.is_file():
        raise ConfigError(
            f"no simulated GPUs file at {source}; pass --gpus-file FILE "
            "(format: docs/device-plugin.md, example: examples/gpus.yaml)"
        )
    load_gpus_file(source)  # refuse a bad file before anything starts, with its reason
    target = run_dir / "gpus.yaml"
    write_atomic(target, source.read_bytes())
    return target


async def _wait_registered(
    kubelet: KubeletSim, resource: str, *, plugin: asyncio.Task[int], stop: asyncio.Event
) -> None:
    """Wait for the plugin to register, or fail fast if it died, or return on stop."""
    registered = asyncio.create_task(
        kubelet.wait_registered(resource, timeout_s=REGISTER_TIMEOUT_S), name="wait-registered"
    )
    stopped = asyncio.create_task(stop.wait(), name="wait-stop")
    try:
        done, _ = await asyncio.wait(
            {registered, stopped, plugin}, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in (registered, stopped):
            task.cancel()
    if plugin in done:
        raise RuntimeError(f"the device plugin stopped before registering (exit {plugin.result()})")
    if registered in done:
        registered.result()  # raises KubeletSimError with the registrations seen


# ------------------------------------------------------------------ output
def shown(path: Path) -> str:
    """A path as a person would type it from here: relative when under the cwd."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def _banner(s: _Session, agent_problem: str | None) -> None:
    conn = s.kubelet.plugins[s.resource]
    per_gpu = _by_gpu(conn)
    ca_file = s.hook.ca_file or s.hook.tls.cert_file
    review = Path(shown(EXAMPLE_REVIEW))
    pod = shown(EXAMPLE_POD) if EXAMPLE_POD.is_file() else "<a pod.yaml>"
    say(f"{READY_LINE} (Ctrl-C stops it)")
    say()
    say(f"webhook        {s.hook.mutate_url}")
    say(f"  CA           {shown(ca_file)}")
    say(f"  try it       {curl_command(s.hook.mutate_url, Path(shown(ca_file)), review)}")
    say(f"  offline      metagpu mutate -f {pod}   (in .venv/bin)")
    say(
        f"device plugin  {s.resource}: {len(per_gpu)} simulated GPUs x "
        f"{s.plugin_config.units_per_gpu} units = {len(conn.devices)} meta-devices, "
        f"registered with the simulated kubelet at {shown(s.kubelet.socket_path)}"
    )
    say(f"  GPUs file    {shown(s.gpus_file)} (edit it: append 79 to a GPU's xids)")
    if s.agent is not None:
        say(f"node agent     {shown(s.agent.socket_path)} (no Kubernetes API: pods show as dev/…)")
        say(f"  live view    .venv/bin/metagpu top --socket {shown(s.agent.socket_path)}")
        say("               (in another terminal; `top` here prints one frame)")
    else:
        say(f"node agent     did not start ({agent_problem}); `top` is unavailable")
    say(f"DRA mode       {DRA_COMMAND}   (the DRA plugin and a simulated kubelet, instead)")
    say()


async def _demo(s: _Session) -> None:
    say("demo: the webhook turns `nvidia.com/gpu: 0.5` into 50 units; the kubelet then asks")
    say("the plugin where to put them and what the container gets:")
    await _allocate(s, Allocate(units=s.plugin_config.units_per_gpu // 2, asked="0.5"))
    _release(s, Release(number=None), quiet=True)
    s.next_number = 1
    say("(released again)")
    say()


def _by_gpu(conn: PluginConnection) -> dict[str, dict[str, int]]:
    """Per GPU id: healthy, unhealthy, allocated and free meta-devices."""
    out: dict[str, dict[str, int]] = {}
    for device in conn.devices:
        gpu, _ = parse_replica_id(device.ID)
        row = out.setdefault(gpu, {"healthy": 0, "unhealthy": 0, "allocated": 0, "free": 0})
        healthy = device.health == "Healthy"
        row["healthy" if healthy else "unhealthy"] += 1
        if device.ID in conn.allocated:
            row["allocated"] += 1
        elif healthy:
            row["free"] += 1
    return out


def _gpu_rows(s: _Session) -> list[tuple[int, str, str]]:
    """(index, uuid, name) of every simulated GPU, from the current file."""
    spec = load_gpus_file(s.gpus_file)
    return [
        (g.index if g.index is not None else i, g.uuid, g.name) for i, g in enumerate(spec.gpus)
    ]


def _gpu_names(s: _Session) -> dict[str, str]:
    """Device ID (UUID or index, per ``device_id_strategy``) → ``GPU <index> <uuid>``.

    Built once per command: the GPUs file is read and validated once, not once
    per GPU mentioned."""
    names: dict[str, str] = {}
    for index, uuid, _ in _gpu_rows(s):
        names.setdefault(uuid, f"GPU {index} {uuid}")
        names.setdefault(str(index), f"GPU {index} {uuid}")
    return names


# ---------------------------------------------------------------- commands
async def prompt_loop(
    lines: asyncio.Queue[str | None],
    *,
    stop: asyncio.Event,
    task: asyncio.Task[int],
    prompt: str,
    what: str,
    handle: Callable[[str], Awaitable[bool]],
) -> None:
    """Read commands from ``lines`` (:func:`read_stdin_in_background`) and ``handle`` each
    (False: quit) until ``stop`` is set, ``task`` (the plugin) ends, or the input ends.

    ``metagpu dev`` and ``metagpu dev --dra`` share it. Piped input (tests, scripts)
    that ends keeps the session running until it is stopped; a terminal's end of input
    (Ctrl-D) stops it.
    """
    interactive = sys.stdin.isatty()
    stopped = asyncio.create_task(stop.wait(), name="wait-stop")
    try:
        while True:
            if interactive:
                print(prompt, end="", flush=True)
            line_task = asyncio.create_task(lines.get(), name="next-line")
            done, _ = await asyncio.wait(
                {line_task, stopped, task}, return_when=asyncio.FIRST_COMPLETED
            )
            if line_task not in done:
                line_task.cancel()
                if task in done:
                    say(f"{what} stopped (exit {task.result()}); stopping")
                return
            line = line_task.result()
            if line is None:  # end of input
                if interactive:
                    return
                await asyncio.wait({stopped, task}, return_when=asyncio.FIRST_COMPLETED)
                return
            if not await handle(line):
                return
    finally:
        stopped.cancel()


async def _handle_line(s: _Session, line: str) -> bool:
    """One prompt line of ``metagpu dev``; False: quit."""
    try:
        command = parse_prompt(line, units_per_gpu=s.plugin_config.units_per_gpu)
    except PromptError as exc:
        say(f"error: {exc}")
        return True
    if command is None:
        return True
    if isinstance(command, Quit):
        return False
    await _execute(s, command)
    return True


async def _execute(s: _Session, command: PromptCommand) -> None:
    try:
        if isinstance(command, Allocate):
            await _allocate(s, command)
        elif isinstance(command, Schedule):
            await _schedule(s, command)
        elif isinstance(command, Release):
            _release(s, command)
        elif isinstance(command, ShowDevices):
            _show_devices(s)
        elif isinstance(command, ShowTop):
            await _show_top(s)
        elif isinstance(command, OtherPlugin):
            await _other_plugin(s, command)
        elif isinstance(command, InjectXid):
            await _inject_xid(s, command)
        elif isinstance(command, KillMpsDaemon):
            await _kill_mps_daemon(s)
        elif isinstance(command, ShowHelp):
            say(PROMPT_HELP)
    except (KubeletSimError, ConfigError, OSError) as exc:
        say(f"error: {exc}")


async def _allocate(s: _Session, command: Allocate) -> None:
    ids, response = await s.kubelet.allocate(s.resource, command.units)
    number = s.next_number
    s.next_number += 1
    s.allocations[number] = ids
    counts: dict[str, int] = {}
    for device_id in ids:
        gpu, _ = parse_replica_id(device_id)
        counts[gpu] = counts.get(gpu, 0) + 1
    names = _gpu_names(s)
    placed = ", ".join(f"{n} on {names.get(gpu, gpu)}" for gpu, n in counts.items())
    say(f"#{number} allocate {command.asked} -> {command.units} units: {placed}")
    for key in sorted(response.envs):
        say(f"    {key}={response.envs[key]}")
    if ENV_MPS_PINNED_DEVICE_MEM_LIMIT in response.envs:
        s.limits[number] = response.envs[ENV_MPS_PINNED_DEVICE_MEM_LIMIT]
    for mount in response.mounts:
        mode = "ro" if mount.read_only else "rw"
        say(f"    mount {mount.host_path} -> {mount.container_path} ({mode})")


async def _schedule(s: _Session, command: Schedule) -> None:
    """The extender's decision on the simulated node, then the kubelet's allocation."""
    conn = s.kubelet.plugins[s.resource]
    per_gpu = _by_gpu(conn)
    held: dict[str, dict[int, int]] = {}
    for number, ids in s.allocations.items():
        for device_id in ids:
            gpu, _ = parse_replica_id(device_id)
            held.setdefault(gpu, {}).setdefault(number, 0)
            held[gpu][number] += 1
    spec = load_gpus_file(s.gpus_file)
    index_of: dict[str, int] = {}
    numa_of: dict[str, int | None] = {}
    for position, simulated in enumerate(spec.gpus):
        index = simulated.index if simulated.index is not None else position
        for key in (simulated.uuid, str(index)):
            index_of[key], numa_of[key] = index, simulated.numa_node
    rows = [
        GpuRow(
            device_id=gpu,
            index=index_of.get(gpu, position),
            units=s.plugin_config.units_per_gpu,
            allocated=held.get(gpu, {}),
            healthy=row["unhealthy"] == 0,
            numa=numa_of.get(gpu),
        )
        for position, (gpu, row) in enumerate(per_gpu.items())
    ]
    decision = decide(
        sorted(rows, key=lambda r: r.index),
        command.units,
        resource=s.resource,
        units_per_gpu=s.plugin_config.units_per_gpu,
        policy=s.plugin_config.allocation_policy,
        request_number=s.next_number,
    )
    names = _gpu_names(s)
    say(f"schedule {command.asked} -> {command.units} units; free units per GPU (extender's view):")
    for _, device_id, free, healthy in decision.free:
        note = "" if healthy else "  (unhealthy: never offered)"
        say(f"    {names.get(device_id, device_id):<48} {free:>5} free{note}")
    if decision.gpus is None:
        say(f"extender: node refused: {decision.refusal}")
        say("(the pod would stay Pending with that reason in its FailedScheduling event)")
        return
    assigned = ", ".join(f"{n} on {names.get(g, g)}" for g, n in decision.gpus.items())
    say(f"extender: assigned {assigned}")
    await _allocate(s, Allocate(units=command.units, asked=command.asked))


def _release(s: _Session, command: Release, *, quiet: bool = False) -> None:
    numbers: Sequence[int] = list(s.allocations) if command.number is None else [command.number]
    for number in numbers:
        ids = s.allocations.pop(number, None)
        s.limits.pop(number, None)
        if ids is None:
            say(f"error: no allocation #{number}; current: {sorted(s.allocations) or 'none'}")
            continue
        s.kubelet.release(s.resource, ids)
        if not quiet:
            say(f"#{number} released ({len(ids)} units)")


def _show_devices(s: _Session) -> None:
    conn = s.kubelet.plugins[s.resource]
    per_gpu = _by_gpu(conn)
    names = _gpu_names(s)
    say(f"{'GPU':<48} {'healthy':>8} {'allocated':>10} {'free':>6}")
    for gpu, row in per_gpu.items():
        health = "yes" if row["unhealthy"] == 0 else "NO"
        say(f"{names.get(gpu, gpu):<48} {health:>8} {row['allocated']:>10} {row['free']:>6}")
    say(f"allocatable: {s.kubelet.allocatable(s.resource)} (healthy meta-devices)")
    if s.board is not None and s.board.mps_node.mode != "off":
        node = s.board.mps_node
        say(_mps_line(node))
        held = "enforced" if "memory" in node.enforces else "advisory"
        for number in sorted(s.allocations):
            limit = s.limits.get(number, "-")
            say(f"  #{number}: memory limit per GPU (ordinal=MiB) {limit} ({held})")
        say(
            "  (compute: fixed pods also get CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from the "
            "webhook; the kubelet's Allocate does not know the pod)"
        )


async def _show_top(s: _Session) -> None:
    """One frame of ``metagpu top``, through the agent's socket as the live view reads it,
    after the agent's next reading (so an allocation just made is in it)."""
    if s.agent is None:
        say("error: the node agent is not running in this session (the banner said why)")
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(AGENT_WAIT_S):
            await s.agent.agent.next_cycle()
    client = AgentClient(str(s.agent.socket_path), timeout_s=AGENT_WAIT_S)
    try:
        # A thread: the agent answering it runs on this very event loop.
        doc = await asyncio.to_thread(client.get, "/devices")
    except MgctlError as exc:
        say(f"error: {exc}")
        return
    width = shutil.get_terminal_size((100, 24)).columns
    ascii_only = (sys.stdout.encoding or "").lower().replace("-", "") != "utf8"
    for line in render_screen(doc, width=width, ascii_only=ascii_only):
        say(line)


async def _kill_mps_daemon(s: _Session) -> None:
    """SIGKILL the daemon, then wait (bounded) until the plugin saw it down, withdrew
    its GPUs, and restarted it with its defaults."""
    if s.board is None or s.board.mps_node.status is None:
        say("error: MPS is not supervised here; start with `metagpu dev --mps`")
        return
    pid_file = s.plugin_config.mps.pipe_directory / PID_FILE_NAME
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError) as exc:
        say(f"error: no MPS control daemon PID in {pid_file}: {exc}")
        return
    before = s.board.mps_node.status.restarts
    seen_from = len(s.mps_seen)
    os.kill(pid, signal.SIGKILL)
    say(f"killed the MPS control daemon (pid {pid}) with SIGKILL")

    def seen(predicate: Any) -> MpsNode | None:
        return next((n for n in s.mps_seen[seen_from:] if predicate(n)), None)

    async def until(predicate: Any) -> MpsNode:
        async with asyncio.timeout(HEALTH_WAIT_S):
            while (found := seen(predicate)) is None:
                s.mps_changed.clear()
                if (found := seen(predicate)) is not None:
                    break
                await s.mps_changed.wait()
        return found

    try:
        down = await until(lambda n: n.status is not None and n.status.state == "down")
        say(_mps_line(down))
        say("  the plugin withdrew every GPU it serves meanwhile (Unhealthy, check `mps`)")
        up = await until(
            lambda n: n.status is not None and n.status.state == "up" and n.status.restarts > before
        )
    except TimeoutError:
        say(f"error: the daemon did not come back within {HEALTH_WAIT_S:g}s; see the log")
        return
    say(_mps_line(up))
    with contextlib.suppress(TimeoutError):
        await s.kubelet.wait_devices(
            s.resource,
            lambda devices: all(d.health == "Healthy" for d in devices),
            timeout_s=HEALTH_WAIT_S,
        )
    say(f"allocatable: {s.kubelet.allocatable(s.resource)} (healthy meta-devices)")


async def _inject_xid(s: _Session, command: InjectXid) -> None:
    rows = _gpu_rows(s)
    match = [uuid for index, uuid, _ in rows if index == command.gpu_index]
    if not match:
        say(f"error: no GPU with index {command.gpu_index}; indices: {[r[0] for r in rows]}")
        return
    uuid = match[0]
    raw: dict[str, Any] = yaml.safe_load(s.gpus_file.read_text()) or {}
    for gpu in raw.get("gpus", []):
        if gpu.get("uuid") == uuid:
            gpu.setdefault("xids", []).append(command.xid)
    write_atomic(s.gpus_file, yaml.safe_dump(raw, sort_keys=False).encode())
    ignored = s.plugin_config.health.ignored_xids
    if command.xid in ignored:
        say(
            f"XID {command.xid} appended for GPU {command.gpu_index}; it is in "
            f"health.ignored_xids {list(ignored)} (an application error), so health stays as is"
        )
        return
    gpu_ids = {uuid, str(command.gpu_index)}

    def sick(devices: list[Any]) -> bool:
        return any(parse_replica_id(d.ID)[0] in gpu_ids and d.health != "Healthy" for d in devices)

    try:
        await s.kubelet.wait_devices(s.resource, sick, timeout_s=HEALTH_WAIT_S)
    except KubeletSimError:
        say(
            f"XID {command.xid} appended, but GPU {command.gpu_index} is still healthy "
            f"after {HEALTH_WAIT_S:.0f}s (is health checking enabled?)"
        )
        return
    say(
        f"GPU {command.gpu_index} is now Unhealthy: all its meta-devices left allocatable "
        f"({s.kubelet.allocatable(s.resource)} now); it recovers after "
        f"{s.plugin_config.health.recovery_s:.0f}s without errors"
    )


async def _other_plugin(s: _Session, command: OtherPlugin) -> None:
    """Pretend NVIDIA's device plugin serves a GPU too, as the PodResources API would
    show it; the plugin's ownership check withdraws that GPU within a second."""
    rows = _gpu_rows(s)
    if command.gpu_index is None:
        released = {i for ids in s.kubelet.other_devices.values() for i in ids}
        s.kubelet.other_devices.clear()

        def offered(devices: list[Any]) -> bool:
            return all(
                d.health == "Healthy" for d in devices if parse_replica_id(d.ID)[0] in released
            )

        with contextlib.suppress(KubeletSimError):  # it may be unhealthy for another reason
            await s.kubelet.wait_devices(s.resource, offered, timeout_s=HEALTH_WAIT_S)
        say(f"no other device plugin now; {s.kubelet.allocatable(s.resource)} units allocatable")
        return
    match = [uuid for index, uuid, _ in rows if index == command.gpu_index]
    if not match:
        say(f"error: no GPU with index {command.gpu_index}; indices: {[r[0] for r in rows]}")
        return
    uuid = match[0]
    s.kubelet.other_devices = {OTHER_RESOURCE: [uuid]}
    gpu_ids = {uuid, str(command.gpu_index)}

    def withdrawn(devices: list[Any]) -> bool:
        return any(parse_replica_id(d.ID)[0] in gpu_ids and d.health != "Healthy" for d in devices)

    try:
        await s.kubelet.wait_devices(s.resource, withdrawn, timeout_s=HEALTH_WAIT_S)
    except KubeletSimError:
        say(f"GPU {command.gpu_index} is still offered after {HEALTH_WAIT_S:.0f}s")
        return
    say(
        f"{OTHER_RESOURCE} now also advertises GPU {command.gpu_index} ({uuid}): metagpu "
        f"withdrew its units ({s.kubelet.allocatable(s.resource)} allocatable now); "
        "`other none` gives it back"
    )


def read_stdin_in_background(
    loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]
) -> None:
    """Feed stdin lines to ``lines`` from a daemon thread (None at end of input).

    A daemon thread, not ``asyncio.to_thread``: a blocked ``readline`` cannot be
    cancelled, and the default executor is joined when the loop closes.
    """

    def pump() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while we were reading
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=pump, name="dev-stdin", daemon=True).start()
