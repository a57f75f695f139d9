"""``metagpu certs bootstrap``: make the cluster match the decision, safely and idempotently.

Order, chosen so a failure leaves nothing half-applied where that is avoidable:

1. With ``--webhook-config``: read the configuration first. Missing, owned by
   cert-manager, or without the named webhooks → stop before writing anything.
2. The Secret: read, decide (:func:`certs.bootstrap.decide_bundle`), and write
   only if something changes (create, or update with its resourceVersion).
   When a configuration is managed and the write *replaces* the CA (a new
   key), the caBundle is patched first to trust the new CA *and* every
   certificate it trusted before (re-read just before, so the patch carries a
   fresh resourceVersion): the webhook pods serve the old certificate until
   the kubelet refreshes the mounted Secret, and the API server must accept
   both meanwhile. The Secret update records the moment in
   :data:`certs.bootstrap.ANNOTATION_CA_REPLACED_AT`. When the write only
   *renews* the CA (same key), a server-side dry-run of the caBundle patch
   goes first instead, so a missing ``patch`` permission fails *before* the
   Secret holds a CA that the configuration would never learn about.
3. The caBundle: :func:`certs.bootstrap.choose_ca_bundle` says what it must
   hold (``ca.crt``, plus the replaced CAs while the overlap after a
   replacement lasts); patch only the selected webhooks whose caBundle
   differs, with the configuration's resourceVersion as a precondition. A run
   after the overlap removes the replaced CAs, and logs what it removed.

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
    ANNOTATION_CA_REPLACED_AT,
    BUNDLE_KEYS,
    CA_CERT_KEY,
    DEFAULT_CA_OVERLAP,
    TLS_CERT_KEY,
    BootstrapError,
    BundleDecision,
    CaBundleChoice,
    IssuePolicy,
    choose_ca_bundle,
    decide_bundle,
    parse_replaced_at,
    plan_ca_bundle,
    render_bundle,
    selected_ca_bundles,
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
    ca_bundle: CaBundleChoice | None = None
    """What the caBundle holds (or would hold) besides ``ca.crt``, and what was removed."""
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
            lines += self._ca_bundle_lines()
        return "\n".join(lines)

    def _ca_bundle_lines(self) -> list[str]:
        choice = self.ca_bundle
        if choice is None:
            return []
        lines = []
        if choice.previous and choice.overlap_until is not None:
            lines.append(
                "  caBundle also trusts, while webhook pods pick up the new CA: "
                + "; ".join(_cert_ref(c) for c in choice.previous)
                + f" — the first run after {iso_utc(choice.overlap_until)} removes them"
            )
        removed = "would be removed" if self.dry_run else "removed"
        if choice.removed:
            lines.append(
                f"  caBundle: {removed} (not the Secret's CA): "
                + "; ".join(_cert_ref(c) for c in choice.removed)
            )
        if choice.unreadable:
            lines.append(
                f"  caBundle: {removed} {choice.unreadable} part(s) that are not certificates"
            )
        return lines

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
                **_ca_bundle_json(self.ca_bundle),
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
    ca_overlap: dt.timedelta
    webhook_config: Obj | None = field(default=None)


@dataclass(frozen=True)
class _SecretOutcome:
    decision: BundleDecision
    action: SecretAction
    data: dict[str, bytes]
    now: dt.datetime
    replaced_at: dt.datetime | None
    """The Secret's :data:`ANNOTATION_CA_REPLACED_AT` after this run (or the one it would have)."""
    patched: tuple[str, ...] = ()
    """Webhooks whose caBundle was patched before the Secret was written."""


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
    ca_overlap: dt.timedelta = DEFAULT_CA_OVERLAP,
) -> BootstrapResult:
    """Ensure the Secret, then the caBundle; see the module docstring for the order.

    ``ca_overlap``: how long after a CA replacement the caBundle keeps the
    replaced CAs (see :data:`certs.bootstrap.DEFAULT_CA_OVERLAP`).
    """
    opts = _Options(
        policy,
        clock,
        force_leaf,
        new_ca,
        dry_run,
        retry or RetryPolicy(),
        sleep,
        new_key,
        ca_overlap,
    )
    if target.webhook_config is not None:
        opts.webhook_config = await _with_retries(
            opts, f"read {target.webhook_config}", lambda: _read_webhook_config(api, target)
        )
    outcome = await _with_retries(
        opts, f"ensure secret {target.secret}", lambda: _ensure_secret(api, target, opts)
    )
    data = outcome.data
    result = BootstrapResult(
        target=target,
        decision=outcome.decision,
        secret_action=outcome.action,
        ca=inspect_cert(data[CA_CERT_KEY]),
        leaf=inspect_cert(data[TLS_CERT_KEY]),
        dry_run=dry_run,
    )
    if target.webhook_config is None:
        return result
    first = True

    async def patch_once() -> tuple[tuple[str, ...], tuple[str, ...], CaBundleChoice]:
        nonlocal first
        config = opts.webhook_config
        if config is None or not first:
            config = await _read_webhook_config(api, target)
        first = False
        return await _ensure_ca_bundle(api, target, config, outcome, opts)

    patched, in_sync, choice = await _with_retries(
        opts, f"patch caBundle of {target.webhook_config}", patch_once
    )
    return replace(
        result,
        patched_webhooks=tuple(dict.fromkeys((*outcome.patched, *patched))),
        webhooks_in_sync=tuple(n for n in in_sync if n not in outcome.patched),
        ca_bundle=choice,
    )


