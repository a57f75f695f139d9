"""Configuration of the device plugin and the node agent: one versioned pydantic model.

Loaded by :func:`plugin.api.settings.load_config` with env prefix
:data:`ENV_PREFIX` (flags > env > file > defaults). ``version`` is required to
be ``v1`` so a future incompatible format fails loudly instead of being half
understood (NVIDIA's ``api/config/v1`` rejects unknown versions the same way).

The device plugin and the agent run in two DaemonSets (only the agent's pods
get the host PID namespace) and read the same file, so resource names, units
per GPU and the agent socket directory cannot disagree between them.

The field names below are a contract with the Helm chart (``values.yaml``
renders this file) and with ``docs/device-plugin.md``; rename nothing without
changing both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

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

CONFIG_FILE_ENV: Final = "METAGPU_PLUGIN_CONFIG_FILE"
"""Where ``--config`` defaults from, for the device plugin and the agent alike
(they read one file)."""

DEFAULT_DEVICE_PLUGINS_DIR: Final = Path("/var/lib/kubelet/device-plugins")
"""Where the kubelet serves ``kubelet.sock`` and looks for plugin sockets."""

DEFAULT_IGNORED_XIDS: Final = (13, 31, 43, 45, 68, 109)
"""XIDs that are the application's fault, not the GPU's (NVIDIA ``health.go``):

* 13 Graphics Engine Exception: an illegal instruction or address in a kernel;
* 31 GPU memory page fault: the application touched memory it does not own;
* 43 GPU stopped processing: a kernel was killed (e.g. by a watchdog or ^C);
* 45 Preemptive cleanup: the driver cleaned up after a process that exited;
* 68 Video processor exception: a bad stream fed to NVDEC/NVENC;
* 109 Context switch timeout: a kernel ran too long without yielding.

The next pod on the same GPU does not inherit any of them, so they must not
take all of a GPU's meta-devices out of service."""

DEFAULT_MPS_PIPE_DIRECTORY: Final = Path("/tmp/nvidia-mps")
"""The MPS control daemon's default ``CUDA_MPS_PIPE_DIRECTORY``."""

AllocationPolicy = Literal["binpack", "spread"]
DeviceIdStrategy = Literal["uuid", "index"]
DeviceListStrategy = Literal["envvar", "volume-mounts"]


def selector_key(selector: int | str) -> int | str:
    """What a ``resources[].gpus`` entry names: an index (an int, or a string of
    digits because env vars are strings) or a UUID (compared case-insensitively).

    ``0`` and ``"0"`` are the same GPU, and so are ``GPU-AB`` and ``gpu-ab``;
    the config's duplicate checks and :func:`plugin.placement.devices.select_gpus` both
    compare selectors through this."""
    if isinstance(selector, int):
        return selector
    if selector.isascii() and selector.isdigit():
        return int(selector)
    return selector.strip().lower()


