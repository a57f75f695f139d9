"""MPS for DRA shares on a real GPU: run by hand on an NVIDIA host (root), never in CI.

``scripts/device_dra_mps.sh`` (which picks a Python with the plugin's dependencies and
bounds the run) or ``OUT=/tmp/out python3 scripts/device_dra_mps.py``. What the unit
tests prove against the MPS stand-in (``tests/plugin/dra/test_mps.py``), this checks
against the driver, because only the driver can say whether a share's CDI spec really
caps a CUDA client:

1. facts: ``nvidia-smi``, NVML's GPUs and compute modes, where ``nvidia-cuda-mps-control``
   is, whether torch is importable by ``python3`` (the client), euid;
2. the DRA plugin (:class:`plugin.dra.runtime.DraPlugin`, real NVML, ``mps.supervise``
   with the real control program) in this process, with no kubelet and no API server: the
   claim lives in memory (as ``metagpu dev --dra``) and the kubelet's calls come from the
   simulated kubelet over the real sockets and protos (:mod:`metagpu.dra_kubelet_sim`);
3. NodePrepareResources of a 25-unit share of GPU 0; the CDI spec it wrote is printed;
4. a CUDA client run with exactly the spec's ``env`` (over a minimal base environment):
   torch when ``python3`` has it, allocating 256 MiB blocks until CUDA refuses, else the
   CUDA driver API through ctypes doing the same; the MiB reached against
   ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and the SMs CUDA reports;
5. NodeUnprepareResources, then stop: the daemon quit, the compute modes before and after.

On the host there is no container runtime to bind-mount the pipe directory, so
``mps.container_pipe_directory`` is set to the host's ``mps.pipe_directory`` (the spec's
``CUDA_MPS_PIPE_DIRECTORY`` then names a directory that exists here); the mounts are still
printed as the runtime would apply them. Results: ``$OUT/dra_mps.json`` (``OUT`` defaults
to ``/tmp/out``), the spec, the client's output and the daemon's logs beside it. Each
step is bounded; the whole run stays under 4 minutes. Without NVML, root or the control
program it stops at once and says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT: Final = Path(os.environ.get("OUT") or "/tmp/out")
WORK: Final = Path("/tmp/mgdra")
"""Short: the daemon's unix sockets live under it (108-byte limit). Fixed, so a run that
died leaves its compute-mode state file where the next run restores it from."""
NODE: Final = "device-check"
UNITS: Final = 25
TOTAL_S: Final = 200.0
CLIENT_S: Final = 120.0
BLOCK_MIB: Final = 256

RESULT: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
"""Filled step by step and written even when a later step fails."""


def say(text: str) -> None:
    print(text, flush=True)


def sh(cmd: list[str], timeout_s: float = 20) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{' '.join(cmd)}: {exc}"
    return (done.stdout + done.stderr).strip()


def write_result() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dra_mps.json").write_text(json.dumps(RESULT, indent=2, sort_keys=True) + "\n")


def fail(reason: str) -> int:
    """Stop before touching the GPU, saying why (exit status 2)."""
    RESULT["error"] = reason
    write_result()
    say(f"FAILED: {reason}")
    return 2


def control_program() -> str | None:
    found = shutil.which("nvidia-cuda-mps-control")
    for candidate in (
        "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-cuda-mps-control",
    ):
        if found is None and Path(candidate).exists():
            found = candidate
    return found


def client_python() -> tuple[str, str | None]:
    """``python3`` (the system's, where GPU hosts keep torch) and torch's version, or None."""
    python = shutil.which("python3") or sys.executable
    probe = sh([python, "-c", "import torch; print(torch.__version__)"], timeout_s=60)
    lines = probe.splitlines()
    has_torch = bool(lines) and "Error" not in probe and "No module" not in probe
    return python, (lines[-1] if has_torch else None)


CLIENT: Final = r'''
"""A CUDA client for scripts/device_dra_mps.py: allocate blocks until CUDA refuses."""
import ctypes, json, os, sys
block_mib = int(sys.argv[1])
out = {"pid": os.getpid(), "env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}}
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    out["client"] = f"torch {torch.__version__}"
    try:
        props = torch.cuda.get_device_properties(0)
        out["sm_count"] = props.multi_processor_count
        out["total_mib"] = props.total_memory >> 20
        blocks = []
        try:
            while len(blocks) < 4096:
                blocks.append(torch.empty(block_mib << 20, dtype=torch.uint8, device="cuda"))
        except Exception as exc:
            out["refused"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out["reached_mib"] = len(blocks) * block_mib
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
else:
    out["client"] = "CUDA driver API (ctypes, libcuda.so.1)"
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        def call(name, *args):
            rc = getattr(cuda, name)(*args)
            if rc != 0:
                text = ctypes.c_char_p()
                cuda.cuGetErrorName(rc, ctypes.byref(text))
                raise RuntimeError(f"{name}: {(text.value or b'?').decode()} ({rc})")
        call("cuInit", 0)
        dev = ctypes.c_int()
        call("cuDeviceGet", ctypes.byref(dev), 0)
        sms = ctypes.c_int()
        call("cuDeviceGetAttribute", ctypes.byref(sms), 16, dev)  # MULTIPROCESSOR_COUNT
        ctx = ctypes.c_void_p()
        call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        call("cuCtxSetCurrent", ctx)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        out["sm_count"] = sms.value  # under MPS: of the context, after the thread cap
        out["total_mib"] = total.value >> 20
        reached = 0
        try:
            while reached < 4096 * block_mib:
                ptr = ctypes.c_uint64()
                call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(block_mib << 20))
                reached += block_mib
        except RuntimeError as exc:
            out["refused"] = str(exc)
        out["reached_mib"] = reached
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
print(json.dumps(out))
'''


def base_env() -> dict[str, str]:
    """What a container has before the spec's env: a path, a home, the libraries."""
    keep = ("PATH", "HOME", "LANG", "LD_LIBRARY_PATH", "PYTHONPATH", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ}


def spec_env(spec: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for edits in [spec.get("containerEdits") or {}] + [
        d.get("containerEdits") or {} for d in spec["devices"]
    ]:
        for entry in edits.get("env") or []:
            name, _, value = str(entry).partition("=")
            env[name] = value
    return env


def limit_mib(env: Mapping[str, str]) -> int | None:
    """The MiB of ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20389M``."""
    raw = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
    _, _, value = raw.partition("=")
    return int(value[:-1]) if value.endswith("M") and value[:-1].isdigit() else None


def compute_modes() -> dict[str, str]:
    """From nvidia-smi, independent of the plugin's own NVML handle."""
    text = sh(["nvidia-smi", "--query-gpu=uuid,compute_mode", "--format=csv,noheader"])
    modes: dict[str, str] = {}
    for line in text.splitlines():
        uuid_, _, mode = line.partition(",")
        if uuid_.strip().startswith("GPU-"):
            modes[uuid_.strip()] = mode.strip()
    return modes or {"nvidia-smi": text}


def nvml_modes() -> dict[str, str]:
    """The compute modes through a fresh NVML handle (the plugin's is closed by now)."""
    from plugin.gpu.backend import ComputeModeControl, GpuBackendError  # noqa: PLC0415
    from plugin.gpu.nvml import open_nvml  # noqa: PLC0415

    try:
        nvml = open_nvml()
    except GpuBackendError as exc:
        return {"nvml": str(exc)}
    try:
        if not isinstance(nvml, ComputeModeControl):
            return {}
        return {g.uuid: str(nvml.compute_mode(g.uuid)) for g in nvml.devices()}
    finally:
        nvml.close()


def claim_of(gpu: Any, *, driver: str, memory_mib: int) -> dict[str, Any]:
    """A 25-unit claim as kube-scheduler v1.36 allocates it (consumable capacity, a shareID),
    the shape ``metagpu dev --dra`` writes."""
    from plugin.dra.slices import device_name  # noqa: PLC0415

    capacity = {"units": str(UNITS), "memory": f"{memory_mib}Mi"}
    selector = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "share-25", "namespace": "device-check", "uid": str(uuid.uuid4())},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": driver,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": capacity},
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": driver,
                            "pool": NODE,
                            "device": device_name(gpu),
                            "shareID": str(uuid.uuid4()),
                            "consumedCapacity": capacity,
                        }
                    ]
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [selector]}]},
            }
        },
    }