# --------------------------------------------------------------- the Secret
async def _ensure_secret(
    api: ClusterApi, target: BootstrapTarget, opts: _Options
) -> _SecretOutcome:
    ref = {"namespace": target.namespace, "secret": target.secret}
    secret = await api.get_secret(target.namespace, target.secret)
    if secret is not None:
        check_secret_usable(secret, target)
    current = decode_secret_data(secret) if secret is not None else None
    now = opts.clock()
    decision = decide_bundle(
        current, policy=opts.policy, now=now, force_leaf=opts.force_leaf, new_ca=opts.new_ca
    )
    replaced_at = _replaced_at(secret, ref)
    if not decision.changes:
        logger.info("TLS secret is up to date; nothing to write", extra=ref)
        assert current is not None
        data = {k: current[k] for k in BUNDLE_KEYS}
        return _SecretOutcome(decision, "unchanged", data, now, replaced_at)
    if secret is not None and secret.get("immutable"):
        raise BootstrapError(
            f'secret "{target.secret}" in namespace "{target.namespace}" is immutable but needs '
            f"a change ({decision.summary()}); delete it and run bootstrap again"
        )
    data = render_bundle(current, decision, policy=opts.policy, now=now, new_key=opts.new_key)
    action: SecretAction = "created" if secret is None else "updated"
    annotations: dict[str, str] = {}
    if decision.ca == "replace":
        replaced_at = now
        annotations[ANNOTATION_CA_REPLACED_AT] = iso_utc(now)
    outcome = _SecretOutcome(decision, action, data, now, replaced_at)
    if opts.dry_run:
        return outcome
    if decision.ca == "replace" and opts.webhook_config is not None:
        outcome = replace(outcome, patched=await _trust_new_ca_first(api, target, outcome, opts))
    elif decision.ca_bundle_changes and opts.webhook_config is not None:
        await _check_patch_allowed(api, target, opts.webhook_config, outcome, opts)
    if secret is None:
        await api.create_secret(target.namespace, new_secret(target, data, annotations=annotations))
    else:
        await api.replace_secret(
            target.namespace,
            target.secret,
            updated_secret(secret, data, annotations=annotations),
        )
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
    return outcome


def _replaced_at(secret: Obj | None, ref: Mapping[str, str]) -> dt.datetime | None:
    annotations = ((secret or {}).get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_CA_REPLACED_AT)
    when = parse_replaced_at(value)
    if value is not None and when is None:
        logger.warning(
            "annotation %s=%r is not an ISO 8601 time with a zone; ignoring it, so the "
            "caBundle is trimmed to the Secret's CA",
            ANNOTATION_CA_REPLACED_AT,
            value,
            extra=ref,
        )
    return when


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


