"""How the DRA plugin names its CDI devices and spec files (pure, standard library only).

The contract between the DRA kubelet plugin, which writes one CDI spec per prepared
share (:mod:`plugin.dra.cdi`), and the node agent, which reads them back to learn what
share a container holds (:mod:`plugin.agent.dra_shares`). The agent may not import the
DRA plugin, so the names both depend on live here, once.
"""

from __future__ import annotations

from typing import Final

CDI_CLASS: Final = "gpu"
"""The CDI class of every device: IDs are ``<driver>/gpu=<name>``."""


def cdi_kind(driver: str) -> str:
    """``gpu.metagpu.io/gpu``: the driver name is the CDI vendor."""
    return f"{driver}/{CDI_CLASS}"


def driver_spec_prefix(driver: str) -> str:
    """Every spec file the driver writes starts with this: ``<driver>-gpu_``."""
    return f"{driver}-{CDI_CLASS}_"
