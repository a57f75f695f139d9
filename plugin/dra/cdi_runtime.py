"""Can this node's container runtime apply CDI specs? A verdict from the version the
kubelet reports in ``Node.status.nodeInfo.containerRuntimeVersion`` (pure).

DRA mode hands devices to containers only through CDI device IDs. A runtime without CDI
ignores them and starts the container anyway: captured with containerd 1.6.20, whose
OCI spec had no device, no environment and no CDI annotation
(``../shared/fixtures/dra/containerd-1.6-oci-spec-with-cdi-ids.json``). A pod would then
run on "its" GPU share without the GPU, and nothing would say so. So a node whose
runtime cannot do CDI offers no GPUs (the plugin withdraws them all, with this reason)
rather than let pods land there.

* containerd < 1.7: no CDI support (**unsupported**);
* containerd 1.7.x: supports CDI, off unless ``enable_cdi = true`` in its CRI config,
  which a plugin cannot read (**unknown**, warned);
* containerd >= 2.0: CDI on by default (**supported**);
* CRI-O >= 1.23: supported (CRI-O has read ``/etc/cdi`` and ``/var/run/cdi`` since
  1.23); older: unsupported;
* anything else (cri-dockerd, an unparsable version): unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Support = Literal["supported", "unsupported", "unknown"]

_VERSION = re.compile(r"^(?P<name>[a-z-]+)://v?(?P<major>\d+)\.(?P<minor>\d+)")


@dataclass(frozen=True)
class CdiVerdict:
    support: Support
    reason: str
    """For the log and, when unsupported, the reason every GPU is withdrawn."""


def cdi_verdict(runtime_version: str | None) -> CdiVerdict:
    """The verdict for a ``containerRuntimeVersion`` such as ``containerd://1.6.20``."""
    if not runtime_version:
        return CdiVerdict("unknown", "the node does not report its container runtime")
    match = _VERSION.match(runtime_version.strip())
    if match is None:
        return CdiVerdict("unknown", f"unrecognised container runtime {runtime_version!r}")
    name, version = match["name"], (int(match["major"]), int(match["minor"]))
    if name == "containerd":
        if version < (1, 7):
            return CdiVerdict(
                "unsupported",
                f"container runtime {runtime_version} has no CDI support: containers would "
                "start without their GPU (containerd >= 1.7 with enable_cdi, or 2.x, needed)",
            )
        if version < (2, 0):
            return CdiVerdict(
                "unknown",
                f"container runtime {runtime_version} applies CDI devices only with "
                "enable_cdi = true in its CRI plugin config; make sure it is set",
            )
        return CdiVerdict("supported", f"container runtime {runtime_version} applies CDI")
    if name == "cri-o":
        if version < (1, 23):
            return CdiVerdict(
                "unsupported",
                f"container runtime {runtime_version} has no CDI support (CRI-O >= 1.23 needed)",
            )
        return CdiVerdict("supported", f"container runtime {runtime_version} applies CDI")
    return CdiVerdict(
        "unknown", f"container runtime {runtime_version}: CDI support is not known to metagpu"
    )
