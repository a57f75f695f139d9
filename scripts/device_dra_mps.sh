#!/usr/bin/env bash
# MPS for DRA shares on a real NVIDIA GPU (scripts/device_dra_mps.py says what it does).
#
#   sudo OUT=/tmp/out scripts/device_dra_mps.sh        # from the repository root, as root
#
# Picks the first Python that has the plugin's dependencies (PYTHON, then .venv, then
# python3), fails at once when there is none, no GPU or no NVML, and bounds the whole
# run to 230 s (each step inside has its own bound). Results land in $OUT (default
# /tmp/out): dra_mps.json, dra_mps.log, cdi-spec.json, client.log, mps-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "FAILED: no nvidia-smi here: run this on an NVIDIA GPU host" | tee "$OUT/dra_mps.err"
    exit 2
fi

needs='import pydantic, grpc, google.protobuf, yaml, aiohttp, kubernetes_asyncio, pynvml'
py=""
for candidate in ${PYTHON:-} .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "$needs" 2>/dev/null; then
        py="$candidate"
        break
    fi
done
if [ -z "$py" ]; then
    {
        echo "FAILED: no Python here has the DRA plugin's dependencies."
        python3 - <<'PY' || true
import importlib
missing = []
for name in ("pydantic", "grpc", "google.protobuf", "yaml", "aiohttp", "kubernetes_asyncio", "pynvml"):
    try:
        importlib.import_module(name)
    except ImportError:
        missing.append(name)
print("python3 lacks:", ", ".join(missing))
PY
        echo "Install them (pip install -e . in this repository, or pip install pydantic grpcio"
        echo "protobuf pyyaml aiohttp kubernetes_asyncio nvidia-ml-py) or set PYTHON=..."
    } | tee "$OUT/dra_mps.err"
    exit 3
fi

echo "python: $py"
exec timeout -k 10 230 "$py" scripts/device_dra_mps.py
