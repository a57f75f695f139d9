"""``metagpu certs bootstrap``: make the cluster match the decision, safely and idempotently.

Order, chosen so a failure leaves nothing half-applied where that is avoidable:

1. With ``--webhook-config``: read the configuration first. Missing, owned by
   cert-manager, or without the named webhooks → stop before writing anything.
2. The Secret: read, decide (:func:`certs.bootstrap.decide_bundle`), and write
   only if something changes (create, or update with its resourceVersion).
   When the write changes ``ca.crt`` and a configuration is managed, a
   server-side dry-run of the caBundle patch goes first, so a missing
   ``patch`` permission fails *before* the Secret holds a CA that the
   configuration would never learn about.
3. The caBundle: patch only the selected webhooks whose caBundle differs, with
   the configuration's resourceVersion as a precondition.

Conflicts (409: someone else wrote in between), already-exists (a concurrent
first run) and transient failures (timeouts, 429, 5xx) re-read and retry, at
most ``RetryPolicy.attempts`` times with capped exponential backoff and
jitter. A second run with the same inputs sends only reads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypeVar

from certs.bootstrap import (
    BUNDLE_KEYS,
    CA_CERT_KEY,
    TLS_CERT_KEY,
    BootstrapError,
    BundleDecision,
    IssuePolicy,
    decide_bundle,
    plan_ca_bundle,
    render_bundle,
)
from certs.cluster import (
    ApiAlreadyExistsError,
    ApiConflictError,
    ApiError,
    ApiUnavailableError,
    ClusterApi,
    Obj,
)
from certs.issue import (
    CertInfo,
    KeyAlgorithm,
    PrivateKey,
    inspect_cert,
    iso_utc,
    new_private_key,
)

logger = logging.getLogger(__name__)

SECRET_TYPE_TLS: Final = "kubernetes.io/tls"
ANNOTATION_CERT_MANAGER_CERTIFICATE: Final = "cert-manager.io/certificate-name"
SECRET_LABELS: Final = {
    "app.kubernetes.io/name": "metagpu",
    "app.kubernetes.io/component": "webhook-tls",
    "app.kubernetes.io/managed-by": "metagpu-certs-bootstrap",
}
"""Set when bootstrap creates the Secret; an existing Secret's metadata is left alone."""

SecretAction = Literal["created", "updated", "unchanged"]
T = TypeVar("T")


@dataclass(frozen=True)
class BootstrapTarget:
    """Which objects bootstrap keeps."""

    namespace: str
    secret: str
    webhook_config: str | None = None
    """Without it only the Secret is ensured (the chart's pre-install hook)."""
    webhooks: tuple[str, ...] = ()
    """Webhooks of ``webhook_config`` to patch; empty: all of them."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try when the API server says "try again"."""

    attempts: int = 5
    """Reads + writes per object before giving up; a hook Job's own backoffLimit retries more."""
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0

    def delay_s(self, attempt: int) -> float:
        """Capped exponential backoff with jitter (half to full), so racing jobs spread out."""
        ceiling = min(self.base_delay_s * 2.0**attempt, self.max_delay_s)
        return ceiling * (0.5 + random.random() / 2)  # jitter, not crypto


