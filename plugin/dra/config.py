"""The DRA kubelet plugin's configuration (``metagpu dra-plugin``): validated once at start.

Pydantic and the shared words only, so building the CLI parser and ``--print-config``
never load gRPC. The request policies are checked here against the rules the
kube-apiserver v1.36 enforces on a ResourceSlice (the texts captured in
``../shared/fixtures/dra/resourceslice-consumable-variants.json``), so an operator's bad
policy is a start-up error naming the field, not a 422 on every publish.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from plugin.api.config import HealthConfig, MpsConfig
from plugin.api.limits import Policy
from plugin.api.resources import CONTAINER_AGENT_DIR, DRA_DRIVER
from plugin.api.settings import StrictModel

ENV_PREFIX: Final = "METAGPU_DRA_"
CONFIG_FILE_ENV: Final = "METAGPU_DRA_CONFIG"

DEFAULT_DRIVER: Final = DRA_DRIVER
"""The driver name the fixtures were captured with; DeviceClasses select on it."""

_CDI_ID = re.compile(
    r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
    r"=[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"
)
"""``vendor/class=name`` as the CDI parser accepts them (``pkg/parser``)."""
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class UnitsPolicy(StrictModel):
    """``requestPolicy`` of the ``units`` capacity (100 per GPU by default)."""

    default: int = Field(default=1, ge=1)
    """Units charged to a claim that asks only for memory. 1, as captured: a memory-sized
    claim then holds the smallest compute share; the webhook's DRA mode will request units
    explicitly."""
    min: int = Field(default=1, ge=1)
    step: int = Field(default=1, ge=1)
    """Requests round up to a multiple of this (the scheduler does it)."""


class MemoryPolicy(StrictModel):
    """``requestPolicy`` of the ``memory`` capacity, in MiB; the maximum is the GPU's memory."""

    default_mib: int = Field(default=1024, ge=1)
    """Memory charged to a claim that asks only for units: 1Gi, as captured. It is also that
    share's memory limit, so a units-only claim gets 1Gi; request memory too (item 2)."""
    min_mib: int = Field(default=1024, ge=1)
    step_mib: int = Field(default=1024, ge=1)
    """1Gi: a 1500Mi request is charged (and limited to) 2Gi, as captured."""


class DraConfig(StrictModel):
    """Everything ``metagpu dra-plugin`` reads: flags > env (``METAGPU_DRA_*``) > file."""

    version: Literal["v1"] = "v1"
    driver_name: str = Field(default=DEFAULT_DRIVER, max_length=63)
    """The DRA driver name: a DNS subdomain the slices, claims and CDI kind carry."""
    node_name: str | None = None
    """This node (the chart sets ``NODE_NAME`` from the downward API); required to serve."""
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    """The driver's socket is ``<plugins_dir>/<driver>/dra.sock`` (the captured endpoint)."""
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    """The kubelet watches this directory for ``<driver>-reg.sock``."""
    cdi_dir: Path = Path("/var/run/cdi")
    """Where the runtime (containerd >= 1.7 with CDI on, CRI-O) reads CDI specs."""
    gpus_file: Path | None = None
    """Simulated GPUs (YAML) instead of NVML, as ``device-plugin --gpus-file``."""
    units_per_gpu: int = Field(default=100, ge=1, le=100_000)
    """The ``units`` capacity of each GPU; 100 makes a unit one percent, as the device plugin."""
    units: UnitsPolicy = Field(default_factory=UnitsPolicy)
    memory: MemoryPolicy = Field(default_factory=MemoryPolicy)
    compute_policy: Policy = "fixed"
    """``fixed`` caps each share's SMs at its units (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE);
    ``balance``/``none`` set no cap (:mod:`plugin.api.limits`)."""
    extra_cdi_device: str | None = None
    """A second CDI device to name beside each share's, e.g. ``nvidia.com/gpu={uuid}``
    (``{uuid}``, ``{index}`` and ``{minor}`` are the GPU's): NVIDIA's spec from
    ``nvidia-ctk cdi generate`` (device names by ``--device-name-strategy``) brings the
    driver libraries, which ours does not. None: our spec only."""
    agent_socket_dir: Path | None = Path(CONTAINER_AGENT_DIR)
    """The node agent's socket directory on the host (the agent's ``socket_dir``): mounted
    read-only at ``/var/run/metagpu`` in every share's container with
    ``METAGPU_AGENT_SOCKET``, so ``mgctl`` there finds the agent, as in device-plugin
    containers. None: no mount (no agent on the node)."""
    health: HealthConfig = Field(default_factory=HealthConfig)
    mps: MpsConfig = Field(default_factory=MpsConfig)
    """CUDA MPS, the device plugin's section with the same keys and meaning (one model):
    ``enabled`` adds the pipe directory (and ``/dev/shm``) to every share's CDI spec,
    ``supervise`` runs the control daemon and withdraws its GPUs while it is down."""
    runtime_check: Literal["enforce", "warn", "off"] = "enforce"
    """Read the node's container runtime at start (:mod:`plugin.dra.cdi_runtime`).
    ``enforce``: a runtime known to lack CDI gets no GPUs offered (pods would run
    without their GPU); ``warn``: log it and offer them anyway; ``off``: do not look."""
    api_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """Per API request (read a claim, publish the slice)."""
    prepare_timeout_s: float = Field(default=30.0, gt=0, le=300)
    """Whole NodePrepareResources call; a claim not done by then gets an error entry."""
    grace_s: float = Field(default=2.0, ge=0, le=30)
    """gRPC stop grace: in-flight prepares finish, well under terminationGracePeriodSeconds."""

    @field_validator("driver_name")
    @classmethod
    def _dns(cls, value: str) -> str:
        if not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"must be a DNS subdomain (lower case, dots): {value!r}")
        return value

    @field_validator("extra_cdi_device")
    @classmethod
    def _cdi_template(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            example = value.format(uuid="GPU-0", index=0, minor=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"only {{uuid}}, {{index}} and {{minor}} may be used: {value!r}"
            ) from exc
        if not _CDI_ID.match(example):
            raise ValueError(f"not a CDI device ID (vendor/class=name): {value!r}")
        return value

    @model_validator(mode="after")
    def _policies(self) -> DraConfig:
        u = self.units
        if u.min > self.units_per_gpu:
            raise ValueError(f"units.min {u.min} is above units_per_gpu {self.units_per_gpu}")
        if u.default < u.min:
            # the API server's own wording: "default is less than min: N"
            raise ValueError(f"units.default is less than min: {u.default} < {u.min}")
        if u.default > self.units_per_gpu:
            raise ValueError(f"units.default {u.default} is above units_per_gpu")
        m = self.memory
        if m.default_mib < m.min_mib:
            raise ValueError(f"memory.default_mib is less than min: {m.default_mib} < {m.min_mib}")
        return self

    @property
    def socket_path(self) -> Path:
        return self.plugins_dir / self.driver_name / "dra.sock"

    @property
    def registration_socket_path(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"
