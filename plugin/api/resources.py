"""The resource contract shared by the webhook, the device plugin and the node agent.

The webhook normalises requests *into* this contract and the plugin serves it,
so both must agree on every name here. The module lives in ``plugin.api``
because the plugin owns the resource it advertises. It imports only the
standard library, so ``import plugin.api.resources`` never loads gRPC or NVML.

The names follow NVIDIA's ``api/config/v1`` (``resources.go``, ``consts.go``):
a resource name is ``<domain>/<name>``, and its name part is at most 63
characters, as the kubelet requires.
"""

from __future__ import annotations

import re
from typing import Final, NewType

# --------------------------------------------------------------------- units
DEFAULT_RESOURCE_NAME: Final = "cnvrg.io/metagpu"
"""The extended resource the plugin advertises and the webhook writes.

It is cnvrg's name, so pods written for the original MetaGPU keep working."""

DEFAULT_UNITS_PER_GPU: Final = 100
"""Meta-devices per physical GPU. 100 makes one unit one percent of a GPU."""

MAX_UNITS_PER_GPU: Final = 1000
"""Upper bound for ``units_per_gpu``.

Every unit is a device in every ListAndWatch message and in the kubelet's
checkpoint; 1000 per GPU on a 16-GPU node is 16,000 devices, which the
benchmark in ``tests/benchmarks/allocator.py`` shows is still cheap. Beyond
that, 0.1% of a GPU buys nothing a scheduler could use."""

NVIDIA_GPU_RESOURCE: Final = "nvidia.com/gpu"
"""NVIDIA's whole-GPU resource. Users write fractions here out of habit."""

CNVRG_GPU_RESOURCE: Final = "cnvrg.io/gpu"
"""A fraction-only resource name: any value here is a share of one GPU."""

# --------------------------------------------------------- annotations/labels
LABEL_INJECT: Final = "metagpu.io/inject"
"""Label on a pod or namespace; ``"false"`` opts out of every mutation."""

ANNOTATION_COMPUTE_POLICY: Final = "metagpu.io/compute-policy"
"""Annotation on a pod or namespace: ``fixed``, ``balance`` or ``none``."""

ANNOTATION_ORIGINAL_REQUEST: Final = "metagpu.io/original-request"
"""Annotation the webhook writes: what each container asked for before conversion."""

COMPUTE_POLICIES: Final = ("fixed", "balance", "none")

NODE_LABEL_PREFIX: Final = "metagpu.io/"
NODE_LABEL_GPU_PRODUCT: Final = "metagpu.io/gpu-product"
NODE_LABEL_GPU_COUNT: Final = "metagpu.io/gpu-count"
NODE_LABEL_GPU_MEMORY_MIB: Final = "metagpu.io/gpu-memory-mib"
NODE_LABEL_UNITS_PER_GPU: Final = "metagpu.io/units-per-gpu"
NODE_LABEL_LARGEST_FREE_UNITS: Final = "metagpu.io/largest-free-units"
NODE_LABEL_ENFORCES: Final = "metagpu.io/enforces"
"""What the node holds every container it admits to, at allocation: ``memory.fixed``
(a supervised MPS daemon: memory share and the ``fixed`` SM cap) or empty (nothing:
limits are advice, the agent's memory enforcement acts after the fact). Joined with
``.`` because a label value cannot hold a comma."""
ENFORCES_SEPARATOR: Final = "."

# ------------------------------------------------------ container environment
ENV_NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
ENV_COMPUTE_POLICY: Final = "METAGPU_COMPUTE_POLICY"
ENV_MPS_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_UNITS: Final = "METAGPU_UNITS"
ENV_GPU_FRACTION: Final = "METAGPU_GPU_FRACTION"
ENV_MEMORY_LIMIT_MB: Final = "METAGPU_MEMORY_LIMIT_MB"
ENV_DEVICE_IDS: Final = "METAGPU_DEVICE_IDS"
ENV_MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_PINNED_DEVICE_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
VISIBLE_DEVICES_VOID: Final = "void"
"""``NVIDIA_VISIBLE_DEVICES=void`` makes the NVIDIA runtime expose no GPU."""

# ------------------------------------------------------------- agent socket
AGENT_SOCKET_NAME: Final = "agent.sock"
"""The node agent's unix socket, inside the agent socket directory."""

MGCTL_FILE_NAME: Final = "mgctl"
"""The agent installs the stdlib-only ``mgctl`` program next to its socket."""

CONTAINER_AGENT_DIR: Final = "/var/run/metagpu"
"""Where the device plugin mounts the agent socket directory (read-only) in
every metagpu container, so ``mgctl`` finds the agent without configuration."""

ENV_AGENT_SOCKET: Final = "METAGPU_AGENT_SOCKET"
"""Set in every metagpu container to ``CONTAINER_AGENT_DIR/AGENT_SOCKET_NAME``."""

# ---------------------------------------------------------------- DNS names
DNS_LABEL_MAX_LEN: Final = 63
DNS_SUBDOMAIN_MAX_LEN: Final = 253

# Always with fullmatch: with match, a "$" also matches before a final "\n", so
# "metagpu-webhook-tls\n" (a YAML block scalar, a file read into an env var)
# would pass. re.ASCII keeps Unicode letters and digits out.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)