async def run_plugin(binary: str, python: str) -> None:
    from metagpu.dra_kubelet_sim import DraKubelet  # noqa: PLC0415
    from plugin.api.limits import memory_limit_mib  # noqa: PLC0415
    from plugin.dra.claims import ClaimNotFoundError, ClaimRef  # noqa: PLC0415
    from plugin.dra.config import DraConfig  # noqa: PLC0415
    from plugin.dra.runtime import DraPlugin  # noqa: PLC0415
    from plugin.gpu.backend import ComputeModeControl  # noqa: PLC0415
    from plugin.gpu.nvml import open_nvml  # noqa: PLC0415

    nvml = open_nvml()
    try:
        gpus = sorted(nvml.devices(), key=lambda g: g.index)
        RESULT["gpus"] = [
            {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_mib": g.memory_mib}
            for g in gpus
        ]
        if isinstance(nvml, ComputeModeControl):
            RESULT["compute_mode_before_nvml"] = {g.uuid: nvml.compute_mode(g.uuid) for g in gpus}
    finally:
        nvml.close()
    gpu = gpus[0]
    RESULT["compute_mode_before"] = compute_modes()
    say(f"compute modes before: {RESULT['compute_mode_before']}")

    pipe = WORK / "pipe"
    config = DraConfig.model_validate(
        {
            "node_name": NODE,
            "plugins_dir": str(WORK / "plugins"),
            "registry_dir": str(WORK / "registry"),
            "cdi_dir": str(WORK / "cdi"),
            "runtime_check": "off",  # no API server, no Node to read
            "mps": {
                "enabled": True,
                "supervise": True,
                "pipe_directory": str(pipe),
                "container_pipe_directory": str(pipe),  # no runtime here to mount it
                "log_directory": str(WORK / "log"),
                "control_command": [binary],
            },
        }
    )
    memory_mib = memory_limit_mib(UNITS, units_per_gpu=100, memory_total_mib=gpu.memory_mib)
    claim = claim_of(gpu, driver=config.driver_name, memory_mib=memory_mib)
    meta = claim["metadata"]
    ref = {"namespace": meta["namespace"], "uid": meta["uid"], "name": meta["name"]}

    async def read(asked: ClaimRef) -> Mapping[str, Any]:
        if asked.uid == meta["uid"]:
            return claim
        raise ClaimNotFoundError(f"claim {asked} not found")

    def no_api() -> Any:
        raise RuntimeError("no API server in this check")

    plugin = DraPlugin(config, open_api=no_api, claims=read)
    stop = asyncio.Event()
    started = time.monotonic()
    task = asyncio.create_task(plugin.run(stop), name="dra-plugin")
    try:
        done, _ = await asyncio.wait(
            {task, asyncio.ensure_future(plugin.started.wait())},
            timeout=60,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if task in done:
            raise RuntimeError(f"the DRA plugin exited at start: {task.result()}")
        if not plugin.started.is_set():
            raise RuntimeError("the DRA plugin did not start within 60 s")
        mps = plugin.mps
        RESULT["daemon"] = {
            "state": mps.status.state if mps else None,
            "reason": mps.status.reason if mps else None,
            "start_s": round(time.monotonic() - started, 2),
        }
        RESULT["compute_mode_serving"] = compute_modes()
        say(f"daemon: {RESULT['daemon']}; compute modes now: {RESULT['compute_mode_serving']}")
        RESULT["slice_devices"] = sorted(plugin.plan().devices)
        RESULT["withdrawn"] = dict(plugin.plan().withdrawn)
        async with DraKubelet(config.registry_dir) as kubelet:
            await kubelet.register()
            answer = await kubelet.prepare([ref])
            RESULT["prepare"] = answer
            say(f"NodePrepareResources: {json.dumps(answer, sort_keys=True)}")
            entry = answer.get("claims", {}).get(meta["uid"], {})
            if "error" in entry:
                raise RuntimeError(f"prepare refused: {entry['error']}")
            (path,) = sorted(config.cdi_dir.glob(f"*{meta['uid']}*.json"))
            spec = json.loads(path.read_text())
            RESULT["cdi_spec"] = spec
            (OUT / "cdi-spec.json").write_text(json.dumps(spec, indent=2) + "\n")
            say(f"CDI spec {path}:\n{json.dumps(spec, indent=2)}")
            await run_client(spec, python=python, gpu_count=len(gpus), uuid_=gpu.uuid)
            RESULT["unprepare"] = await kubelet.unprepare([ref])
            RESULT["spec_left_after_unprepare"] = path.exists()
            say(f"NodeUnprepareResources: {RESULT['unprepare']}; spec left: {path.exists()}")
    finally:
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 40)
        except TimeoutError:
            task.cancel()
            RESULT["stop"] = "did not stop within 40 s"
        RESULT["daemon_after"] = plugin.mps.status.state if plugin.mps else None
        RESULT["compute_mode_after"] = compute_modes()
        RESULT["compute_mode_after_nvml"] = nvml_modes()
        RESULT["mps_processes_after"] = sh(["pgrep", "-a", "nvidia-cuda-mps"])
        say(
            f"stopped: daemon {RESULT['daemon_after']}; compute modes after: "
            f"{RESULT['compute_mode_after']} (before: {RESULT['compute_mode_before']})"
        )
        with contextlib.suppress(OSError):
            shutil.copytree(WORK / "log", OUT / "mps-logs", dirs_exist_ok=True)


async def run_client(spec: Mapping[str, Any], *, python: str, gpu_count: int, uuid_: str) -> None:
    env = base_env()
    env.update(spec_env(spec))
    added = {}
    if gpu_count > 1:
        # A runtime would show the container its one GPU (NVIDIA_VISIBLE_DEVICES); here
        # every GPU is visible, so CUDA is told which one is ordinal 0.
        added["CUDA_VISIBLE_DEVICES"] = uuid_
        env.update(added)
    RESULT["client_env_added"] = added
    script = OUT / "client.py"
    script.write_text(CLIENT)
    say(f"client: {python} with the spec's env (+ {added or 'nothing'})")
    proc = await asyncio.create_subprocess_exec(
        python,
        str(script),
        str(BLOCK_MIB),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        raw, _ = await asyncio.wait_for(proc.communicate(), CLIENT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        RESULT["client"] = {"error": f"no answer within {CLIENT_S:g} s"}
        return
    text = raw.decode(errors="replace")
    (OUT / "client.log").write_text(text)
    try:
        client: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        client = {"error": "no JSON from the client", "output": text[-2000:]}
    limit = limit_mib(spec_env(spec))
    reached = client.get("reached_mib")
    client["limit_mib"] = limit
    if isinstance(reached, int) and limit is not None:
        client["verdict"] = (
            "limit held" if reached <= limit and "refused" in client else "LIMIT NOT HELD"
        )
    RESULT["client"] = client
    say(
        f"client ({client.get('client')}): reached {reached} MiB of a {limit} MiB limit "
        f"({client.get('verdict', client.get('error'))}); SMs reported {client.get('sm_count')}; "
        f"refused with: {client.get('refused')}"
    )


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[logging.StreamHandler(), logging.FileHandler(OUT / "dra_mps.log", mode="w")],
    )
    RESULT["nvidia_smi"] = sh(["nvidia-smi"])
    try:
        from plugin.gpu.nvml import open_nvml  # noqa: PLC0415

        open_nvml().close()
    except Exception as exc:  # any failure here means: no GPU to check
        return fail(f"NVML does not initialise here ({exc}): run this on an NVIDIA GPU host")
    if os.geteuid() != 0:
        return fail("not root: the plugin sets the GPUs' compute mode (EXCLUSIVE_PROCESS)")
    binary = control_program()
    RESULT["control_program"] = binary
    if binary is None:
        return fail("nvidia-cuda-mps-control not found (PATH, /usr/local/nvidia/bin, /usr/bin)")
    python, torch_version = client_python()
    RESULT["client_python"] = {"python": python, "torch": torch_version}
    say(f"control program {binary}; client {python} (torch {torch_version or 'absent: ctypes'})")
    WORK.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.run(asyncio.wait_for(run_plugin(binary, python), TOTAL_S))
    except Exception as exc:
        RESULT["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {RESULT['error']}")
        write_result()
        return 1
    write_result()
    say(f"results in {OUT}/dra_mps.json")
    verdict = (RESULT.get("client") or {}).get("verdict")
    restored = RESULT.get("compute_mode_after") == RESULT.get("compute_mode_before") and (
        RESULT.get("compute_mode_after_nvml") == RESULT.get("compute_mode_before_nvml")
    )
    say(f"SUMMARY: memory {verdict}; compute modes restored: {restored}")
    return 0 if verdict == "limit held" and restored else 1


if __name__ == "__main__":
    sys.exit(main())
