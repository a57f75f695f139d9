"""Whether a namespace's quotas count metagpu units, and the warning when they do not (pure).

The admission side of the quota mirror: the webhook cannot stop a pod that
a GPU quota no longer counts (quota admission is the API server's), but it
can say so at the moment it converts one, so a platform team learns that a
namespace's GPU budget does not hold before the bill does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from plugin.api.resources import NVIDIA_GPU_RESOURCE
from webhook.quotas.mirror import GPU_KEYS, MirrorSettings, Obj, hard_of

QuotaKind = Literal["gpus", "units", "both"]
"""What one quota limits: whole GPUs, the metagpu resource, or both."""

MAX_NAMES_SHOWN: Final = 3


def kind_of(quota: Obj, settings: MirrorSettings) -> QuotaKind | None:
    """What ``quota`` limits of interest here, or None (it is not kept in the cache)."""
    keys = hard_of(quota).keys()
    gpus = any(k in GPU_KEYS for k in keys)
    units = any(settings.names_resource(k) for k in keys)
    if gpus and units:
        return "both"
    if gpus:
        return "gpus"
    if units:
        return "units"
    return None


@dataclass(frozen=True)
class NamespaceQuotas:
    """The quotas of one namespace that limit GPUs or units, by name."""

    kinds: dict[str, QuotaKind]

    def unmirrored(self) -> list[str]:
        """The GPU quotas, when no quota of the namespace limits the metagpu resource."""
        if any(k in ("units", "both") for k in self.kinds.values()):
            return []
        return sorted(n for n, k in self.kinds.items() if k == "gpus")


def unmirrored_warning(namespace: str, quotas: Iterable[str], settings: MirrorSettings) -> str:
    """What the AdmissionResponse says when GPU quotas do not count units."""
    names = list(quotas)
    shown = ", ".join(f'"{n}"' for n in names[:MAX_NAMES_SHOWN])
    if len(names) > MAX_NAMES_SHOWN:
        shown += f" and {len(names) - MAX_NAMES_SHOWN} more"
    resource = settings.resource_name
    return (
        f'namespace "{namespace}" limits {NVIDIA_GPU_RESOURCE} (ResourceQuota {shown}) but no '
        f"ResourceQuota there limits {resource}, so the {resource} units asked for here are "
        "not counted against that GPU budget. Turn on the metagpu quota mirror (Helm value "
        "quotaMirror.enabled) to keep a companion quota in units, or add "
        f"requests.{resource} ({settings.units_per_gpu} per GPU) to a quota yourself; "
        "see docs/quotas.md"
    )
