"""Opening the configured backend: one choice for the device plugin and the agent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from plugin.api.settings import ConfigError
from plugin.gpu.backend import GpuBackendError
from plugin.gpu.backends import open_backend
from plugin.gpu.simulated import SimulatedGpus

UUID = "GPU-0b8a5e3c-1f6e-4a53-9c1e-2d7b8f1a0c01"


def test_a_gpus_file_opens_simulated_gpus(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        yaml.safe_dump({"gpus": [{"uuid": UUID, "name": "NVIDIA A100", "memory_mib": 1024}]})
    )
    backend = open_backend(gpus_file=path)
    try:
        assert isinstance(backend, SimulatedGpus)
        assert [g.uuid for g in backend.devices()] == [UUID]
    finally:
        backend.close()


def test_a_bad_gpus_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus: [{memory_mib: -1}]\n")
    with pytest.raises(ConfigError, match=str(path)):
        open_backend(gpus_file=path)


def test_missing_nvml_bindings_are_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin used to let the ImportError escape (a crash whatever
    ``fail_on_init_error`` said); only the agent turned it into "no GPUs"."""
    monkeypatch.delitem(sys.modules, "plugin.gpu.nvml", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(GpuBackendError, match=r"cannot load the NVML bindings \(nvidia-ml-py\)"):
        open_backend(gpus_file=None)
