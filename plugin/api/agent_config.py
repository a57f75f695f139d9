"""Configuration of the node agent (``metagpu agent``): the ``agent:`` section of the plugin config.

The agent reads the same file as the device plugin (resource names and units
must agree), so its settings are one section of
:class:`plugin.api.config.PluginConfig`. Env vars follow the plugin's prefix:
``METAGPU_PLUGIN_AGENT__INTERVAL_S=2``. This module is a contract with the Helm
chart (``agent.*`` values) and with ``docs/agent.md``: add fields, never rename.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, Literal

from pydantic import Field, field_validator

from plugin.api.resources import CONTAINER_AGENT_DIR, DRA_DRIVER
from plugin.api.settings import StrictModel, split_listen

MemoryEnforcement = Literal["off", "report", "kill"]
MEMORY_ENFORCEMENT_MODES: Final = ("off", "report", "kill")

DEFAULT_POD_RESOURCES_SOCKET: Final = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_METRICS_PORT: Final = 9400


DEFAULT_METRICS_LISTEN: Final = f"0.0.0.0:{DEFAULT_METRICS_PORT}"
"""Every interface: Prometheus scrapes the agent from another node."""

DEFAULT_CDI_DIR: Final = Path("/var/run/cdi")
"""Where the DRA plugin writes its CDI specs (its ``cdi_dir`` default, and the
directory containerd and CRI-O read CDI specs from by default)."""

_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


class AgentConfig(StrictModel):
    """Node agent settings. Every field documents its unit and why its default is what it is."""

    socket_dir: Path = Field(default=Path(CONTAINER_AGENT_DIR))
    """Host directory holding ``agent.sock`` and the ``mgctl`` program. The device
    plugin mounts it read-only at the same path into every metagpu container."""

    node_name: str | None = Field(default=None, min_length=1, max_length=253)
    """This node's name, for the pod watch (``spec.nodeName``), the Node labels and
    the Events' reporting instance. The chart sets it from the downward API
    (``spec.nodeName``); ``--node-name`` and the ``NODE_NAME`` env var also work.
    Unset: the agent runs without the Kubernetes API (no pod names, labels or
    Events) and only host callers can use ``mgctl``."""

    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    """The kubelet PodResources API socket: the source of truth for which container
    holds which meta-devices. The kubelet's default path; mount its directory
    from the host."""

    pod_resources_timeout_s: float = Field(default=5.0, gt=0, le=60)
    """Seconds one ``List`` call may take. The kubelet answers from memory in
    milliseconds; 5 s is long enough for a loaded node and short enough that a
    wedged kubelet delays a cycle rather than stopping it."""

    interval_s: float = Field(default=5.0, ge=0.1, le=300)
    """Seconds between accounting cycles (GPU readings, enforcement, metrics,
    labels). 5 s matches a typical Prometheus scrape interval and bounds how stale
    ``mgctl`` output can be; each cycle costs a few milliseconds."""

    memory_enforcement: MemoryEnforcement = "report"
    """What to do when a container uses more GPU memory than its share allows
    (``units / units_per_gpu × GPU memory``): ``off`` (only metrics), ``report``
    (also a log line, a Warning Event on the pod and a metric), ``kill`` (report,
    then SIGKILL the container's processes on that GPU once the overrun has lasted
    ``kill_grace_s``). ``report`` by default: killing is a decision for the operator."""

    kill_grace_s: float = Field(default=30.0, ge=0, le=3600)
    """Seconds an overrun must persist before ``kill`` acts. Frameworks allocate in
    bursts and free caches; 30 s (six cycles) ignores a spike and still stops a
    runaway job long before it starves its neighbours for long."""

    report_cooldown_s: float = Field(default=600.0, ge=0, le=86400)
    """Seconds after an overrun's Warning Event during which a new overrun of the same
    container on the same GPU is only counted (metric, DEBUG log), not reported again.
    A job swinging around its limit would otherwise write an Event every other cycle;
    10 minutes keeps ``kubectl describe pod`` readable and still re-alerts on a job
    that keeps doing it. 0 reports every overrun. Kills are always reported."""

    metrics_listen: str = DEFAULT_METRICS_LISTEN
    """``HOST:PORT`` of the Prometheus endpoint (``/metrics``, plus ``/healthz`` and
    ``/readyz`` for probes). 9400 is the port GPU exporters conventionally use (it is
    also dcgm-exporter's default: change one if both run with hostNetwork)."""

    proc_root: Path = Path("/proc")
    """Where to read ``<pid>/cgroup`` and ``<pid>/cmdline``. The agent runs with
    ``hostPID`` so this is the host's procfs; tests point it at a fake tree."""

    label_node: bool = True
    """Keep the ``metagpu.io/*`` Node labels (product, count, memory, units per GPU,
    largest free units) up to date. Needs ``nodes`` get/patch; turn off when another
    tool owns node labels."""

    publish_ledger: bool = True
    """Publish the node's GPU ledger (every GPU of the first configured resource:
    capacity, health, and the units each container holds, from PodResources) in
    the Node annotation ``metagpu.io/gpu-ledger``, for the scheduler extender.
    Written when it changes, at most once a cycle (``interval_s``), and at least every
    ``ledger_refresh_s``, with the ``nodes`` patch the labels use. Off: the agent
    removes the annotation once at start, so no stale ledger steers the extender."""

    ledger_refresh_s: float = Field(default=300.0, ge=10, le=3600)
    """Rewrite the ledger at least this often even when nothing changed, and say so in the
    Node annotation ``metagpu.io/gpu-ledger-refresh-s``: the scheduler extender stops
    trusting a ledger three such periods old (the agent is down or cut off from the API
    server, and its last word about the GPUs may be false). 300 s: one patch per node
    every five minutes, about 3 writes a second at 1,000 nodes."""

    ledger_max_bytes: int = Field(default=64 * 1024, ge=1024, le=200 * 1024)
    """Upper bound of the ledger annotation, in bytes. 64 KiB (a quarter of the
    256 KiB an object's annotations may take) holds about 400 holders; past it
    holders are merged per pod, then into one per GPU (units stay exact)."""

    rightsizing_window_s: float = Field(default=86400.0, ge=600, le=7 * 86400)
    """Seconds of history behind each share's peak GPU memory and SM use, and so its
    recommended share (``mgctl get rightsize``, ``metagpu_container_recommended_units``).
    A day, as the recording rule ``metagpu:container_recommended_units:1d``: long
    enough to see a daily job's peak. Kept in memory as 24 maxima per share
    (hourly for a day), so a longer window costs nothing but resolution; an agent
    restart starts it over (Prometheus keeps the durable history)."""

    install_mgctl: bool = True
    """Copy the stdlib-only ``mgctl`` program into ``socket_dir`` at start-up, so every
    metagpu container can run ``/var/run/metagpu/mgctl`` without it in its image."""

    dra_driver: str = Field(default=DRA_DRIVER, max_length=63)
    """The DRA driver whose claims are metagpu shares (the DRA plugin's
    ``driver_name``). The kubelet reports a container's claim devices with their
    driver; those of this driver become shares through their CDI spec in
    ``dra_cdi_dir``, others are not metagpu's. Must equal the plugin's setting."""

    dra_cdi_dir: Path = DEFAULT_CDI_DIR
    """Where the DRA plugin writes one CDI spec per prepared share (its ``cdi_dir``):
    the node-local record of each share's GPU, units and memory limit. Mounted
    read-only from the host on DRA nodes; read only when a container holds a claim
    of ``dra_driver``, so device-plugin nodes never touch it."""

    @field_validator("metrics_listen")
    @classmethod
    def _valid_listen(cls, value: str) -> str:
        split_listen(value, example=DEFAULT_METRICS_LISTEN)
        return value

    @field_validator("dra_driver")
    @classmethod
    def _dns(cls, value: str) -> str:
        if not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"must be a DNS subdomain (lower case, dots): {value!r}")
        return value