@dataclass(frozen=True)
class BootstrapResult:
    """What bootstrap found and did (or, with ``dry_run``, would do)."""

    target: BootstrapTarget
    decision: BundleDecision
    secret_action: SecretAction
    ca: CertInfo
    leaf: CertInfo
    patched_webhooks: tuple[str, ...] = ()
    """Webhooks whose caBundle was (or would be) patched."""
    webhooks_in_sync: tuple[str, ...] = ()
    """Selected webhooks whose caBundle already matched."""
    dry_run: bool = False

    @property
    def changed(self) -> bool:
        return self.secret_action != "unchanged" or bool(self.patched_webhooks)

    def summary(self) -> str:
        """A few lines for people (stdout of the command); no key material."""
        t = self.target
        verb = {"created": "created", "updated": "updated", "unchanged": "unchanged"}[
            self.secret_action
        ]
        if self.dry_run and self.secret_action != "unchanged":
            verb = f"would be {verb}"
        lines = [
            f'secret "{t.secret}" in namespace "{t.namespace}": {verb}'
            + (f" — {self.decision.summary()}" if self.decision.changes else ""),
            f"  CA:      {self.ca.subject}, serial {self.ca.serial:x}, "
            f"expires {iso_utc(self.ca.not_after)}",
            f"  serving: {self.leaf.subject}, serial {self.leaf.serial:x}, "
            f"expires {iso_utc(self.leaf.not_after)}, names {', '.join(_names(self.leaf))}",
        ]
        lines += [f"  note: {n}" for n in self.decision.notes]
        if t.webhook_config is not None:
            would = "would be patched" if self.dry_run else "patched"
            if self.patched_webhooks:
                lines.append(
                    f'mutatingwebhookconfigurations "{t.webhook_config}": caBundle {would} in '
                    + ", ".join(self.patched_webhooks)
                )
            else:
                lines.append(
                    f'mutatingwebhookconfigurations "{t.webhook_config}": caBundle already '
                    f"matches in {', '.join(self.webhooks_in_sync)}"
                )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The same facts for scripts (``-o json``)."""
        return {
            "dryRun": self.dry_run,
            "namespace": self.target.namespace,
            "secret": {
                "name": self.target.secret,
                "action": self.secret_action,
                "caAction": self.decision.ca,
                "caReasons": list(self.decision.ca_reasons),
                "leafAction": self.decision.leaf,
                "leafReasons": list(self.decision.leaf_reasons),
                "notes": list(self.decision.notes),
            },
            "ca": cert_json(self.ca),
            "leaf": cert_json(self.leaf),
            "webhookConfiguration": None
            if self.target.webhook_config is None
            else {
                "name": self.target.webhook_config,
                "patched": list(self.patched_webhooks),
                "inSync": list(self.webhooks_in_sync),
            },
        }


@dataclass
class _Options:
    policy: IssuePolicy
    clock: Callable[[], dt.datetime]
    force_leaf: bool
    new_ca: bool
    dry_run: bool
    retry: RetryPolicy
    sleep: Callable[[float], Awaitable[None]]
    new_key: Callable[[KeyAlgorithm], PrivateKey]
    webhook_config: Obj | None = field(default=None)


async def run_bootstrap(
    api: ClusterApi,
    target: BootstrapTarget,
    *,
    policy: IssuePolicy,
    clock: Callable[[], dt.datetime],
    force_leaf: bool = False,
    new_ca: bool = False,
    dry_run: bool = False,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    new_key: Callable[[KeyAlgorithm], PrivateKey] = new_private_key,
) -> BootstrapResult:
    """Ensure the Secret, then the caBundle; see the module docstring for the order."""
    opts = _Options(
        policy, clock, force_leaf, new_ca, dry_run, retry or RetryPolicy(), sleep, new_key
    )
    if target.webhook_config is not None:
        opts.webhook_config = await _with_retries(
            opts, f"read {target.webhook_config}", lambda: _read_webhook_config(api, target)
        )
    decision, action, data = await _with_retries(
        opts, f"ensure secret {target.secret}", lambda: _ensure_secret(api, target, opts)
    )
    result = BootstrapResult(
        target=target,
        decision=decision,
        secret_action=action,
        ca=inspect_cert(data[CA_CERT_KEY]),
        leaf=inspect_cert(data[TLS_CERT_KEY]),
        dry_run=dry_run,
    )
    if target.webhook_config is None:
        return result
    first = True

    async def patch_once() -> tuple[tuple[str, ...], tuple[str, ...]]:
        nonlocal first
        config = opts.webhook_config
        if config is None or not first:
            config = await _read_webhook_config(api, target)
        first = False
        return await _ensure_ca_bundle(api, target, config, data[CA_CERT_KEY], dry_run=dry_run)

    patched, in_sync = await _with_retries(
        opts, f"patch caBundle of {target.webhook_config}", patch_once
    )
    return replace(result, patched_webhooks=patched, webhooks_in_sync=in_sync)


# --------------------------------------------------------------- the Secret
async def _ensure_secret(
    api: ClusterApi, target: BootstrapTarget, opts: _Options
) -> tuple[BundleDecision, SecretAction, dict[str, bytes]]:
    ref = {"namespace": target.namespace, "secret": target.secret}
    secret = await api.get_secret(target.namespace, target.secret)
    if secret is not None:
        check_secret_usable(secret, target)
    current = decode_secret_data(secret) if secret is not None else None
    now = opts.clock()
    decision = decide_bundle(
        current, policy=opts.policy, now=now, force_leaf=opts.force_leaf, new_ca=opts.new_ca
    )
    if not decision.changes:
        logger.info("TLS secret is up to date; nothing to write", extra=ref)
        assert current is not None
        return decision, "unchanged", {k: current[k] for k in BUNDLE_KEYS}
    if secret is not None and secret.get("immutable"):
        raise BootstrapError(
            f'secret "{target.secret}" in namespace "{target.namespace}" is immutable but needs '
            f"a change ({decision.summary()}); delete it and run bootstrap again"
        )
    data = render_bundle(current, decision, policy=opts.policy, now=now, new_key=opts.new_key)
    action: SecretAction = "created" if secret is None else "updated"
    if opts.dry_run:
        return decision, action, data
    if decision.ca_bundle_changes and opts.webhook_config is not None:
        await _check_patch_allowed(api, target, opts.webhook_config, data[CA_CERT_KEY])
    if secret is None:
        await api.create_secret(target.namespace, new_secret(target, data))
    else:
        await api.replace_secret(target.namespace, target.secret, updated_secret(secret, data))
    leaf = inspect_cert(data[TLS_CERT_KEY])
    logger.info(
        "TLS secret %s: %s",
        action,
        decision.summary(),
        extra={
            **ref,
            "ca_action": decision.ca,
            "leaf_serial": f"{leaf.serial:x}",
            "leaf_not_after": iso_utc(leaf.not_after),
        },
    )
    return decision, action, data


def check_secret_usable(secret: Obj, target: BootstrapTarget) -> None:
    """Refuse Secrets bootstrap must not take over, with what to do instead."""
    where = f'secret "{target.secret}" in namespace "{target.namespace}"'
    kind = secret.get("type") or "Opaque"
    if kind != SECRET_TYPE_TLS:
        raise BootstrapError(
            f"{where} has type {kind}; bootstrap keeps a {SECRET_TYPE_TLS} Secret and a "
            "Secret's type cannot be changed. Delete it "
            f"(kubectl -n {target.namespace} delete secret {target.secret}) or pass another "
            "--secret"
        )
    owner = ((secret.get("metadata") or {}).get("annotations") or {}).get(
        ANNOTATION_CERT_MANAGER_CERTIFICATE
    )
    if owner:
        raise BootstrapError(
            f"{where} is managed by the cert-manager Certificate {owner!r}; cert-manager "
            "would overwrite what bootstrap writes. Use one mode (certs.mode=cert-manager "
            "or bootstrap), or pass another --secret"
        )


def decode_secret_data(secret: Obj) -> dict[str, bytes]:
    """Our keys from ``data`` (base64); a value that is not base64 is kept raw, so it
    reads as unusable rather than missing."""
    raw: Mapping[str, Any] = secret.get("data") or {}
    out: dict[str, bytes] = {}
    for key in BUNDLE_KEYS:
        value = raw.get(key)
        if not isinstance(value, str):
            continue
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            out[key] = value.encode("utf-8", "replace")
    return out


def new_secret(target: BootstrapTarget, data: Mapping[str, bytes]) -> Obj:
    """The Secret bootstrap creates."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE_TLS,
        "metadata": {
            "name": target.secret,
            "namespace": target.namespace,
            "labels": dict(SECRET_LABELS),
        },
        "data": _encode(data),
    }


