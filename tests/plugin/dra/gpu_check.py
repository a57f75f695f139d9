"""What the DRA plugin would publish and name on a real GPU host; run there by hand.

``python3 tests/plugin/dra/gpu_check.py`` (needs only nvidia-ml-py: no pydantic, which
GPU images often lack). Prints, per GPU, what the slice's device is built from and
whether the device nodes each CDI spec names exist. Seen on a lent H100 on 2026-11-27:
81559 MiB (capacity ``81559Mi``), no NUMA node, all four nodes present
(``test_shapes.py::test_a_real_h100_gives_a_valid_slice`` keeps those values).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from plugin.api.quantity import format_mib
from plugin.gpu.nvml import open_nvml

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""plugin.dra.cdi.CONTROL_DEVICE_NODES (that module needs pydantic)."""


def main() -> int:
    backend = open_nvml()
    try:
        gpus = backend.devices()
        gpu_rows: list[dict[str, object]] = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_capacity": format_mib(g.memory_mib),
                "numa": g.numa_node,
                "mig": g.mig_enabled,
                "identity_known": g.identity_known,
                "unhealthy": g.unhealthy_reason,
                "device_node_exists": os.path.exists(f"/dev/nvidia{g.minor_number}"),
            }
            for g in gpus
        ]
    finally:
        backend.close()
    nodes = {p: os.path.exists(p) for p in CONTROL_NODES}
    text = json.dumps({"gpus": gpu_rows, "control_nodes": nodes}, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "dra_gpu_check.json").write_text(text)
    found = all(nodes.values()) and all(g["device_node_exists"] for g in gpu_rows)
    return 0 if found else 1


if __name__ == "__main__":
    raise SystemExit(main())
