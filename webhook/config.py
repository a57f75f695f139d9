"""Configuration of ``metagpu webhook`` and ``metagpu mutate``: one versioned pydantic model.

Loaded by :func:`plugin.api.settings.load_config` with env prefix
:data:`ENV_PREFIX` and the precedence flags > env > file > defaults
(``METAGPU_WEBHOOK_TLS__CERT_FILE``, ``METAGPU_WEBHOOK_UNITS_PER_GPU``, ...).
The field names are a contract with the Helm chart, which renders a config
file with exactly these keys; ``docs/webhook.md`` lists every one.

Everything is checked here, once, at start-up: a bad resource name, a
toleration Kubernetes would refuse, or ``units_per_gpu`` out of range is a
start-up error naming the field and the value, never a surprise at the first
pod.
"""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path
from typing import Final, Literal, Self

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from plugin.api.resources import (
    CNVRG_GPU_RESOURCE,
    DEFAULT_RESOURCE_NAME,
    DEFAULT_UNITS_PER_GPU,
    DRA_DRIVER,
    MAX_UNITS_PER_GPU,
    NVIDIA_GPU_RESOURCE,
    ResourceName,
    is_dns_label,
    is_dns_subdomain,
)
from plugin.api.settings import StrictModel, split_listen

ENV_PREFIX: Final = "METAGPU_WEBHOOK_"
"""Env vars are ``METAGPU_WEBHOOK_<FIELD>``, nested fields joined by ``__``."""

DEFAULT_LISTEN: Final = "127.0.0.1:8443"
"""Loopback for the embedded default; the chart sets ``0.0.0.0:8443``."""

MIB: Final = 1 << 20

ComputePolicy = Literal["fixed", "balance", "none"]
"""How a GPU container shares its GPU (annotation ``metagpu.io/compute-policy``):

* ``fixed``: a hard cap. The container gets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
  equal to its share, so under MPS it can never use more SMs than it asked for.
* ``balance``: the GPU is time-sliced (or shared under MPS) without a hard cap;
  the share is what the scheduler counts and is advisory at run time, so an idle
  neighbour's time can be used.
* ``none``: metagpu sets no policy environment beyond ``METAGPU_COMPUTE_POLICY``.
"""