def updated_secret(secret: Obj, data: Mapping[str, bytes]) -> Obj:
    """``secret`` with our keys replaced; its resourceVersion makes the PUT conditional.

    Other keys, labels and annotations are kept. ``managedFields`` is left out
    so the API server keeps tracking field ownership itself.
    """
    body = {k: v for k, v in secret.items() if k != "stringData"}
    meta = {k: v for k, v in (secret.get("metadata") or {}).items() if k != "managedFields"}
    body["metadata"] = meta
    body["data"] = {**(secret.get("data") or {}), **_encode(data)}
    return body


# ---------------------------------------------------------------- caBundle
async def _read_webhook_config(api: ClusterApi, target: BootstrapTarget) -> Obj:
    assert target.webhook_config is not None
    config = await api.get_webhook_config(target.webhook_config)
    if config is None:
        raise BootstrapError(
            f'mutatingwebhookconfigurations "{target.webhook_config}" not found: install the '
            "chart (it creates the configuration) before running bootstrap with "
            "--webhook-config, check the name, or leave --webhook-config out to only "
            "ensure the Secret"
        )
    plan_ca_bundle(config, b"", only=target.webhooks)  # names and ownership, before any write
    return config


async def _check_patch_allowed(
    api: ClusterApi, target: BootstrapTarget, config: Obj, ca_pem: bytes
) -> None:
    plan = plan_ca_bundle(config, ca_pem, only=target.webhooks)
    if plan.patch is None or target.webhook_config is None:
        return
    patch = {k: v for k, v in plan.patch.items() if k != "metadata"}  # permission, not freshness
    await api.patch_webhook_config(target.webhook_config, patch, dry_run=True)