class ResourceConfig(StrictModel):
    """One advertised resource and the GPUs behind it."""

    name: str = DEFAULT_RESOURCE_NAME
    """Extended resource name, ``<domain>/<name>`` (name part at most 63 characters)."""

    gpus: Literal["all"] | list[int | str] = "all"
    """Which GPUs back this resource: ``all``, or a list of indices and/or UUIDs.
    Lets one node expose e.g. ``cnvrg.io/metagpu`` and ``cnvrg.io/metagpu-a100``.
    Entries that match no GPU on a node are logged and skipped: one config
    serves every node of a DaemonSet, and not every node has every GPU."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return str(ResourceName(value))

    @field_validator("gpus")
    @classmethod
    def _valid_selectors(cls, value: Literal["all"] | list[int | str]) -> object:
        if value == "all":
            return value
        if not value:
            raise ValueError("gpus must be 'all' or a non-empty list of indices and/or UUIDs")
        seen: dict[int | str, int | str] = {}
        for item in value:
            if isinstance(item, int) and item < 0:
                raise ValueError(f"GPU index must be >= 0: {item}")
            if isinstance(item, str) and not item.strip():
                raise ValueError(f"GPU UUID must not be empty: {item!r}")
            key = selector_key(item)  # 0 and "0", GPU-AB and gpu-ab are one GPU
            if key in seen:
                raise ValueError(f"GPU listed twice: as {seen[key]!r} and as {item!r}")
            seen[key] = item
        return value

    @property
    def socket_name(self) -> str:
        """The plugin's socket file in the device-plugins directory, e.g.
        ``metagpu-metagpu.sock``; unique per resource (checked by PluginConfig)."""
        return f"metagpu-{ResourceName(self.name).short_name}.sock"


class HealthConfig(StrictModel):
    """GPU health checking: which errors take a GPU out of service and for how long."""

    enabled: bool = True
    """Watch NVML for XID and double-bit ECC errors. Off (for drivers whose event
    API misbehaves): every GPU is advertised Healthy, except GPUs whose discovery
    failed; turning it off by SIGHUP heals GPUs that errors had made unhealthy."""

    ignored_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_IGNORED_XIDS))
    """XIDs that never mark a GPU unhealthy; replaces the default list (13, 31,
    43, 45, 68, 109: application errors, see ``DEFAULT_IGNORED_XIDS``)."""

    recovery_s: float = Field(default=300.0, gt=0)
    """Seconds a sick GPU must stay free of critical errors (and answer a probe)
    before its meta-devices are Healthy again. 5 minutes outlasts the burst of
    repeated XIDs a faulting GPU usually emits. NVIDIA has no recovery at all;
    set a very large value to get that behaviour."""

    event_timeout_s: float = Field(default=1.0, gt=0, le=60)
    """Longest single wait for an NVML event. Bounds how long stopping the
    health thread takes, and so the plugin's exit on SIGTERM. An event ends the
    wait at once whatever this is, so a short round costs only a wake-up per
    round (NVIDIA waits 5000 ms per round; with 5 s here, every rollout of the
    DaemonSet waited up to 5 s per node)."""

    liveness_interval_s: float = Field(default=10.0, ge=0, le=3600)
    """Seconds between liveness polls: one cheap NVML query (memory info) to every
    healthy GPU, so a GPU that falls off the bus without an XID event is withdrawn
    within this time instead of at the next rediscovery. Each poll takes
    microseconds. 0 turns polling off."""

    check_volatile_ecc: bool = True
    """Recovery requires no volatile uncorrectable ECC errors (counted since the
    driver loaded; a GPU reset clears them). Skipped on GPUs without ECC."""

    check_row_remap: bool = True
    """Recovery requires no pending row remap and no row-remap failure
    (``nvmlDeviceGetRemappedRows``; Ampere and later)."""

    check_retired_pages: bool = True
    """Recovery requires no retired pages pending (``nvmlDeviceGetRetiredPagesPendingStatus``;
    before Ampere)."""

    @field_validator("ignored_xids")
    @classmethod
    def _valid_xids(cls, value: list[int]) -> list[int]:
        bad = [x for x in value if x <= 0]
        if bad:
            raise ValueError(f"XIDs are positive integers: {bad}")
        return sorted(set(value))


class MpsConfig(StrictModel):
    """CUDA MPS: clients of one MPS control daemon per node share GPUs with hard memory limits.

    With ``supervise`` the plugin runs the daemon itself (:mod:`plugin.gpu.mps_supervisor`):
    the GPUs go to ``EXCLUSIVE_PROCESS``, the daemon is started, asked, restarted and
    quit by the plugin, and a GPU whose daemon is down is not offered. Without it the
    plugin only points containers at a daemon someone else runs (see
    docs/device-plugin.md, "MPS")."""

    enabled: bool = False
    """Give containers ``CUDA_MPS_PIPE_DIRECTORY``, the pipe mount and
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from their share of each GPU."""

    supervise: bool = False
    """Run and watch ``nvidia-cuda-mps-control -d`` from the plugin (needs ``enabled``):
    compute mode ``EXCLUSIVE_PROCESS`` on every served GPU (restored on stop), the
    daemon's defaults set, its answers checked every ``health_interval_s``, restarts
    with backoff, and the GPUs withdrawn (check ``mps``) while it does not answer.
    Off by default: it needs root and the NVIDIA runtime's ``compute,utility``
    capabilities in the plugin's container, and it changes the GPUs' compute mode."""

    pipe_directory: Path = DEFAULT_MPS_PIPE_DIRECTORY
    """Host directory of the MPS control daemon's pipes."""

    container_pipe_directory: Path = DEFAULT_MPS_PIPE_DIRECTORY
    """Where that directory is mounted in the container (and what
    ``CUDA_MPS_PIPE_DIRECTORY`` says)."""

    log_directory: Path | None = None
    """The daemon's ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``, ``server.log``);
    None: ``<pipe_directory>/log``. Never mounted into GPU containers."""

    shm_directory: Path | None = None
    """Host directory mounted at ``/dev/shm`` in every MPS client container, which
    must also be the daemon's ``/dev/shm`` (the chart mounts it in the plugin's
    container): MPS servers and clients exchange shared memory there, as NVIDIA's
    plugin arranges. None: no mount (the daemon and its clients already share
    ``/dev/shm``, e.g. all on the host)."""

    control_command: list[str] = Field(
        default_factory=lambda: ["nvidia-cuda-mps-control"], min_length=1
    )
    """The control program and any leading arguments. ``metagpu dev`` points it at the
    documented stand-in (``python -m plugin.gpu.mps_standin``) on simulated GPUs."""

    set_exclusive_process: bool = True
    """Put each GPU in ``EXCLUSIVE_PROCESS`` while the daemon serves it, so a process that
    ignores ``CUDA_MPS_PIPE_DIRECTORY`` cannot open a context of its own beside MPS. A
    GPU whose mode cannot be set is withdrawn (check ``mps``); false: leave the mode
    alone. The node still says ``metagpu.io/enforces=memory.fixed`` then, because no
    pod spec can leave MPS (the webhook refuses the variables and mounts), but a
    process that drops ``CUDA_MPS_PIPE_DIRECTORY`` from its own environment runs
    beside MPS without limits, as docs/mps.md says of rewritten environments."""

    health_interval_s: float = Field(default=5.0, gt=0, le=300)
    """Seconds between asks (``get_server_list``); a daemon that stops answering is
    noticed within one interval plus ``command_timeout_s``."""

    command_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """Bound of one control command (the front end connects, sends, reads, exits)."""

    start_timeout_s: float = Field(default=15.0, gt=0, le=300)
    """How long a fresh daemon may take to answer its first command."""

    restart_backoff_s: float = Field(default=1.0, gt=0, le=300)
    """First wait before restarting a daemon that died; doubles per failed start."""

    restart_backoff_max_s: float = Field(default=60.0, gt=0, le=3600)
    """Longest wait between restarts; a daemon that answers for this long resets it."""

    @field_validator("pipe_directory", "container_pipe_directory", "log_directory", "shm_directory")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"must be an absolute path: {str(value)!r}")
        return value

    @model_validator(mode="after")
    def _supervise_needs_enabled(self) -> MpsConfig:
        if self.supervise and not self.enabled:
            raise ValueError("mps.supervise needs mps.enabled: the daemon serves MPS clients")
        return self

    @property
    def effective_log_directory(self) -> Path:
        """``log_directory``, or ``<pipe_directory>/log``."""
        return self.log_directory or self.pipe_directory / "log"