VisibleDevicesPolicy = Literal["deny", "strip"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Toleration(StrictModel):
    """A pod toleration, in the Kubernetes field names (``tolerationSeconds`` too)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True)

    key: str | None = None
    """Taint key; empty with ``operator: Exists`` tolerates every taint."""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    """Taint value; must be empty for ``operator: Exists``."""
    effect: TaintEffect | None = None
    """Empty tolerates every effect."""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")
    """Only with ``effect: NoExecute``: how long the pod stays after the taint appears."""

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Self:
        # The same rules as the API server's ValidateTolerations, so a config
        # that the API server would refuse on every pod fails at start-up instead.
        if self.operator == "Exists" and self.value:
            raise ValueError(f"value must be empty when operator is Exists (got {self.value!r})")
        if self.operator == "Equal" and not self.key:
            raise ValueError("operator must be Exists when key is empty")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is only allowed with effect NoExecute")
        return self

    def as_kubernetes(self) -> dict[str, object]:
        """The toleration as it appears in a pod spec (unset fields left out)."""
        data: dict[str, object] = {}
        if self.key is not None:
            data["key"] = self.key
        data["operator"] = self.operator
        if self.value is not None:
            data["value"] = self.value
        if self.effect is not None:
            data["effect"] = self.effect
        if self.toleration_seconds is not None:
            data["tolerationSeconds"] = self.toleration_seconds
        return data


def default_tolerations() -> list[Toleration]:
    """The taints the install guide puts on GPU nodes."""
    return [
        Toleration(
            key=DEFAULT_RESOURCE_NAME, operator="Equal", value="present", effect="NoSchedule"
        ),
        Toleration(key=NVIDIA_GPU_RESOURCE, operator="Exists", effect="NoSchedule"),
    ]


class TlsConfig(StrictModel):
    """Where the serving certificate comes from."""

    cert_file: Path | None = None
    """PEM certificate (chain) to serve. With ``key_file``; both or neither.
    Usually ``/tls/tls.crt`` from a mounted ``kubernetes.io/tls`` Secret."""
    key_file: Path | None = None
    """PEM private key of ``cert_file``."""
    generate_dir: Path = Path("run/webhook-tls")
    """With no ``cert_file``/``key_file``: the embedded default writes (or reuses) a
    CA and a certificate for localhost/127.0.0.1/::1 here (``ca.crt``, ``tls.crt``,
    ``tls.key``). Relative to the working directory."""
    reload_interval_s: float = Field(default=0.5, gt=0, le=60)
    """Seconds between checks of the certificate files for a rotation. A mounted
    Secret changes by a symlink swap that file watchers miss, so the files are
    polled; half a second keeps new handshakes on the new certificate within 2 s."""

    @model_validator(mode="after")
    def _both_or_neither(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            given = "cert_file" if self.cert_file is not None else "key_file"
            raise ValueError(
                f"tls.cert_file and tls.key_file go together; only {given} is set "
                "(set both, or neither to generate a certificate)"
            )
        return self


class KubernetesConfig(StrictModel):
    """How the webhook reads Namespace annotations and labels."""

    enabled: Literal["auto"] | bool = "auto"
    """``auto``: use the API when running in a cluster (``KUBERNETES_SERVICE_HOST``)
    or when a kubeconfig is given (``kubeconfig`` or ``KUBECONFIG``), otherwise run
    on config alone. ``true``: the API is required (start-up fails without it).
    ``false``: never call the API; namespace annotations are ignored."""
    kubeconfig: Path | None = None
    """Kubeconfig file to use instead of the in-cluster service account."""
    namespace_lookup_timeout_s: float = Field(default=1.0, gt=0, le=30)
    """Bound on the one GET a namespace cache miss makes; on timeout the config
    defaults apply and the response carries a warning. Keep it well below the
    webhook's ``timeoutSeconds`` (1-30 s, default 10): a bound at or above it makes
    the API server give up first, and the pod gets a timeout instead of the defaults."""
    initial_sync_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """``/readyz`` reports not-ready until the namespace cache has listed every
    namespace, for at most this long. After that the webhook reports ready anyway
    (degraded, with a logged warning): cache misses then fall back to one GET each,
    so a slow or forbidden list never keeps the webhook out of its Service."""


class QuotaMirrorConfig(StrictModel):
    """The quota mirror: a companion ResourceQuota in units for every GPU quota (docs/quotas.md)."""

    enabled: Literal["auto"] | bool = "auto"
    """``auto``: run it when the webhook runs in a cluster (``KUBERNETES_SERVICE_HOST``)
    and reads the API (``kubernetes.enabled`` is not ``false``). ``true``: run it
    (start-up fails without a cluster). ``false``: never; GPU quotas then do not count
    converted pods, and the webhook warns about that at admission."""
    lease_name: str = "metagpu-quota-mirror"
    """The ``coordination.k8s.io/v1`` Lease the replicas elect a leader with; only
    the leader writes quotas. The chart names it after the release."""
    lease_namespace: str | None = None
    """Where the Lease lives; empty: the pod's own namespace (from its service account)."""
    identity: str | None = None
    """This replica's name in the Lease; empty: ``<hostname>_<uuid>``, unique per start."""
    lease_duration_s: int = Field(default=15, ge=1, le=3600)
    """How long a silent leader's Lease stays valid for the others (client-go's default).
    The Lease stores whole seconds. A crashed leader is replaced after at most this long;
    a cleanly stopped one releases the Lease and is replaced within ``retry_period_s``."""
    renew_deadline_s: float = Field(default=10, gt=0, le=3600)
    """A leader that could not renew for this long stops writing (client-go's default);
    below ``lease_duration_s`` so it has stopped before anyone else may start."""
    retry_period_s: float = Field(default=2, gt=0, le=600)
    """Between attempts to take or renew the Lease (client-go's default)."""

    @field_validator("lease_name")
    @classmethod
    def _valid_lease_name(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"lease_name must be a DNS subdomain name: {value!r}")
        return value

    @field_validator("lease_namespace")
    @classmethod
    def _valid_lease_namespace(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_label(value):
            raise ValueError(f"lease_namespace must be a namespace name (a DNS label): {value!r}")
        return value

    @model_validator(mode="after")
    def _timings_like_client_go(self) -> Self:
        # client-go's NewLeaderElector refuses the same: a leader must give up before
        # its Lease can be taken, and must get more than one try before giving up.
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError(
                f"quota_mirror.lease_duration_s ({self.lease_duration_s}) must be greater "
                f"than renew_deadline_s ({self.renew_deadline_s})"
            )
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise ValueError(
                f"quota_mirror.renew_deadline_s ({self.renew_deadline_s}) must be greater "
                f"than 1.2 × retry_period_s ({self.retry_period_s})"
            )
        return self


WebhookMode = Literal["device-plugin", "dra"]
"""How converted pods get their share: ``device-plugin`` (units of ``resource_name``,
served by ``metagpu device-plugin``) or ``dra`` (a ResourceClaim per container from a
per-namespace ResourceClaimTemplate, served by ``metagpu dra-plugin``; docs/dra.md)."""

DEFAULT_MEMORY_RESOURCE_NAME: Final = "metagpu.io/gpu-memory"
"""How a container asks for GPU memory in DRA mode: ``metagpu.io/gpu-memory: 10Gi``."""


class DraConfig(StrictModel):
    """DRA mode (``mode: dra``): what the claims the webhook writes ask for.

    The memory settings restate the DRA plugin's ``memory`` request policy
    (``memory.min_mib``, ``memory.step_mib``) and the GPUs' memory, because the
    webhook must size a units-only share's memory itself: a claim that asks for
    units alone is charged, and limited to, the policy default (1Gi).
    """

    device_class_name: str = "gpu.metagpu.io"
    """The DeviceClass the claims name (the chart creates it; captured as
    ``deviceclass-gpu-accepted.json``)."""
    gpu_memory_mib: int | None = Field(default=None, ge=1)
    """Memory of the smallest GPU the DRA plugin serves, in MiB (NVML's total,
    e.g. 81559 for an H100 80GB). A share of ``units`` asks for
    ``floor(gpu_memory_mib × units / units_per_gpu)`` rounded down to
    ``memory_step_mib``, as the device plugin's limit would be. Required with
    ``mode: dra``: a default could ask for more than a GPU has, and such a pod
    would stay Pending with the scheduler's generic message."""
    memory_step_mib: int = Field(default=1024, ge=1)
    """The plugin's ``memory.step_mib``. Units-only memory is rounded **down** to it,
    because the scheduler rounds requests up to it and the shares of one GPU must
    still fit its memory."""
    memory_min_mib: int = Field(default=1024, ge=1)
    """The plugin's ``memory.min_mib``: the least memory a share asks for."""
    memory_resource_name: str = DEFAULT_MEMORY_RESOURCE_NAME
    """The resource name a container asks for GPU memory with (``10Gi``); removed
    from the container like the fraction, never sent to the scheduler."""
    template_prefix: str = "metagpu"
    """ResourceClaimTemplate names: ``<prefix>-<units>u-<memory>`` (``metagpu-50u-40gi``),
    or ``<prefix>-<memory>`` for a memory-only share (``metagpu-10gi``)."""
    controller: Literal["auto"] | bool = "auto"
    """Run the controller that keeps the templates (webhook/claimtemplate_controller.py):
    ``auto``: with ``mode: dra`` in a cluster the webhook reads (as ``quota_mirror``);
    ``true``: required with ``mode: dra``; ``false``: never (the templates are someone
    else's job, and pods wait for them)."""
    lease_name: str = "metagpu-claim-templates"
    """The Lease the replicas elect the controller's one writer with; its namespace,
    identity and timings are ``quota_mirror``'s."""
    explain_waiting: bool = True
    """While the controller leads, write an Event on each Pending pod whose GPU share no
    node's GPUs can take, saying what each GPU has free (kube-scheduler says only
    ``cannot allocate all claims``; webhook/dra_waiting.py). Needs list on
    ResourceSlices and ResourceClaims and create on Events."""
    explain_refresh_s: float = Field(default=60.0, ge=5, le=3600)
    """How often the Events are brought up to date while pods wait (a new waiting pod
    or scheduler verdict is explained at once; what the GPUs have free changes
    without a pod event)."""
    driver_name: str = DRA_DRIVER
    """The DRA plugin's driver (the ResourceSlices' ``spec.driver``)."""

    @field_validator("lease_name")
    @classmethod
    def _valid_lease(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"dra.lease_name must be a DNS subdomain name: {value!r}")
        return value

    @field_validator("device_class_name", "driver_name")
    @classmethod
    def _valid_class(cls, value: str, info: ValidationInfo) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"dra.{info.field_name} must be a DNS subdomain name: {value!r}")
        return value

    @field_validator("memory_resource_name")
    @classmethod
    def _valid_memory_resource(cls, value: str) -> str:
        return str(ResourceName(value))

    @field_validator("template_prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        # The longest name is <prefix>-1000u-1048576mi: keep it a DNS subdomain.
        if not is_dns_label(value) or len(value) > 40:
            raise ValueError(
                f"dra.template_prefix must be a DNS label of at most 40 characters: {value!r}"
            )
        return value


API_SERVER_IDLE_CONN_TIMEOUT_S: Final = 90
"""How long the kube-apiserver keeps an idle connection to a webhook open: its
webhook client's transport gets ``IdleConnTimeout`` from
``k8s.io/apimachinery/pkg/util/net.SetOldTransportDefaults``, which copies Go's
``http.DefaultTransport`` (90 s). The webhook must keep idle connections longer,
or it closes one the API server is about to reuse and that review fails."""


class ConnectionsConfig(StrictModel):
    """What one client may hold and how long each stage of a connection may take.

    The webhook runs with ``failurePolicy: Fail`` behind a Service every pod can
    reach, so these bound what a client that never sends, sends slowly, or never
    reads can cost (``docs/webhook.md``, "What the webhook withstands").
    """

    max_connections: int = Field(default=1024, ge=16, le=65536)
    """Open connections in all; more are accepted and closed at once. Lowered at
    start-up (with a warning) to what the file-descriptor limit allows."""
    max_connections_per_client: int = Field(default=256, ge=1, le=65536)
    """Open connections from one client address, so one client (one pod) cannot
    take the API server's share. The API server keeps at most 25 idle connections
    per webhook host (client-go's transport) and opens more only for concurrent
    reviews."""
    tls_handshake_timeout_s: float = Field(default=10, gt=0, le=120)
    """A TLS handshake not done by then is dropped (the API server's own is 10 s)."""
    header_timeout_s: float = Field(default=10, gt=0, le=120)
    """A request's headers must be complete this long after its first byte (or,
    on a new connection, after the handshake); else the connection is dropped."""
    body_timeout_s: float = Field(default=30, gt=0, le=300)
    """A request's body must be complete this long after its headers; else 408 and
    the connection closes. 30 s is the longest ``timeoutSeconds`` a webhook can have."""
    write_timeout_s: float = Field(default=30, gt=0, le=300)
    """An answer the client has not taken this long after it was ready drops the
    connection, so a client that never reads cannot pin the answer's memory."""
    idle_timeout_s: float = Field(default=120, gt=0, le=3600)
    """An idle keep-alive connection is closed after this long. Keep it above the
    API server's own idle timeout (90 s, :data:`API_SERVER_IDLE_CONN_TIMEOUT_S`):
    the side that closes first must be the API server, or it may send a review
    on a connection the webhook is closing and that review fails."""

    @model_validator(mode="after")
    def _share_fits(self) -> Self:
        if self.max_connections_per_client > self.max_connections:
            raise ValueError(
                f"max_connections_per_client ({self.max_connections_per_client}) is more "
                f"than max_connections ({self.max_connections})"
            )
        return self


class WebhookConfig(StrictModel):
    """Everything ``metagpu webhook`` and ``metagpu mutate`` can be told."""

    version: Literal["v1"] = "v1"
    """Config format version; only ``v1`` exists."""

    listen: str = DEFAULT_LISTEN
    """``HOST:PORT`` to serve HTTPS on (``[::1]:8443`` for IPv6; port 0 picks a free one)."""

    tls: TlsConfig = Field(default_factory=TlsConfig)

    resource_name: str = DEFAULT_RESOURCE_NAME
    """The metagpu resource that fractions are converted into. Must be one the
    device plugin advertises."""

    extra_resource_names: list[str] = Field(default_factory=list)
    """Other metagpu resources (e.g. ``cnvrg.io/metagpu-a100``): passed through as
    whole units, checked like ``resource_name``, and count as "uses metagpu"
    (tolerations, runtime class, policy)."""

    units_per_gpu: int = Field(default=DEFAULT_UNITS_PER_GPU, ge=1, le=MAX_UNITS_PER_GPU)
    """Units per GPU; must equal the device plugin's. 100 makes a unit 1% of a GPU."""

    fraction_resource_names: list[str] = Field(
        default_factory=lambda: [NVIDIA_GPU_RESOURCE, CNVRG_GPU_RESOURCE]
    )
    """Resources whose value is a share of one GPU and is converted into units.
    ``nvidia.com/gpu`` is converted only when its value is not a whole number
    (unless ``convert_whole_gpus``), so whole GPUs keep going to NVIDIA's plugin."""

    convert_whole_gpus: bool = False
    """Also convert whole ``nvidia.com/gpu`` values (``1`` becomes 100 units), for
    clusters where metagpu serves every GPU."""

    max_gpus_per_container: float = Field(default=8, gt=0, le=1024)
    """Largest share one container may ask for, in GPUs; larger requests are denied.
    Eight is the most GPUs a common node has."""

    tolerations: list[Toleration] = Field(default_factory=default_tolerations)
    """Added to pods that use metagpu, unless an existing toleration already
    covers them. The defaults match the taints the install guide puts on GPU nodes."""

    runtime_class_name: str | None = "nvidia"
    """Set on pods that use metagpu and have none. ``null``: never set (the nvidia
    runtime is the node default). Also the class under which containers that ask
    for no GPU get ``NVIDIA_VISIBLE_DEVICES=void``."""

    scheduler_name: str | None = None
    """Set as ``schedulerName`` on pods that use metagpu and name no scheduler or
    ``default-scheduler``, so the GPU-aware second scheduler (``metagpu-scheduler``,
    docs/scheduler.md) places them. ``null``: never (no second scheduler deployed; the
    chart sets it when ``scheduler.enabled``). A pod naming another scheduler is left
    alone, with a warning. Not used with ``mode: dra``: the cluster's scheduler keeps a
    claim's share on one GPU by itself."""

    default_compute_policy: ComputePolicy = "balance"
    """Policy for pods whose own annotation and whose namespace's annotation
    (``metagpu.io/compute-policy``) are unset. See :data:`ComputePolicy`."""

    visible_devices_policy: VisibleDevicesPolicy = "deny"
    """What to do with a GPU container that sets ``NVIDIA_VISIBLE_DEVICES`` or
    ``CUDA_VISIBLE_DEVICES`` itself (it could see GPUs it was not given): ``deny``
    the pod, or ``strip`` the variables and warn."""

    deny_privileged: bool = True
    """Deny privileged containers that request metagpu: they see every GPU on the node."""

    void_non_gpu_containers: bool = True
    """Give containers that ask for no GPU ``NVIDIA_VISIBLE_DEVICES=void`` in pods
    under the nvidia runtime class, so a CUDA base image (``NVIDIA_VISIBLE_DEVICES=all``)
    does not expose every GPU to a sidecar."""

    mps_host_directories: list[str] = Field(
        default_factory=lambda: ["/tmp/nvidia-mps", "/var/run/metagpu-mps"]
    )
    """Host directories that hold an MPS control daemon's pipes (the device plugin's
    ``mps.pipe_directory``: CUDA's default and the chart's). A pod that uses metagpu
    and mounts one of them, or a directory above one, from the host is denied: with
    the control socket a root container could change every client's MPS limits or
    stop the daemon. Empty: no check."""

    mode: WebhookMode = "device-plugin"
    """``device-plugin`` (units) or ``dra`` (ResourceClaims, settings in ``dra``);
    see :data:`WebhookMode`. The chart does not set it yet."""

    dra: DraConfig = Field(default_factory=DraConfig)

    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)

    quota_mirror: QuotaMirrorConfig = Field(default_factory=QuotaMirrorConfig)

    max_body_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=64 * MIB)
    """Largest AdmissionReview accepted; larger bodies get a 400. The API server's
    own request limit is 3 MiB, so 4 MiB never refuses a real review."""

    shutdown_timeout_s: float = Field(default=10, ge=0, le=300)
    """How long SIGTERM waits for in-flight requests. Keep ``drain_delay_s +
    shutdown_timeout_s`` below the pod's ``terminationGracePeriodSeconds`` (30 s
    by default)."""

    connections: ConnectionsConfig = Field(default_factory=ConnectionsConfig)

    drain_delay_s: float = Field(default=0, ge=0, le=120)
    """After SIGTERM, keep serving (with ``/readyz`` failing) this long before
    closing the listener: the API server may route new reviews to a terminating
    pod until its endpoints update. 0 for local runs; the chart sets a few seconds."""

    # ---------------------------------------------------------- validation
    @field_validator("resource_name")
    @classmethod
    def _valid_resource_name(cls, value: str) -> str:
        return str(ResourceName(value))

    @field_validator("extra_resource_names", "fraction_resource_names")
    @classmethod
    def _valid_resource_names(cls, values: list[str]) -> list[str]:
        checked = [str(ResourceName(v)) for v in values]
        duplicates = sorted({v for v in checked if checked.count(v) > 1})
        if duplicates:
            raise ValueError(f"resource names listed twice: {', '.join(duplicates)}")
        return checked

    @field_validator("runtime_class_name")
    @classmethod
    def _valid_runtime_class(cls, value: str | None) -> str | None:
        # A RuntimeClass name is a DNS subdomain; check it here rather than have
        # the API server refuse every GPU pod.
        if value is not None and not is_dns_subdomain(value):
            raise ValueError(f"runtime_class_name must be a DNS subdomain name: {value!r}")
        return value

    @field_validator("scheduler_name")
    @classmethod
    def _valid_scheduler_name(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value):
            raise ValueError(
                f"scheduler_name must be a DNS subdomain like metagpu-scheduler: {value!r}"
            )
        return value

    @field_validator("listen")
    @classmethod
    def _valid_listen(cls, value: str) -> str:
        split_listen(value, example=DEFAULT_LISTEN)
        return value

    @model_validator(mode="after")
    def _names_do_not_overlap(self) -> Self:
        groups = {
            "resource_name": [self.resource_name],
            "extra_resource_names": self.extra_resource_names,
            "fraction_resource_names": self.fraction_resource_names,
        }
        seen: dict[str, str] = {}
        for field, names in groups.items():
            for name in names:
                if name in seen and seen[name] != field:
                    raise ValueError(
                        f"{name} is in both {seen[name]} and {field}; a resource is either "
                        "a metagpu resource (units) or a fraction resource (GPUs), not both"
                    )
                seen[name] = field
        if self.mode == "dra" and self.dra.gpu_memory_mib is None:
            raise ValueError(
                "mode dra needs dra.gpu_memory_mib, the memory of the smallest GPU the DRA "
                "plugin serves (e.g. 81559 for an H100 80GB): a share's memory is sized from it"
            )
        if self.dra.memory_resource_name in seen:
            raise ValueError(
                f"dra.memory_resource_name {self.dra.memory_resource_name} is also a GPU "
                "resource name; memory needs a name of its own"
            )
        if self.max_units < 1:
            raise ValueError(
                f"max_gpus_per_container {self.max_gpus_per_container} is less than one unit "
                f"at {self.units_per_gpu} units per GPU"
            )
        return self

    @property
    def max_gpus(self) -> Decimal:
        """``max_gpus_per_container`` as the decimal it was written as (``0.29``,
        not the float's binary expansion)."""
        return Decimal(repr(float(self.max_gpus_per_container)))

    @property
    def max_units(self) -> int:
        """The most units one container may ask for: ``max_gpus`` GPUs, rounded down.

        Computed exactly, so ``0.29`` GPUs at 100 units per GPU is 29 units (the
        float product is 28.999...)."""
        return math.floor(self.max_gpus * self.units_per_gpu)

    @property
    def host(self) -> str:
        return split_listen(self.listen, example=DEFAULT_LISTEN)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen, example=DEFAULT_LISTEN)[1]
