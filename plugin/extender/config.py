"""Configuration of ``metagpu scheduler-extender``: one versioned pydantic model.

Loaded by :func:`plugin.api.settings.load_config` with env prefix
:data:`ENV_PREFIX` and the precedence flags > env > file > defaults
(``METAGPU_EXTENDER_LISTEN``, ``METAGPU_EXTENDER_ASSUME_TIMEOUT_S``, ...).
``docs/scheduler.md`` lists every field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal, Self

from pydantic import Field, field_validator, model_validator

from plugin.api.config import AllocationPolicy
from plugin.api.resources import DEFAULT_RESOURCE_NAME, ResourceName
from plugin.api.settings import StrictModel, split_listen

ENV_PREFIX: Final = "METAGPU_EXTENDER_"

DEFAULT_LISTEN: Final = "127.0.0.1:8450"
"""Loopback: the extender runs as a sidecar of kube-scheduler, which calls it on localhost."""


class ExtenderTlsConfig(StrictModel):
    """Optional HTTPS (the chart's sidecar listens on loopback over plain HTTP)."""

    cert_file: Path | None = None
    """PEM certificate (chain); with ``key_file``. Both unset: plain HTTP."""
    key_file: Path | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            given = "cert_file" if self.cert_file is not None else "key_file"
            raise ValueError(f"tls.cert_file and tls.key_file go together; only {given} is set")
        return self


class PreemptionConfig(StrictModel):
    """Preemption for fractions (``docs/scheduler.md``, "Preemption")."""

    enabled: bool = True
    """Answer ``preemptVerb`` and evict for pods that fit no single GPU; off: the verb
    keeps no node and the extender never evicts (pods of higher priority wait)."""
    handover_s: float = Field(default=1.0, ge=0, le=30)
    """How long after refusing a pod in the filter the extender waits before evicting for
    it. kube-scheduler calls ``preemptVerb`` in the same scheduling cycle (PostFilter,
    milliseconds later) when its own dry run found victims; a second is ample, and the
    extender then leaves the preemption to it rather than evicting twice."""
    nomination_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """How long the freed units are held for the preemptor. Victims get their
    ``terminationGracePeriodSeconds`` (30 s by default) to stop, and the node agent
    reports within seconds; two minutes covers both with room, without holding units
    for a pod that went away (a pending pod's deletion is not watched)."""
    spare_s: float = Field(default=60.0, ge=0, le=3600)
    """After the API refuses to evict a pod (its PodDisruptionBudget), how long the
    extender chooses other victims instead of retrying that one."""


class ExtenderConfig(StrictModel):
    """Everything ``metagpu scheduler-extender`` reads at start-up."""

    version: Literal["v1"] = "v1"
    listen: str = DEFAULT_LISTEN
    """HOST:PORT to serve the extender verbs, /healthz, /readyz and /metrics on."""
    tls: ExtenderTlsConfig = ExtenderTlsConfig()
    metrics_listen: str | None = None
    """HOST:PORT of a second, plain-HTTP listener serving only ``/metrics``, ``/healthz``
    and ``/readyz``, for Prometheus: ``listen`` stays on loopback (anyone who can reach
    it can bind pods), this one may face the pod network. None: no second listener."""
    resource_name: str = DEFAULT_RESOURCE_NAME
    """The extended resource the ledgers describe (the scheduler's ``managedResources``)."""
    placement_policy: AllocationPolicy = "binpack"
    """Default for pods and namespaces without ``metagpu.io/placement-policy``: ``binpack``
    fills the tightest GPU (keeps whole GPUs free for large requests), ``spread`` the
    freest. Use the device plugin's ``allocation_policy`` so both choose alike."""
    assume_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    """How long a bind's reservation stands while the node has not reported the pod. The
    kubelet allocates within seconds of the bind; 5 minutes covers a slow or restarting
    agent without holding units of a pod that never reached its node for long."""
    kubeconfig: Path | None = None
    """Kubeconfig to use instead of the in-cluster service account."""
    initial_sync_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Until the first list of Nodes and Pods is in, filter and bind answer with an error
    (the scheduler retries the pod) and /readyz fails; this long at most before a warning."""
    api_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """Bound on each API call of a bind (the pod read when no filter call came first, the
    Binding), connecting and waiting for the answer included. kube-scheduler's extender
    ``httpTimeout`` (default 30 s) must exceed two of these."""
    max_binds_in_flight: int = Field(default=128, ge=1, le=1024)
    """Binds handled at once, and the API connections the binder may open (one each, so
    no bind waits for another's connection); one more bind is refused at once with a
    message saying so, and kube-scheduler retries the pod. kube-scheduler binds each pod
    in a goroutine of its own, so a burst is many binds at once; at the API server's
    usual tens of milliseconds a burst of 100 pods a second keeps about 10 in flight, and
    128 leaves room for a slow minute. It stays under kube-apiserver's default
    ``--max-mutating-requests-inflight`` (200): more would be throttled there."""
    request_timeout_s: float = Field(default=30.0, gt=0, le=300)
    """Bound on handling one request."""
    max_body_bytes: int = Field(default=16 << 20, ge=1 << 16, le=256 << 20)
    """Largest request body accepted (413 above). With ``nodeCacheCapable`` a filter is
    the pod plus node names (tens of KiB); a full NodeList of thousands of nodes is MiBs."""
    shutdown_timeout_s: float = Field(default=5.0, ge=0, le=60)
    preemption: PreemptionConfig = PreemptionConfig()

    @field_validator("resource_name")
    @classmethod
    def _valid_resource_name(cls, value: str) -> str:
        return str(ResourceName(value))

    @field_validator("listen")
    @classmethod
    def _valid_listen(cls, value: str) -> str:
        split_listen(value, example=DEFAULT_LISTEN)
        return value

    @field_validator("metrics_listen")
    @classmethod
    def _valid_metrics_listen(cls, value: str | None) -> str | None:
        if value is not None:
            split_listen(value, example="0.0.0.0:8451")
        return value

    @model_validator(mode="after")
    def _two_listeners(self) -> Self:
        if self.metrics_listen is not None:
            port = split_listen(self.metrics_listen, example="0.0.0.0:8451")[1]
            if port and port == self.port:
                raise ValueError(
                    f"metrics_listen ({self.metrics_listen}) must use another port than "
                    f"listen ({self.listen}): the verbs are never served on the metrics port"
                )
        return self

    @property
    def host(self) -> str:
        return split_listen(self.listen, example=DEFAULT_LISTEN)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen, example=DEFAULT_LISTEN)[1]