async def _ensure_ca_bundle(
    api: ClusterApi, target: BootstrapTarget, config: Obj, ca_pem: bytes, *, dry_run: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    assert target.webhook_config is not None
    plan = plan_ca_bundle(config, ca_pem, only=target.webhooks)
    in_sync = tuple(n for n in plan.selected if n not in plan.stale)
    ref = {"webhook_config": target.webhook_config}
    if plan.patch is None:
        logger.info("caBundle already matches the CA", extra={**ref, "webhooks": in_sync})
        return (), in_sync
    if not dry_run:
        await api.patch_webhook_config(target.webhook_config, plan.patch)
        logger.info("caBundle patched", extra={**ref, "webhooks": ",".join(plan.stale)})
    return plan.stale, in_sync


# ------------------------------------------------------------------ retries
async def _with_retries(opts: _Options, what: str, attempt_fn: Callable[[], Awaitable[T]]) -> T:
    last: ApiError | None = None
    for attempt in range(opts.retry.attempts):
        try:
            return await attempt_fn()
        except (ApiConflictError, ApiAlreadyExistsError, ApiUnavailableError) as exc:
            last = exc
            if attempt + 1 >= opts.retry.attempts:
                break
            delay = opts.retry.delay_s(attempt)
            logger.warning(
                "%s: %s; re-reading and retrying in %.2fs",
                what,
                exc,
                delay,
                extra={"attempt": attempt + 1, "of": opts.retry.attempts},
            )
            await opts.sleep(delay)
    raise BootstrapError(
        f"{what}: gave up after {opts.retry.attempts} attempts; last error: {last}"
    ) from last


# -------------------------------------------------------------------- small
def cert_json(info: CertInfo) -> dict[str, Any]:
    """A certificate's public facts as JSON-ready values."""
    return {
        "subject": info.subject,
        "issuer": info.issuer,
        "serial": f"{info.serial:x}",
        "notBefore": iso_utc(info.not_before),
        "notAfter": iso_utc(info.not_after),
        "dnsNames": list(info.dns_names),
        "ipAddresses": list(info.ip_addresses),
        "isCA": info.is_ca,
        "keyAlgorithm": info.key_algorithm,
        "fingerprintSHA256": info.fingerprint_sha256,
    }


def _encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode("ascii") for k, v in data.items()}


def _names(info: CertInfo) -> list[str]:
    return [*info.dns_names, *info.ip_addresses]
