"""What to do with a CA + serving-certificate bundle, decided without touching anything.

The same four keys live in a ``kubernetes.io/tls`` Secret (``metagpu certs
bootstrap``) and in a directory (``metagpu certs generate``)::

    ca.crt   the CA certificate: what goes into the webhook's caBundle
    ca.key   the CA's private key: kept so the CA stays stable across runs
    tls.crt  the serving certificate, signed by the CA
    tls.key  its private key

:func:`decide_bundle` looks at what is there now and says, with reasons, what
must change; :func:`render_bundle` produces the new contents. Both are pure:
the clock and the key generator are passed in, so every boundary is testable.

The rules, in the order they are checked:

* **The CA is stable.** It is kept while it is usable; it is *renewed*
  (a new certificate for the *same key and subject*) when it is due, expired or
  not yet valid, so serving certificates it signed before keep verifying
  against either CA certificate (cert-manager's ``rotationPolicy: Never``
  for CAs works the same way). It is *replaced* by a new key only when it
  cannot be used (missing, unreadable, key mismatch, not a CA) or when asked
  (``--new-ca``); then the serving certificate is re-issued too.
* **The serving certificate is re-issued only when needed:** missing,
  unreadable, key mismatch, not chaining to the CA, not a serving certificate,
  names different from the ones asked for, a different key algorithm than
  asked for, due for renewal, or asked (``--force``).

:func:`choose_ca_bundle` decides what the webhooks' ``caBundle`` must hold
(``ca.crt``, plus the CAs it replaced while their overlap lasts), and
:func:`plan_ca_bundle` which webhooks of a MutatingWebhookConfiguration need
it patched, and builds the patch.

**Replacing a CA drops nothing.** Webhook pods serve the old serving
certificate until the kubelet refreshes the mounted Secret (60-90 s), so the
API server must trust the old and the new CA for a while. Bootstrap patches a
caBundle of *new CA + every certificate it trusted before* before it writes the
Secret, and records the moment on the Secret (:data:`ANNOTATION_CA_REPLACED_AT`,
written in the same update as the new CA). Every later run keeps those extra
certificates while ``now`` is within :data:`DEFAULT_CA_OVERLAP` of that moment,
and removes them (with anything else that is not ``ca.crt``) after it. The
rule reads only the Secret, the configuration and the clock, so it is
deterministic: two runs in a row (a Helm hook, then the CronJob) cannot trim
early, and a run with nothing to do writes nothing.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from certs.issue import (
    DEFAULT_CA_VALIDITY,
    DEFAULT_LEAF_VALIDITY,
    DEFAULT_RENEW_FRACTION,
    CertError,
    CertInfo,
    CertPair,
    KeyAlgorithm,
    PrivateKey,
    common_name_of,
    inspect_cert,
    iso_utc,
    issue_ca,
    issue_serving_cert,
    issuer_problem,
    key_matches,
    load_private_key,
    new_private_key,
    normalize_dns_name,
    normalize_ip_address,
    should_renew,
    split_certificates,
    validity_problem,
)

CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
TLS_CERT_KEY: Final = "tls.crt"
TLS_KEY_KEY: Final = "tls.key"
BUNDLE_KEYS: Final = (CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY)

DEFAULT_CA_COMMON_NAME: Final = "metagpu-webhook-ca"

ANNOTATION_INJECT_CA_FROM: Final = "cert-manager.io/inject-ca-from"
"""cert-manager's cainjector owns the caBundle of a configuration annotated with this."""

ANNOTATION_CA_REPLACED_AT: Final = "metagpu.io/ca-replaced-at"
"""On the Secret: when bootstrap last put a *new* CA (a new key) into it, as
ISO 8601 UTC. Written in the same update as ``ca.crt``, so it can never
describe another CA than the one it travels with. Renewing the CA with its
key does not touch it: old serving certificates still verify then."""

DEFAULT_CA_OVERLAP: Final = dt.timedelta(minutes=10)
"""How long after a CA replacement the caBundle keeps trusting the CAs it
replaced. The kubelet refreshes a mounted Secret within its sync period plus
its cache TTL (60-90 s by default) and the webhook reloads within a second;
ten minutes leaves a wide margin for a slow node or a busy kubelet while
keeping a replaced (maybe compromised) CA trusted no longer than needed."""

