"""The supervised MPS daemon on a real GPU (run by hand on a GPU machine; figures in
docs/benchmarks.md, "MPS").

``python3 tests/benchmarks/gpu_mps.py OUT_DIR``. What it does, each step bounded:

1. driver facts: ``nvidia-smi``, where ``nvidia-cuda-mps-control`` is, whether NVML
   lets the compute mode be read and set here;
2. the real daemon under :class:`plugin.gpu.mps_supervisor.MpsSupervisor` (the same
   code as the plugin), on GPU 0: start, compute mode, defaults read back, raw replies;
3. two clients of different shares (25 and 50 units): the 25-unit one allocates past
   its ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` while the 50-unit one keeps multiplying;
4. the SM cap of a ``fixed`` client: matmul throughput with no cap and at 25%;
5. the daemon killed (SIGKILL) while a client runs: what the client sees, how long
   the supervisor takes to restart it, whether a new client works after;
6. whether a non-root process with the pipe directory can change the daemon's defaults;
7. stop: no MPS process left, compute mode as it was.

Everything lands in ``OUT_DIR/mps.json`` (and the daemon's logs copied beside it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from plugin.api.limits import (  # noqa: E402
    memory_limit_mib,
    pinned_limit_env,
    thread_percentage,
)
from plugin.gpu.health_monitor import HealthBoard  # noqa: E402
from plugin.gpu.mps import Backoff, MpsGpu  # noqa: E402
from plugin.gpu.mps_control import MpsControl, MpsControlError  # noqa: E402
from plugin.gpu.mps_supervisor import MpsSupervisor  # noqa: E402
from plugin.gpu.nvml import NvmlBackend  # noqa: E402

CLIENT = str(ROOT / "tests" / "benchmarks" / "_gpu_mps_client.py")
WORK = Path("/tmp/mpsreal")
UNITS = 100


def sh(cmd: str, timeout: float = 30) -> dict[str, Any]:
    try:
        r = subprocess.run(
            cmd, shell=True, capture_output=True, text=True, timeout=timeout, check=False
        )
        return {"cmd": cmd, "rc": r.returncode, "out": (r.stdout + r.stderr)[-3000:]}
    except subprocess.TimeoutExpired:
        return {"cmd": cmd, "rc": None, "out": f"timed out after {timeout}s"}


def client(mode: str, out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, CLIENT, mode, str(out), *extra],
        env=env,
        stdout=open(out.with_suffix(".log"), "wb"),
        stderr=subprocess.STDOUT,
    )


def wait_file(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.1)
    return False


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log = path.with_suffix(".log")
        tail = log.read_text()[-1500:] if log.exists() else ""
        return {"missing": str(exc), "log": tail}


async def reach(sup: MpsSupervisor, state: str) -> None:
    """Wait for the supervisor's state (the caller bounds it)."""
    while True:
        changed = sup.changed
        if str(sup.status.state) == state:
            return
        await changed.wait()


def find_binary() -> str | None:
    binary = shutil.which("nvidia-cuda-mps-control")
    for cand in (
        "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-cuda-mps-control",
    ):
        if binary is None and Path(cand).exists():
            binary = cand
    return binary


RES: dict[str, Any] = {}
"""Filled step by step, written even when a later step fails."""