class PlacementConfig(StrictModel):
    """GPU-aware scheduling: honouring the scheduler extender's assignments (issue 14).

    See docs/device-plugin.md, "Assignments from the scheduler extender"."""

    extender: bool = False
    """The cluster schedules metagpu pods through the scheduler extender
    (``metagpu-scheduler``); the chart sets it when it deploys that scheduler.
    With it, an allocation that would still split a fraction (a stale ledger)
    fails closed unless ``allow_split_fraction`` says otherwise."""

    honour_assignments: bool = True
    """Watch the pods bound to this node (``spec.nodeName``) and answer
    ``GetPreferredAllocation`` with the GPUs the extender assigned
    (``metagpu.io/assigned-gpus``). Needs ``pods`` list/watch and ``node_name``;
    without them (or off) the plugin places with ``allocation_policy`` alone."""

    node_name: str | None = Field(default=None, min_length=1, max_length=253)
    """This node's name, for the pod watch. The chart sets it from the downward
    API; the ``NODE_NAME`` env var is the fallback."""


class PluginConfig(StrictModel):
    """Everything the device plugin (and, under ``agent``, the node agent) can be told."""

    version: Literal["v1"] = "v1"
    """Config format version; only ``v1`` exists."""

    units_per_gpu: int = Field(default=DEFAULT_UNITS_PER_GPU, ge=1, le=MAX_UNITS_PER_GPU)
    """Meta-devices per GPU. Must equal the webhook's ``units_per_gpu``."""

    resources: list[ResourceConfig] = Field(default_factory=lambda: [ResourceConfig()])
    """Advertised resources; each GPU may back at most one."""

    allocation_policy: AllocationPolicy = "binpack"
    """How GetPreferredAllocation places a fraction: ``binpack`` on the fullest
    GPU that fits (keeps whole GPUs free for big requests), ``spread`` on the
    emptiest (less contention per GPU)."""

    allow_split_fraction: bool | None = None
    """Whether ``Allocate`` may give a container a fraction spread over two or
    more GPUs. The plugin always keeps a fraction on one GPU when any GPU can
    hold it; when none can, ``true`` allocates the split (logged), ``false``
    fails the allocation with a message naming the GPUs and units (the pod
    fails admission instead of running on two fragments; a controller
    recreates it), and unset (the default) means ``false`` when
    ``placement.extender`` is on and ``true`` otherwise: with the extender a
    split can only come from a stale ledger, without it refusing would fail
    every pod that lands on a fragmented node."""

    device_id_strategy: DeviceIdStrategy = "uuid"
    """How GPUs are named to the container runtime: ``uuid`` (stable across
    reboots and re-cabling) or ``index`` (NVML index, what older runtimes want)."""

    device_list_strategy: DeviceListStrategy = "envvar"
    """How the GPU list reaches the NVIDIA container runtime: ``envvar``
    (``NVIDIA_VISIBLE_DEVICES``) or ``volume-mounts`` (``/dev/null`` mounts under
    ``/var/run/nvidia-container-devices``, so unprivileged pods cannot pick
    GPUs with their own env var; needs ``accept-nvidia-visible-devices-as-volume-mounts``)."""

    device_plugins_dir: Path = DEFAULT_DEVICE_PLUGINS_DIR
    """The kubelet's device-plugins directory (``kubelet.sock`` and plugin sockets)."""

    gpus_file: Path | None = None
    """Simulated GPUs (YAML) instead of NVML; for ``metagpu dev`` and tests."""

    fail_on_init_error: bool = True
    """When the GPU driver cannot be initialised: exit with an error (true,
    visible as a crash-looping pod) or advertise nothing and wait (false, for
    mixed node pools where the DaemonSet also lands on GPU-less nodes)."""

    health: HealthConfig = Field(default_factory=HealthConfig)
    """GPU health checking and recovery."""

    mps: MpsConfig = Field(default_factory=MpsConfig)
    """CUDA MPS settings for containers."""

    agent: AgentConfig = Field(default_factory=AgentConfig)
    """Node agent settings (``metagpu agent``)."""

    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    """Honouring the scheduler extender's GPU assignments."""

    @property
    def refuses_split_fraction(self) -> bool:
        """``Allocate`` fails closed on a split fraction (``allow_split_fraction``)."""
        if self.allow_split_fraction is None:
            return self.placement.extender
        return not self.allow_split_fraction

    @model_validator(mode="after")
    def _resources_disjoint(self) -> PluginConfig:
        if not self.resources:
            raise ValueError("resources must name at least one resource")
        names = [r.name for r in self.resources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"resource names must be unique; repeated: {', '.join(dup)}")
        sockets: dict[str, str] = {}
        for r in self.resources:
            other = sockets.setdefault(r.socket_name, r.name)
            if other != r.name:
                raise ValueError(
                    f"resources {other} and {r.name} have the same name part, so their "
                    f"sockets would collide ({r.socket_name}); rename one"
                )
        if len(self.resources) > 1:
            alls = [r.name for r in self.resources if r.gpus == "all"]
            if alls:
                raise ValueError(
                    f"resource {alls[0]} takes gpus: all, so no other resource can have a "
                    "GPU (a GPU may back at most one resource); list indices or UUIDs instead"
                )
            owner: dict[int | str, tuple[str, int | str]] = {}
            for r in self.resources:
                if r.gpus == "all":  # excluded above; narrows the type
                    continue
                for item in r.gpus:
                    first, as_item = owner.setdefault(selector_key(item), (r.name, item))
                    if first != r.name:
                        raise ValueError(
                            f"GPU {item!r} is listed under both {first} (as {as_item!r}) "
                            f"and {r.name}; a GPU may back at most one resource"
                        )
        return self