CaAction = Literal["keep", "renew", "replace"]
LeafAction = Literal["keep", "issue"]


class BootstrapError(Exception):
    """Root of every bootstrap failure; ``str()`` is the operator-facing message."""


class WebhookConfigError(BootstrapError):
    """The MutatingWebhookConfiguration cannot take our caBundle (names, ownership)."""


@dataclass(frozen=True)
class IssuePolicy:
    """What the serving certificate must say and how long things live."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()
    leaf_validity: dt.timedelta = DEFAULT_LEAF_VALIDITY
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY
    algorithm: KeyAlgorithm = "ecdsa-p256"
    renew_fraction: float = DEFAULT_RENEW_FRACTION
    """Renew when less than this fraction of a certificate's lifetime is left."""
    ca_common_name: str = DEFAULT_CA_COMMON_NAME

    def __post_init__(self) -> None:
        # Normalise once so comparisons with a certificate's SANs are exact.
        dns = tuple(dict.fromkeys(normalize_dns_name(n) for n in self.dns_names))
        ips = tuple(dict.fromkeys(normalize_ip_address(ip) for ip in self.ip_addresses))
        if not dns and not ips:
            raise CertError("a serving certificate needs at least one DNS name or IP address")
        if not 0 < self.renew_fraction < 1:
            raise CertError(f"renew fraction must be between 0 and 1: {self.renew_fraction}")
        object.__setattr__(self, "dns_names", dns)
        object.__setattr__(self, "ip_addresses", ips)


@dataclass(frozen=True)
class BundleDecision:
    """What to do with the CA and with the serving certificate, and why."""

    ca: CaAction
    leaf: LeafAction
    ca_reasons: tuple[str, ...] = ()
    leaf_reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """Things worth telling the operator that change nothing (e.g. a CA key
    algorithm that differs from ``--key-algorithm``)."""

    @property
    def changes(self) -> bool:
        return self.ca != "keep" or self.leaf != "keep"

    @property
    def ca_bundle_changes(self) -> bool:
        """True when ``ca.crt`` (and so every caBundle) will be different."""
        return self.ca != "keep"

    def summary(self) -> str:
        """One line for logs and the command's output."""
        if not self.changes:
            return "CA and serving certificate are valid; nothing to do"
        if self.ca_reasons == ("none yet",):
            return "new CA and serving certificate"
        parts = []
        if self.ca == "replace":
            parts.append(f"new CA ({'; '.join(self.ca_reasons)})")
        elif self.ca == "renew":
            parts.append(f"CA renewed with its existing key ({'; '.join(self.ca_reasons)})")
        if self.leaf == "issue":
            parts.append(f"serving certificate re-issued ({'; '.join(self.leaf_reasons)})")
        return "; ".join(parts)


# ------------------------------------------------------------------ decide
def decide_bundle(
    current: Mapping[str, bytes] | None,
    *,
    policy: IssuePolicy,
    now: dt.datetime,
    force_leaf: bool = False,
    new_ca: bool = False,
) -> BundleDecision:
    """What must change so ``current`` (the four keys, or None) serves ``policy``."""
    data = current or {}
    if not any(data.get(k) for k in BUNDLE_KEYS):
        return BundleDecision("replace", "issue", ("none yet",), ("none yet",))
    ca_action, ca_reasons, notes = _decide_ca(data, policy=policy, now=now, new_ca=new_ca)
    if ca_action == "replace":
        return BundleDecision("replace", "issue", ca_reasons, ("the CA was replaced",), notes=notes)
    leaf_reasons = _leaf_problems(data, policy=policy, now=now, ca_kept=ca_action == "keep")
    if force_leaf:
        leaf_reasons.append("re-issue was forced")
    return BundleDecision(
        ca_action,
        "issue" if leaf_reasons else "keep",
        tuple(ca_reasons),
        tuple(leaf_reasons),
        notes=notes,
    )