async def main(out_dir: Path) -> dict[str, Any]:
    res = RES
    res["nvidia_smi"] = sh("nvidia-smi")["out"]
    res["find_control"] = sh(
        "which nvidia-cuda-mps-control nvidia-cuda-mps-server; "
        "find /usr/local/nvidia /usr/bin /usr/local/bin /usr/lib -maxdepth 3 "
        "-name 'nvidia-cuda-mps*' 2>/dev/null | head"
    )
    binary = find_binary()
    res["binary"] = binary

    nvml = NvmlBackend()
    gpu = nvml.devices()[0]
    res["gpu"] = {"uuid": gpu.uuid, "name": gpu.name, "memory_mib": gpu.memory_mib}
    original = nvml.compute_mode(gpu.uuid)
    res["compute_mode_before"] = original
    try:
        nvml.set_compute_mode(gpu.uuid, "Exclusive_Process")
        res["compute_mode_set"] = nvml.compute_mode(gpu.uuid)
        nvml.set_compute_mode(gpu.uuid, original)
        res["compute_mode_restored"] = nvml.compute_mode(gpu.uuid)
    except Exception as exc:
        res["compute_mode_error"] = f"{type(exc).__name__}: {exc}"
    if binary is None:
        res["mps"] = "nvidia-cuda-mps-control not found; MPS steps skipped"
        return res

    shutil.rmtree(WORK, ignore_errors=True)
    control = MpsControl(
        command=(binary,), pipe_directory=WORK / "pipe", log_directory=WORK / "log"
    )
    board = HealthBoard()
    sup = MpsSupervisor(
        control,
        board,
        modes=nvml,
        health_interval_s=0.5,
        command_timeout_s=10,
        start_timeout_s=20,
        backoff=Backoff(initial_s=1, max_s=10),
    )
    t0 = time.monotonic()
    await sup.serve([MpsGpu(uuid=gpu.uuid, index=gpu.index, memory_mib=gpu.memory_mib)])
    res["start_s"] = round(time.monotonic() - t0, 2)
    res["status_after_start"] = {"state": sup.status.state, "reason": sup.status.reason}
    res["compute_mode_serving"] = nvml.compute_mode(gpu.uuid)
    replies: dict[str, Any] = {}
    for command in (
        "get_server_list",
        "get_default_active_thread_percentage",
        "get_default_device_pinned_mem_limit 0",
        f"get_default_device_pinned_mem_limit {gpu.uuid}",
        "no_such_command",
        "set_default_active_thread_percentage 250",
        "get_default_active_thread_percentage",
    ):
        try:
            replies[command] = await control.ask(command, timeout_s=10)
        except MpsControlError as exc:
            replies[command] = f"ERROR {exc}"
    replies["restore"] = await control.ask("set_default_active_thread_percentage 100", timeout_s=10)
    res["replies"] = replies
    if sup.status.state != "up":
        await sup.stop()
        return res

    base = dict(os.environ)
    base["CUDA_MPS_PIPE_DIRECTORY"] = str(control.pipe_directory)
    base.pop("CUDA_VISIBLE_DEVICES", None)

    def env_for(units: int, policy: str, **extra: str) -> dict[str, str]:
        env = dict(base)
        limit = memory_limit_mib(units, units_per_gpu=UNITS, memory_total_mib=gpu.memory_mib)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_limit_env([limit])
        pct = thread_percentage(units, units_per_gpu=UNITS, policy=policy)  # type: ignore[arg-type]
        if pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
        env.update(extra)
        return env

    # 3. memory: B (50 units, balance) keeps running while A (25 units) hits its limit
    stop = WORK / "stop-b"
    b_out = WORK / "b.json"
    b = client("loop", b_out, env_for(50, "balance"), str(stop))
    res["b_ready"] = wait_file(b_out.with_suffix(".ready"), 90)
    a_out = WORK / "a.json"
    a = client("hog", a_out, env_for(25, "balance"))
    a.wait(timeout=120)
    res["a_hog_25_units"] = read(a_out)
    res["a_limit_mib"] = memory_limit_mib(25, units_per_gpu=UNITS, memory_total_mib=gpu.memory_mib)
    res["server_list_during"] = await control.ask("get_server_list", timeout_s=10)
    await asyncio.sleep(2)  # let B run on past A's failure
    stop.write_text("stop")
    b.wait(timeout=60)
    res["b_loop_50_units"] = read(b_out)

    # a UUID-keyed limit: does the driver take CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<uuid>=...?
    u_out = WORK / "u.json"
    u = client(
        "hog", u_out, env_for(100, "balance", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"{gpu.uuid}=8192M")
    )
    u.wait(timeout=120)
    res["uuid_keyed_8192M"] = read(u_out)

    # 4. SM cap: matmul alone, no cap, then fixed at 25 units
    for label, env in (
        ("matmul_uncapped", env_for(100, "balance")),
        ("matmul_fixed_25", env_for(25, "fixed")),
        ("matmul_fixed_50", env_for(50, "fixed")),
    ):
        m_out = WORK / f"{label}.json"
        m = client("matmul", m_out, env)
        m.wait(timeout=120)
        res[label] = read(m_out)

    # 6. a non-root process that has the pipe directory
    res["pipe_dir_listing"] = sh(f"ls -la {control.pipe_directory}")["out"]
    res["nonroot_set"] = sh(
        f"echo 'set_default_active_thread_percentage 10' | setpriv --reuid=65534 "
        f"--regid=65534 --clear-groups env CUDA_MPS_PIPE_DIRECTORY={control.pipe_directory} "
        f"{binary}"
    )
    try:
        res["nonroot_after"] = await control.ask(
            "get_default_active_thread_percentage", timeout_s=10
        )
        await control.ask("set_default_active_thread_percentage 100", timeout_s=10)
    except MpsControlError as exc:
        res["nonroot_after"] = f"ERROR {exc}"
    res["status_after_nonroot"] = [sup.status.state, sup.status.reason]
    res["processes_after_nonroot"] = sh("ps -eo pid,ppid,user,stat,comm | grep -i mps")["out"]
    # the supervisor restarts a daemon that went away: wait for it
    async with asyncio.timeout(40):
        await reach(sup, "up")

    # 5. kill the daemon while a client runs
    stop2 = WORK / "stop-c"
    c_out = WORK / "c.json"
    c = client("loop", c_out, env_for(50, "balance"), str(stop2))
    res["c_ready"] = wait_file(c_out.with_suffix(".ready"), 90)
    res["processes_before_kill"] = sh("ps -eo pid,ppid,user,comm | grep -i mps")["out"]
    pid = control.daemon_pid()
    killed_at = time.monotonic()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    states: list[tuple[str, float, object]] = []
    async with asyncio.timeout(60):
        await reach(sup, "down")
        states.append(("down", round(time.monotonic() - killed_at, 2), dict(board.mps)))
        await reach(sup, "up")
        states.append(("up", round(time.monotonic() - killed_at, 2), sup.status.restarts))
    res["kill_timeline"] = states
    res["processes_after_restart"] = sh("ps -eo pid,ppid,user,comm | grep -i mps")["out"]
    res["server_list_after_restart"] = await control.ask("get_server_list", timeout_s=10)
    n_out = WORK / "n.json"
    n = client("hog", n_out, env_for(10, "balance"))
    try:
        n.wait(timeout=60)
        res["new_client_after_restart"] = read(n_out)
    except subprocess.TimeoutExpired:
        n.kill()
        res["new_client_after_restart"] = "timed out (60 s): waiting on the old server?"
    stop2.write_text("stop")
    try:
        c.wait(timeout=60)
    except subprocess.TimeoutExpired:
        c.kill()
    res["c_loop_across_kill"] = read(c_out)

    # 7. stop
    t1 = time.monotonic()
    await sup.stop()
    res["stop_s"] = round(time.monotonic() - t1, 2)
    res["processes_after_stop"] = sh("ps -eo pid,ppid,user,comm | grep -i mps")["out"]
    res["compute_mode_after_stop"] = nvml.compute_mode(gpu.uuid)
    res["status_after_stop"] = sup.status.state
    for name in ("control.log", "server.log"):
        src = control.log_directory / name
        if src.exists():
            shutil.copy(src, out_dir / name)
    nvml.close()
    return res


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = asyncio.run(main(out))
    except Exception as exc:
        import traceback

        result = dict(RES, crashed=traceback.format_exc())
        print(exc)
        for name in ("control.log", "server.log"):
            src = WORK / "log" / name
            if src.exists():
                shutil.copy(src, out / name)
    (out / "mps.json").write_text(json.dumps(result, indent=2, default=str))
    print(
        json.dumps({k: v for k, v in result.items() if k != "nvidia_smi"}, indent=1, default=str)[
            :9000
        ]
    )