def new_secret(
    target: BootstrapTarget,
    data: Mapping[str, bytes],
    *,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """The Secret bootstrap creates."""
    meta: Obj = {
        "name": target.secret,
        "namespace": target.namespace,
        "labels": dict(SECRET_LABELS),
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE_TLS,
        "metadata": meta,
        "data": _encode(data),
    }


def updated_secret(
    secret: Obj, data: Mapping[str, bytes], *, annotations: Mapping[str, str] | None = None
) -> Obj:
    """``secret`` with our keys (and ``annotations``) set; its resourceVersion makes the
    PUT conditional.

    Other keys, labels and annotations are kept. ``managedFields`` is left out
    so the API server keeps tracking field ownership itself.
    """
    body = {k: v for k, v in secret.items() if k != "stringData"}
    meta = {k: v for k, v in (secret.get("metadata") or {}).items() if k != "managedFields"}
    if annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
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


def _choose(
    config: Obj, target: BootstrapTarget, outcome: _SecretOutcome, opts: _Options
) -> CaBundleChoice:
    return choose_ca_bundle(
        outcome.data[CA_CERT_KEY],
        selected_ca_bundles(config, only=target.webhooks),
        replaced_at=outcome.replaced_at,
        now=outcome.now,
        overlap=opts.ca_overlap,
    )


async def _trust_new_ca_first(
    api: ClusterApi, target: BootstrapTarget, outcome: _SecretOutcome, opts: _Options
) -> tuple[str, ...]:
    """Patch the caBundle to the new CA + everything trusted now, before the Secret changes.

    Re-reads the configuration so the patch's resourceVersion is fresh (a 409
    here re-runs the whole Secret step, which renders yet another CA; the
    unused one stays trusted only until the overlap ends).
    """
    assert target.webhook_config is not None
    config = await _read_webhook_config(api, target)
    choice = _choose(config, target, outcome, opts)
    plan = plan_ca_bundle(config, choice.pem, only=target.webhooks)
    opts.webhook_config = config
    if plan.patch is None:
        return ()
    opts.webhook_config = await api.patch_webhook_config(target.webhook_config, plan.patch)
    ref = {"webhook_config": target.webhook_config, "webhooks": ",".join(plan.stale)}
    if choice.overlap_until is None:
        logger.info("caBundle now trusts the new CA; writing the Secret next", extra=ref)
    else:
        logger.info(
            "caBundle now trusts the new CA and, until %s, the %d certificate(s) it trusted "
            "before; writing the Secret next",
            iso_utc(choice.overlap_until),
            len(choice.previous),
            extra=ref,
        )
    return plan.stale


async def _check_patch_allowed(
    api: ClusterApi, target: BootstrapTarget, config: Obj, outcome: _SecretOutcome, opts: _Options
) -> None:
    plan = plan_ca_bundle(config, _choose(config, target, outcome, opts).pem, only=target.webhooks)
    if plan.patch is None or target.webhook_config is None:
        return
    patch = {k: v for k, v in plan.patch.items() if k != "metadata"}  # permission, not freshness
    await api.patch_webhook_config(target.webhook_config, patch, dry_run=True)


async def _ensure_ca_bundle(
    api: ClusterApi,
    target: BootstrapTarget,
    config: Obj,
    outcome: _SecretOutcome,
    opts: _Options,
) -> tuple[tuple[str, ...], tuple[str, ...], CaBundleChoice]:
    assert target.webhook_config is not None
    choice = _choose(config, target, outcome, opts)
    plan = plan_ca_bundle(config, choice.pem, only=target.webhooks)
    in_sync = tuple(n for n in plan.selected if n not in plan.stale)
    ref = {"webhook_config": target.webhook_config}
    if plan.patch is None:
        logger.info("caBundle already matches the CA", extra={**ref, "webhooks": in_sync})
        return (), in_sync, choice
    if not opts.dry_run:
        await api.patch_webhook_config(target.webhook_config, plan.patch)
        logger.info("caBundle patched", extra={**ref, "webhooks": ",".join(plan.stale)})
        if choice.removed or choice.unreadable:
            logger.info(
                "caBundle: removed %d certificate(s) that are not the Secret's CA (%s) and "
                "%d part(s) that are not certificates",
                len(choice.removed),
                "; ".join(_cert_ref(c) for c in choice.removed) or "none",
                choice.unreadable,
                extra=ref,
            )
    return plan.stale, in_sync, choice


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


def _cert_ref(info: CertInfo) -> str:
    """Which certificate, for people: subject, serial, fingerprint prefix."""
    return f"{info.subject} (serial {info.serial:x}, sha256 {info.fingerprint_sha256[:16]})"


def _ca_bundle_json(choice: CaBundleChoice | None) -> dict[str, Any]:
    if choice is None:
        return {}
    return {
        "previousCAs": [cert_json(c) for c in choice.previous],
        "previousCAsUntil": iso_utc(choice.overlap_until) if choice.overlap_until else None,
        "removedCAs": [cert_json(c) for c in choice.removed],
        "removedUnreadable": choice.unreadable,
    }


def _encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode("ascii") for k, v in data.items()}


def _names(info: CertInfo) -> list[str]:
    return [*info.dns_names, *info.ip_addresses]