def _decide_ca(
    data: Mapping[str, bytes], *, policy: IssuePolicy, now: dt.datetime, new_ca: bool
) -> tuple[CaAction, tuple[str, ...], tuple[str, ...]]:
    if new_ca:
        return "replace", ("a new CA was asked for",), ()
    cert_pem, key_pem = data.get(CA_CERT_KEY), data.get(CA_KEY_KEY)
    if not cert_pem:
        return "replace", (f"no CA certificate ({CA_CERT_KEY})",), ()
    if not key_pem:
        return "replace", (f"no CA key ({CA_KEY_KEY}), so the CA cannot sign",), ()
    try:
        info = inspect_cert(cert_pem)
    except CertError as exc:
        return "replace", (f"{CA_CERT_KEY} is unreadable: {exc}",), ()
    try:
        matches = key_matches(cert_pem, key_pem)
    except CertError as exc:
        return "replace", (f"{CA_KEY_KEY} is unreadable: {exc}",), ()
    if not matches:
        return "replace", (f"{CA_KEY_KEY} is not the key of {CA_CERT_KEY}",), ()
    if not info.is_ca:
        return "replace", (f"{CA_CERT_KEY} is not a CA certificate",), ()
    notes: tuple[str, ...] = ()
    if info.key_algorithm != policy.algorithm:
        notes = (
            f"the CA key is {info.key_algorithm}; the key algorithm {policy.algorithm} applies "
            "to new serving keys and to a new CA (--new-ca), the CA key is kept",
        )
    problem = validity_problem("CA", info, now=now)
    if problem is not None:
        return "renew", (problem,), notes
    if should_renew(info, now=now, fraction=policy.renew_fraction):
        return "renew", (_due_reason("CA", info, now, policy.renew_fraction),), notes
    return "keep", (), notes


def _leaf_problems(
    data: Mapping[str, bytes], *, policy: IssuePolicy, now: dt.datetime, ca_kept: bool
) -> list[str]:
    cert_pem, key_pem = data.get(TLS_CERT_KEY), data.get(TLS_KEY_KEY)
    if not cert_pem:
        return [f"no serving certificate ({TLS_CERT_KEY})"]
    if not key_pem:
        return [f"no serving key ({TLS_KEY_KEY})"]
    try:
        info = inspect_cert(cert_pem)
    except CertError as exc:
        return [f"{TLS_CERT_KEY} is unreadable: {exc}"]
    try:
        if not key_matches(cert_pem, key_pem):
            return [f"{TLS_KEY_KEY} is not the key of {TLS_CERT_KEY}"]
    except CertError as exc:
        return [f"{TLS_KEY_KEY} is unreadable: {exc}"]
    problems: list[str] = []
    if info.is_ca or not info.server_auth:
        problems.append(f"{TLS_CERT_KEY} is not a serving certificate (CA flag or no serverAuth)")
    # Issuer only, not validity: a CA renewed in this run keeps its subject and key,
    # so a certificate signed by the old CA certificate verifies against the new one.
    # The reason travels along, so a log says which CA, which key and which signature.
    not_issued = issuer_problem(cert_pem, data[CA_CERT_KEY])
    if not_issued is not None:
        problems.append(f"{TLS_CERT_KEY} was not signed by the CA in {CA_CERT_KEY}: {not_issued}")
    problem = validity_problem(TLS_CERT_KEY, info, now=now)
    if problem is not None:
        problems.append(problem)
    if ca_kept:
        ca_not_after = inspect_cert(data[CA_CERT_KEY]).not_after
        if info.not_after > ca_not_after:
            problems.append(f"{TLS_CERT_KEY} outlives its CA (expires {iso_utc(ca_not_after)})")
    problems += _name_problems(info, policy)
    if info.key_algorithm != policy.algorithm:
        problems.append(f"key is {info.key_algorithm}, {policy.algorithm} was asked for")
    if not problems and should_renew(info, now=now, fraction=policy.renew_fraction):
        problems.append(_due_reason("serving certificate", info, now, policy.renew_fraction))
    return problems


def _name_problems(info: CertInfo, policy: IssuePolicy) -> list[str]:
    have = {n.lower() for n in info.dns_names} | set(info.ip_addresses)
    want = set(policy.dns_names) | set(policy.ip_addresses)
    problems = []
    missing = [n for n in (*policy.dns_names, *policy.ip_addresses) if n not in have]
    extra = sorted(have - want)
    if missing:
        problems.append(f"names missing from {TLS_CERT_KEY}: {', '.join(missing)}")
    if extra:
        problems.append(f"names in {TLS_CERT_KEY} no longer asked for: {', '.join(extra)}")
    return problems


