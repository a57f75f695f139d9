"""Configuration of the device plugin and the node agent: one versioned pydantic model.

Loaded by :func:`plugin.api.settings.load_config` with env prefix
:data:`ENV_PREFIX` (flags > env > file > defaults). ``version`` is required to
be ``v1`` so a future incompatible format fails loudly instead of being half
understood (NVIDIA's ``api/config/v1`` rejects unknown versions the same way).

The device plugin and the agent run as two containers of one DaemonSet pod and
read the same file, so resource names and units per GPU cannot disagree
between them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field, field_validator

from plugin.api.agent_config import AgentConfig
from plugin.api.resources import (
    DEFAULT_RESOURCE_NAME,
    DEFAULT_UNITS_PER_GPU,
    MAX_UNITS_PER_GPU,
    ResourceName,
)
from plugin.api.settings import StrictModel

ENV_PREFIX: Final = "METAGPU_PLUGIN_"
"""``METAGPU_PLUGIN_UNITS_PER_GPU``, ``METAGPU_PLUGIN_HEALTH__RECOVERY_S``, ..."""

DEFAULT_DEVICE_PLUGINS_DIR: Final = Path("/var/lib/kubelet/device-plugins")

AllocationPolicy = Literal["binpack", "spread"]
DeviceIdStrategy = Literal["uuid", "index"]
DeviceListStrategy = Literal["envvar", "volume-mounts"]


class ResourceConfig(StrictModel):
    """One advertised resource and the GPUs behind it."""

    name: str = DEFAULT_RESOURCE_NAME
    """Extended resource name, ``<domain>/<name>`` (name part at most 63 characters)."""

    gpus: Literal["all"] | list[int | str] = "all"
    """Which GPUs back this resource: ``all``, or a list of indices and/or UUIDs.
    Lets one node expose e.g. ``cnvrg.io/metagpu`` and ``cnvrg.io/metagpu-a100``."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return str(ResourceName(value))


class PluginConfig(StrictModel):
    """Everything the device plugin (and, under ``agent``, the node agent) can be told."""

    version: Literal["v1"] = "v1"
    """Config format version; only ``v1`` exists."""

    units_per_gpu: int = Field(default=DEFAULT_UNITS_PER_GPU, ge=1, le=MAX_UNITS_PER_GPU)
    """Meta-devices per GPU. Must equal the webhook's ``units_per_gpu``."""

    resources: list[ResourceConfig] = Field(default_factory=lambda: [ResourceConfig()])
    """Advertised resources; each GPU may back at most one."""

    agent: AgentConfig = Field(default_factory=AgentConfig)
    """Node agent settings (``metagpu agent``)."""
