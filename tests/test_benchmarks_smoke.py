"""Every benchmark script still runs (in --quick mode) and prints figures.

Benchmarks measure and tests assert behaviour, so this only checks that each
script works end to end: a benchmark that silently rotted would leave
docs/benchmarks.md describing code that no longer exists.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted(
    p
    for p in (Path(__file__).parent / "benchmarks").glob("*.py")
    if not p.name.startswith(("_", "image_", "gpu_"))
)
"""Every script; modules named ``_*.py`` (``__init__``, shared helpers) are not benchmarks,
``image_*.py`` need the built image: tests/image/test_image_smoke.py runs those, and ``gpu_*.py``
need a GPU machine and its driver: they are run there by hand (docs/benchmarks.md says how)."""


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_runs_quick(script: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(script), "--quick"],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
        cwd=Path(__file__).parent.parent,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "p50" in result.stdout or "median" in result.stdout, result.stdout[-2000:]
