"""Settings of ``metagpu certs generate`` and ``metagpu certs bootstrap``.

Loaded with :func:`plugin.api.settings.load_config` like every metagpu
component: flags > env (``METAGPU_CERTS_<FIELD>``) > defaults, so a Helm hook
Job can set everything through ``env:`` and a person through flags. Values are
checked here, once, so a typo in a DNS name or a namespace is a usage error
(exit 2) naming the value and where it came from, not a half-run bootstrap.
One-shot actions (``--force``, ``--new-ca``, ``--dry-run``) are flags only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Final, Self

from pydantic import Field, field_validator, model_validator

from certs.bootstrap import IssuePolicy
from certs.issue import (
    DEFAULT_RENEW_FRACTION,
    CertError,
    KeyAlgorithm,
    normalize_dns_name,
    normalize_ip_address,
    service_dns_names,
)
from certs.permissions import DEFAULT_SECRET_NAME
from plugin.api.resources import is_dns_label, is_dns_subdomain
from plugin.api.settings import StrictModel

ENV_PREFIX: Final = "METAGPU_CERTS_"
DEFAULT_SERVICE_NAME: Final = "metagpu-webhook"
"""The webhook's Service (``--service``); its DNS names go into the certificate."""
DEFAULT_NAMESPACE: Final = "metagpu"
"""Used when ``--namespace`` is not given and bootstrap is not running in a pod."""
DEFAULT_CLUSTER_DOMAIN: Final = "cluster.local"
LOCAL_DNS_NAMES: Final = ("localhost",)
LOCAL_IP_ADDRESSES: Final = ("127.0.0.1", "::1")
"""``generate`` without any name: a certificate for local runs."""


class IssueSettings(StrictModel):
    """What the certificates say and how long they live."""

    dns: tuple[str, ...] = ()
    """Extra DNS names for the serving certificate (``--dns``, repeatable)."""
    ip: tuple[str, ...] = ()
    """Extra IP addresses for the serving certificate (``--ip``, repeatable)."""
    validity_days: int = Field(default=365, ge=1, le=36500)
    """Serving certificate lifetime. One year, renewed with a third left (~4 months)."""
    ca_validity_days: int = Field(default=3650, ge=1, le=36500)
    """CA lifetime. Ten years: the CA is the caBundle, so it should outlive the install.
    A due CA is renewed with the same key, which keeps old certificates verifying."""
    key_algorithm: KeyAlgorithm = "ecdsa-p256"
    """Algorithm of new keys. P-256: small, fast, accepted by every API server."""
    renew_fraction: float = Field(default=DEFAULT_RENEW_FRACTION, gt=0, lt=1)
    """Renew a certificate once less than this fraction of its lifetime is left."""

    @field_validator("dns")
    @classmethod
    def _dns_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_checked(normalize_dns_name, v) for v in value)

    @field_validator("ip")
    @classmethod
    def _ip_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_checked(normalize_ip_address, v) for v in value)

    @model_validator(mode="after")
    def _leaf_within_ca(self) -> Self:
        if self.validity_days > self.ca_validity_days:
            raise ValueError(
                f"validity_days ({self.validity_days}) must not exceed ca_validity_days "
                f"({self.ca_validity_days}): a certificate cannot outlive its CA"
            )
        return self

    def policy(self, dns_names: tuple[str, ...], ip_addresses: tuple[str, ...]) -> IssuePolicy:
        """The :class:`IssuePolicy` for these names plus the extras given here."""
        return IssuePolicy(
            dns_names=(*dns_names, *self.dns),
            ip_addresses=(*ip_addresses, *self.ip),
            leaf_validity=dt.timedelta(days=self.validity_days),
            ca_validity=dt.timedelta(days=self.ca_validity_days),
            algorithm=self.key_algorithm,
            renew_fraction=self.renew_fraction,
        )


class ServiceSettings(StrictModel):
    """The Service whose DNS names the serving certificate must carry."""

    service: str | None = None
    namespace: str | None = None
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    """The cluster's DNS domain (kubelet ``--cluster-domain``); rarely not cluster.local."""

    @field_validator("service", "namespace")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_label(value):
            raise ValueError(
                "must be a DNS label: at most 63 lower-case letters, digits or '-', "
                "starting and ending with a letter or digit"
            )
        return value

    @field_validator("cluster_domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        return _checked(normalize_dns_name, value)


class GenerateSettings(IssueSettings, ServiceSettings):
    """``metagpu certs generate``: a bundle in a directory."""

    out: Path
    """Directory for ca.crt, ca.key, tls.crt, tls.key (created if missing)."""

    @model_validator(mode="after")
    def _service_needs_namespace(self) -> Self:
        if (self.service is None) != (self.namespace is None):
            raise ValueError("service and namespace go together: give both or neither")
        return self

    def names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """DNS names and IPs before the extras: the Service's, or localhost when none."""
        if self.service is not None and self.namespace is not None:
            svc = service_dns_names(
                self.service, self.namespace, cluster_domain=self.cluster_domain
            )
            return tuple(svc), ()
        if self.dns or self.ip:
            return (), ()
        return LOCAL_DNS_NAMES, LOCAL_IP_ADDRESSES


class BootstrapSettings(IssueSettings, ServiceSettings):
    """``metagpu certs bootstrap``: the TLS Secret and the caBundle in a cluster."""

    service: str | None = DEFAULT_SERVICE_NAME
    secret: str = DEFAULT_SECRET_NAME
    """The ``kubernetes.io/tls`` Secret holding tls.crt, tls.key, ca.crt and ca.key."""
    webhook_config: str | None = None
    """MutatingWebhookConfiguration to patch; none: only the Secret is ensured."""
    webhooks: tuple[str, ...] = ()
    """Webhooks of that configuration to patch; empty: all of them."""
    kubeconfig: Path | None = None
    """Kubeconfig file; default: in-cluster credentials, else $KUBECONFIG, else ~/.kube/config."""
    context: str | None = None
    """Kubeconfig context; default: the file's current-context."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Per API request; long enough to ride out an API server leader election."""
    attempts: int = Field(default=5, ge=1, le=50)
    """Tries per object on 409 conflicts and transient errors (backoff 0.2 s doubling, ≤ 5 s)."""

    @field_validator("secret")
    @classmethod
    def _secret_name(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(
                "must be a DNS subdomain: lower-case letters, digits, '-' and '.', "
                "at most 253 characters"
            )
        return value

    @field_validator("webhook_config")
    @classmethod
    def _config_name(cls, value: str | None) -> str | None:
        return None if value is None else cls._secret_name(value)

    @model_validator(mode="after")
    def _webhooks_need_a_config(self) -> Self:
        if self.webhooks and self.webhook_config is None:
            raise ValueError(
                f"webhooks {', '.join(self.webhooks)} given without webhook_config: name the "
                "MutatingWebhookConfiguration that holds them (--webhook-config)"
            )
        return self

    @field_validator("service")
    @classmethod
    def _service_required(cls, value: str | None) -> str | None:
        if value is None:
            raise ValueError("bootstrap needs the webhook's Service name")
        return value

    def names(self, namespace: str) -> tuple[str, ...]:
        """The Service's DNS names in ``namespace``."""
        assert self.service is not None
        return tuple(service_dns_names(self.service, namespace, cluster_domain=self.cluster_domain))


def _checked(check: Callable[[str], str], value: str) -> str:
    """Run a :mod:`certs.issue` check; pydantic reports a ValueError with its message."""
    try:
        return check(value)
    except CertError as exc:
        raise ValueError(str(exc)) from exc
