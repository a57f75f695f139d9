"""The repository's ``examples/`` files that the embedded default starts from and points at."""

from __future__ import annotations

from pathlib import Path
from typing import Final

EXAMPLES_DIR: Final = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_GPUS_FILE: Final = EXAMPLES_DIR / "gpus.yaml"
"""The simulated node ``make run`` starts with: 4 × A100-80GB on two NUMA nodes."""
EXAMPLE_REVIEW: Final = EXAMPLES_DIR / "admission-review-half-gpu.json"
EXAMPLE_POD: Final = EXAMPLES_DIR / "pod-half-gpu.yaml"