def _due_reason(what: str, info: CertInfo, now: dt.datetime, fraction: float) -> str:
    left = info.remaining(now)
    return (
        f"{what} is due for renewal: {format_duration(left)} of "
        f"{format_duration(info.lifetime)} left (renews with less than {fraction:.0%} left, "
        f"after {iso_utc(info.renew_at(fraction))})"
    )


# ------------------------------------------------------------------ render
def render_bundle(
    current: Mapping[str, bytes] | None,
    decision: BundleDecision,
    *,
    policy: IssuePolicy,
    now: dt.datetime,
    new_key: Callable[[KeyAlgorithm], PrivateKey] = new_private_key,
) -> dict[str, bytes]:
    """The four keys after ``decision``; unchanged values are the same bytes."""
    data = dict(current or {})
    if decision.ca == "replace":
        ca = issue_ca(
            key=new_key(policy.algorithm),
            now=now,
            common_name=policy.ca_common_name,
            validity=policy.ca_validity,
        )
        data[CA_CERT_KEY], data[CA_KEY_KEY] = ca.cert_pem, ca.key_pem
    elif decision.ca == "renew":
        old_cert, old_key = data[CA_CERT_KEY], data[CA_KEY_KEY]
        ca = issue_ca(
            key=load_private_key(old_key),
            now=now,
            common_name=common_name_of(old_cert) or policy.ca_common_name,
            validity=policy.ca_validity,
        )
        data[CA_CERT_KEY] = ca.cert_pem  # ca.key keeps its exact bytes
    if decision.leaf == "issue":
        leaf = issue_serving_cert(
            ca=CertPair(data[CA_CERT_KEY], data[CA_KEY_KEY]),
            key=new_key(policy.algorithm),
            now=now,
            dns_names=policy.dns_names,
            ip_addresses=policy.ip_addresses,
            validity=policy.leaf_validity,
        )
        data[TLS_CERT_KEY], data[TLS_KEY_KEY] = leaf.cert_pem, leaf.key_pem
    return {k: data[k] for k in BUNDLE_KEYS}


# --------------------------------------------------------------- caBundle
@dataclass(frozen=True)
class CaBundlePlan:
    """Which webhooks of a configuration need our caBundle, and the patch that sets it."""

    selected: tuple[str, ...]
    stale: tuple[str, ...]
    """Selected webhooks whose caBundle differs from ours: the ones to patch."""
    patch: dict[str, Any] | None
    """A strategic-merge patch (webhooks merge by ``name``) that carries the
    configuration's resourceVersion, so a concurrent change is a 409, not a
    lost update; None when nothing differs."""


def plan_ca_bundle(
    config: Mapping[str, Any], ca_bundle_pem: bytes, *, only: Sequence[str] = ()
) -> CaBundlePlan:
    """Decide which webhooks of ``config`` need ``ca_bundle_pem`` as their caBundle.

    ``only`` names the webhooks to manage (default: all of them). Raises
    :class:`WebhookConfigError` when a named webhook is absent, when the
    configuration has no webhooks, or when cert-manager's cainjector owns it.
    """
    meta = config.get("metadata") or {}
    name = meta.get("name", "?")
    inject = (meta.get("annotations") or {}).get(ANNOTATION_INJECT_CA_FROM)
    if inject:
        raise WebhookConfigError(
            f'mutatingwebhookconfigurations "{name}" is annotated '
            f"{ANNOTATION_INJECT_CA_FROM}={inject}: cert-manager's cainjector manages its "
            "caBundle and would undo ours. Use one mode: remove the annotation to let "
            "bootstrap manage it, or do not run bootstrap (certs.mode=cert-manager)"
        )
    webhooks = [w for w in config.get("webhooks") or [] if isinstance(w, Mapping)]
    names = [str(w.get("name", "")) for w in webhooks]
    if not webhooks:
        raise WebhookConfigError(f'mutatingwebhookconfigurations "{name}" has no webhooks')
    unknown = [n for n in only if n not in names]
    if unknown:
        raise WebhookConfigError(
            f'mutatingwebhookconfigurations "{name}" has no webhook named '
            f"{', '.join(repr(n) for n in unknown)}; it has: {', '.join(names)}"
        )
    selected = tuple(dict.fromkeys(only)) if only else tuple(names)
    wanted = base64.b64encode(ca_bundle_pem).decode("ascii")
    stale = tuple(
        str(w["name"])
        for w in webhooks
        if w.get("name") in selected
        and _decoded((w.get("clientConfig") or {}).get("caBundle")) != ca_bundle_pem
    )
    if not stale:
        return CaBundlePlan(selected, (), None)
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": meta.get("resourceVersion")},
        "webhooks": [{"name": n, "clientConfig": {"caBundle": wanted}} for n in stale],
    }
    if not patch["metadata"]["resourceVersion"]:
        del patch["metadata"]
    return CaBundlePlan(selected, stale, patch)


