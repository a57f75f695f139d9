"""Opening the GPU backend a node is configured for: simulated GPUs or NVML.

One function for the device plugin and the node agent, which differ only in
what they do when it fails: the plugin crashes or degrades per
``fail_on_init_error`` (:mod:`plugin.deviceplugin.supervisor`), the agent always degrades
to an empty node (:mod:`plugin.agent.gpus`).

Both backends are imported inside the branch that uses them, so a simulated
node never loads ``pynvml`` and an NVML node never parses a GPUs file. Kept
apart from :mod:`plugin.gpu.backend` because that module is the pure port, which
must not even mention :mod:`plugin.gpu.nvml`.
"""

from __future__ import annotations

from pathlib import Path

from plugin.gpu.backend import GpuBackend, GpuBackendError


def open_backend(*, gpus_file: Path | None) -> GpuBackend:
    """Simulated GPUs from ``gpus_file`` when set, else the NVIDIA driver. Blocking.

    Raises :class:`~plugin.api.settings.ConfigError` for a bad GPUs file (the
    operator's typo, not a missing driver) and :class:`GpuBackendError` when
    NVML cannot start, including when its Python bindings are missing."""
    if gpus_file is not None:
        from plugin.gpu.simulated import SimulatedGpus  # noqa: PLC0415

        return SimulatedGpus.from_file(gpus_file)
    try:
        from plugin.gpu.nvml import open_nvml  # noqa: PLC0415
    except ImportError as exc:  # nvidia-ml-py missing from the image
        raise GpuBackendError(f"cannot load the NVML bindings (nvidia-ml-py): {exc}") from exc
    return open_nvml()
