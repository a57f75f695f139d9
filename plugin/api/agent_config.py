"""Configuration of the node agent (``metagpu agent``): the ``agent:`` section of the plugin config.

The agent reads the same file as the device plugin (resource names and units
must agree), so its settings are one section of
:class:`plugin.api.config.PluginConfig`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from plugin.api.resources import CONTAINER_AGENT_DIR
from plugin.api.settings import StrictModel


class AgentConfig(StrictModel):
    """Node agent settings. Every field documents its unit and why its default is what it is."""

    socket_dir: Path = Field(default=Path(CONTAINER_AGENT_DIR))
    """Host directory holding ``agent.sock`` and the ``mgctl`` program. The device
    plugin mounts it read-only at the same path into every metagpu container."""

