"""An MPS client for tests/benchmarks/gpu_mps.py (torch; runs only on a GPU machine).

``hog OUT``: allocate 256 MiB blocks until CUDA refuses; writes how much it got and
the error. ``matmul OUT``: bf16 8192^3 products, TFLOP/s over a timed run, plus the
SM count CUDA reports. ``loop OUT STOP``: matmuls until the file STOP exists (or 120 s),
then how many ran and whether any failed. Each writes one JSON object to OUT.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    import torch  # type: ignore[import-not-found]  # only on GPU machines

    mode, out = sys.argv[1], Path(sys.argv[2])
    result: dict[str, object] = {
        "mode": mode,
        "pid": os.getpid(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_")},
    }
    try:
        props = torch.cuda.get_device_properties(0)
        result["sm_count"] = props.multi_processor_count
        result["total_mib"] = props.total_memory // (1 << 20)
        if mode == "hog":
            blocks: list[object] = []
            block = 256 << 20
            try:
                while len(blocks) < 4096:
                    blocks.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            result["allocated_mib"] = len(blocks) * 256
        elif mode == "matmul":
            n = 8192
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
            iters = 30
            start = time.perf_counter()
            for _ in range(iters):
                a @ b
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            result["tflops"] = round(2 * n**3 * iters / elapsed / 1e12, 1)
            result["ms_per_matmul"] = round(elapsed / iters * 1000, 3)
        elif mode == "loop":
            stop = Path(sys.argv[3])
            n = 4096
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            out.with_suffix(".ready").write_text("ready")
            count = 0
            deadline = time.monotonic() + 120
            while not stop.exists() and time.monotonic() < deadline:
                c = a @ a
                torch.cuda.synchronize()
                count += 1
            result["iterations"] = count
            result["checksum_finite"] = bool(torch.isfinite(c.float().sum()).item())
        result["ok"] = True
    except Exception as exc:
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