def is_dns_label(value: str) -> bool:
    """An RFC 1123 label as Kubernetes checks it (``IsDNS1123Label``): at most 63
    lower-case letters, digits or '-', starting and ending with a letter or digit.

    Namespaces and Service names are labels.
    """
    return len(value) <= DNS_LABEL_MAX_LEN and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """An RFC 1123 subdomain as Kubernetes checks it (``IsDNS1123Subdomain``): labels
    of lower-case letters, digits and '-' joined by '.', at most 253 characters.

    Secrets, RuntimeClasses, webhook configurations and resource domains are
    subdomains.
    """
    return len(value) <= DNS_SUBDOMAIN_MAX_LEN and _DNS_SUBDOMAIN.fullmatch(value) is not None


# ------------------------------------------------------------ resource names
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", re.ASCII)
RESOURCE_NAME_MAX_LEN: Final = 63
_UNIT = re.compile(r"0|[1-9][0-9]*")  # ASCII only: str.isdigit() accepts "²"


class ResourceNameError(ValueError):
    """A resource name that the kubelet would refuse."""


class ResourceName(str):
    """An extended resource name, ``<domain>/<name>``, checked once on construction.

    Checking in the constructor means a config that names a bad resource fails
    at start-up with the offending value, not when the kubelet refuses to
    register the plugin.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> ResourceName:
        domain, sep, name = value.partition("/")
        if not sep or not domain or not name:
            raise ResourceNameError(
                f"resource name must be <domain>/<name>, e.g. {DEFAULT_RESOURCE_NAME}: {value!r}"
            )
        if not is_dns_subdomain(domain) or "." not in domain:
            raise ResourceNameError(
                f"resource domain must be a DNS subdomain with a dot, e.g. cnvrg.io: {value!r}"
            )
        if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
            raise ResourceNameError(
                f"resource domain kubernetes.io is reserved for Kubernetes: {value!r}"
            )
        if len(name) > RESOURCE_NAME_MAX_LEN:
            raise ResourceNameError(
                f"resource name part must be {RESOURCE_NAME_MAX_LEN} characters or less: {value!r}"
            )
        if not _NAME.fullmatch(name):
            raise ResourceNameError(
                "resource name part must be alphanumeric, '-', '_' or '.', "
                f"starting and ending alphanumeric: {value!r}"
            )
        return super().__new__(cls, value)

    @property
    def domain(self) -> str:
        """The part before the slash (``cnvrg.io``)."""
        return self.partition("/")[0]

    @property
    def short_name(self) -> str:
        """The part after the slash (``metagpu``); used to name the plugin socket."""
        return self.partition("/")[2]


# ------------------------------------------------------------------- devices
DeviceId = NewType("DeviceId", str)
"""How the plugin names a physical GPU to the runtime: its UUID or its index
(``device_id_strategy``). This is what goes into ``NVIDIA_VISIBLE_DEVICES``."""

ReplicaId = NewType("ReplicaId", str)
"""A meta-device ID as advertised to the kubelet: ``<DeviceId>::<unit>``."""

REPLICA_SEPARATOR: Final = "::"
"""NVIDIA's ``AnnotatedID`` separator. ``::`` never occurs in a GPU UUID,
MIG UUID or index, so parsing is unambiguous."""


class ReplicaIdError(ValueError):
    """A meta-device ID that is not ``<DeviceId>::<unit>``."""


def format_replica_id(device: DeviceId, unit: int) -> ReplicaId:
    """Name the ``unit``-th meta-device of ``device``.

    Stable across restarts (it depends only on the GPU and the unit number), so
    the kubelet's checkpointed assignments stay valid when the plugin restarts.
    """
    if unit < 0:
        raise ReplicaIdError(f"unit number must be >= 0: {unit}")
    rid = f"{device}{REPLICA_SEPARATOR}{unit}"
    if len(rid) > RESOURCE_NAME_MAX_LEN:
        raise ReplicaIdError(
            f"meta-device ID must be {RESOURCE_NAME_MAX_LEN} characters or less: {rid!r}"
        )
    return ReplicaId(rid)


def parse_replica_id(value: str) -> tuple[DeviceId, int]:
    """Split a meta-device ID into its GPU and unit number; the inverse of
    :func:`format_replica_id`."""
    device, sep, unit = value.rpartition(REPLICA_SEPARATOR)
    if not sep or not device or not _UNIT.fullmatch(unit):
        raise ReplicaIdError(f"meta-device ID must be <gpu>{REPLICA_SEPARATOR}<n>: {value!r}")
    return DeviceId(device), int(unit)


# ----------------------------------------------------------------------- DRA
DRA_DRIVER: Final = "gpu.metagpu.io"
"""The DRA driver's name (the fixtures were captured with it): the ResourceSlices'
``spec.driver``, the allocation results' ``driver``, the CDI vendor, and the default
DeviceClass name, which selects on it."""

DRA_UNITS: Final = "units"
"""The consumable capacity a share asks its GPU for in units (100 per GPU)."""

DRA_MEMORY: Final = "memory"
"""The consumable capacity a share asks its GPU for in bytes of memory."""