@dataclass(frozen=True)
class CaBundleChoice:
    """What the caBundle must hold, and which certificates that keeps or drops."""

    pem: bytes
    """``ca.crt``, followed while the overlap lasts by the certificates it replaced."""
    previous: tuple[CertInfo, ...] = ()
    """Certificates trusted besides ``ca.crt``, because a CA replacement is recent."""
    removed: tuple[CertInfo, ...] = ()
    """Certificates in the current caBundles that ``pem`` no longer holds."""
    unreadable: int = 0
    """Parts of the current caBundles that are not certificates (dropped always)."""
    overlap_until: dt.datetime | None = None
    """When ``previous`` stops being kept; None outside an overlap."""


def choose_ca_bundle(
    ca_pem: bytes,
    current: Iterable[bytes],
    *,
    replaced_at: dt.datetime | None,
    now: dt.datetime,
    overlap: dt.timedelta = DEFAULT_CA_OVERLAP,
) -> CaBundleChoice:
    """The caBundle for ``ca_pem`` (the Secret's ``ca.crt``), given the selected
    webhooks' ``current`` caBundles.

    Within ``overlap`` of ``replaced_at`` (either side, so a few seconds of
    clock skew between two Jobs cannot end it early) every certificate of the
    current caBundles stays trusted after ``ca_pem``: the webhook pods may
    still serve a certificate one of them signed. Outside it, the caBundle is
    ``ca_pem`` alone, so foreign or replaced CAs do not stay trusted forever.
    Parts that are not certificates are dropped in both cases: the API server
    cannot use them.
    """
    ours, _ = split_certificates(ca_pem)
    seen = {inspect_cert(c).fingerprint_sha256 for c in ours}
    others: list[bytes] = []
    infos: list[CertInfo] = []
    unreadable = 0
    for bundle in current:
        certs, bad = split_certificates(bundle)
        unreadable += bad
        for cert in certs:
            info = inspect_cert(cert)
            if info.fingerprint_sha256 not in seen:
                seen.add(info.fingerprint_sha256)
                others.append(cert)
                infos.append(info)
    if replaced_at is None or abs(now - replaced_at) >= overlap or not others:
        return CaBundleChoice(ca_pem, removed=tuple(infos), unreadable=unreadable)
    head = ca_pem if ca_pem.endswith(b"\n") else ca_pem + b"\n"
    return CaBundleChoice(
        head + b"".join(others),
        previous=tuple(infos),
        unreadable=unreadable,
        overlap_until=replaced_at + overlap,
    )


def selected_ca_bundles(config: Mapping[str, Any], *, only: Sequence[str] = ()) -> list[bytes]:
    """The decoded caBundles of the selected webhooks (all when ``only`` is empty);
    absent or non-base64 ones are skipped."""
    out = []
    for hook in config.get("webhooks") or []:
        if not isinstance(hook, Mapping) or (only and hook.get("name") not in only):
            continue
        value = _decoded((hook.get("clientConfig") or {}).get("caBundle"))
        if value:
            out.append(value)
    return out


def parse_replaced_at(value: object) -> dt.datetime | None:
    """:data:`ANNOTATION_CA_REPLACED_AT`'s time, or None when absent or not an
    ISO 8601 time with a zone (then no overlap applies)."""
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def _decoded(value: object) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


# ------------------------------------------------------------------ small
def format_duration(delta: dt.timedelta) -> str:
    """``364d 23h``, ``5h 3m``, ``42s``; negative as ``-2d 1h`` (expired)."""
    seconds = int(delta.total_seconds())
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d {hours}h"
    if hours:
        return f"{sign}{hours}h {minutes}m"
    if minutes:
        return f"{sign}{minutes}m {secs}s"
    return f"{sign}{secs}s"
