"""certs.bootstrap: the pure decision (what to re-issue, and why) and the caBundle plan."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from certs.bootstrap import (
    CA_CERT_KEY,
    CA_KEY_KEY,
    DEFAULT_CA_COMMON_NAME,
    DEFAULT_CA_OVERLAP,
    TLS_CERT_KEY,
    TLS_KEY_KEY,
    BundleDecision,
    IssuePolicy,
    WebhookConfigError,
    choose_ca_bundle,
    decide_bundle,
    format_duration,
    parse_replaced_at,
    plan_ca_bundle,
    render_bundle,
    selected_ca_bundles,
)
from certs.issue import (
    CertError,
    CertPair,
    inspect_cert,
    issue_ca,
    issue_serving_cert,
    key_matches,
    load_private_key,
    new_private_key,
    split_certificates,
    verify_chain,
)
from tests.certs.chains import SCHEMES, Chain, Scheme, build_chain
from tests.certs.conftest import SERVICE_NAMES, T0
from tests.certs.malformed import FAULTS, Fault, malformed_leaf

POLICY = IssuePolicy(dns_names=SERVICE_NAMES)
Bundle = dict[str, bytes]


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    """A freshly rendered, valid bundle issued at T0."""
    decision = decide_bundle(None, policy=POLICY, now=T0)
    return render_bundle(None, decision, policy=POLICY, now=T0)


def other_ca_leaf(names: tuple[str, ...] = SERVICE_NAMES) -> tuple[bytes, bytes]:
    ca = issue_ca(key=new_private_key(), now=T0)
    leaf = issue_serving_cert(ca=ca, key=new_private_key(), now=T0, dns_names=names)
    return leaf.cert_pem, leaf.key_pem


# ------------------------------------------------------------ the decision
def test_nothing_there_yet_creates_both() -> None:
    empty: list[Bundle | None] = [None, {}]
    for current in empty:
        d = decide_bundle(current, policy=POLICY, now=T0)
        assert (d.ca, d.leaf) == ("replace", "issue")
        assert d.summary() == "new CA and serving certificate"


def test_a_fresh_bundle_needs_nothing(bundle: Bundle) -> None:
    d = decide_bundle(bundle, policy=POLICY, now=T0)
    assert d == BundleDecision("keep", "keep")
    assert not d.changes
    assert "nothing to do" in d.summary()


def _drop(key: str) -> Callable[[Bundle], Bundle]:
    return lambda b: {k: v for k, v in b.items() if k != key}


def _set(key: str, value: bytes | Callable[[Bundle], bytes]) -> Callable[[Bundle], Bundle]:
    return lambda b: {**b, key: value(b) if callable(value) else value}


def _leaf_from_other_ca(b: Bundle) -> Bundle:
    cert, key = other_ca_leaf()
    return {**b, TLS_CERT_KEY: cert, TLS_KEY_KEY: key}


def _other_names(b: Bundle) -> Bundle:
    leaf = issue_serving_cert(
        ca=_ca(b), key=new_private_key(), now=T0, dns_names=(*SERVICE_NAMES, "old.example.com")
    )
    return {**b, TLS_CERT_KEY: leaf.cert_pem, TLS_KEY_KEY: leaf.key_pem}


def _fewer_names(b: Bundle) -> Bundle:
    leaf = issue_serving_cert(ca=_ca(b), key=new_private_key(), now=T0, dns_names=SERVICE_NAMES[:2])
    return {**b, TLS_CERT_KEY: leaf.cert_pem, TLS_KEY_KEY: leaf.key_pem}


def _rsa_leaf(b: Bundle) -> Bundle:
    leaf = issue_serving_cert(
        ca=_ca(b), key=new_private_key("rsa-2048"), now=T0, dns_names=SERVICE_NAMES
    )
    return {**b, TLS_CERT_KEY: leaf.cert_pem, TLS_KEY_KEY: leaf.key_pem}


def _a_ca_as_leaf(b: Bundle) -> Bundle:
    return {**b, TLS_CERT_KEY: b[CA_CERT_KEY], TLS_KEY_KEY: b[CA_KEY_KEY]}


def _not_a_ca(b: Bundle) -> Bundle:
    return {**b, CA_CERT_KEY: b[TLS_CERT_KEY], CA_KEY_KEY: b[TLS_KEY_KEY]}


def _ca(b: Bundle) -> CertPair:
    return CertPair(b[CA_CERT_KEY], b[CA_KEY_KEY])


@pytest.mark.parametrize(
    ("mutate", "ca", "leaf", "reason"),
    [
        pytest.param(_drop(CA_CERT_KEY), "replace", "issue", "no CA certificate", id="no-ca-crt"),
        pytest.param(_drop(CA_KEY_KEY), "replace", "issue", "no CA key", id="no-ca-key"),
        pytest.param(
            _set(CA_CERT_KEY, b"junk"), "replace", "issue", "ca.crt is unreadable", id="ca-junk"
        ),
        pytest.param(
            _set(CA_KEY_KEY, b"junk"), "replace", "issue", "ca.key is unreadable", id="ca-key-junk"
        ),
        pytest.param(
            _set(CA_KEY_KEY, lambda b: b[TLS_KEY_KEY]),
            "replace",
            "issue",
            "ca.key is not the key of ca.crt",
            id="ca-key-mismatch",
        ),
        pytest.param(_not_a_ca, "replace", "issue", "not a CA certificate", id="ca-not-a-ca"),
        pytest.param(_drop(TLS_CERT_KEY), "keep", "issue", "no serving certificate", id="no-leaf"),
        pytest.param(_drop(TLS_KEY_KEY), "keep", "issue", "no serving key", id="no-leaf-key"),
        pytest.param(
            _set(TLS_CERT_KEY, b"junk"), "keep", "issue", "tls.crt is unreadable", id="leaf-junk"
        ),
        pytest.param(
            _set(TLS_KEY_KEY, lambda b: b[CA_KEY_KEY]),
            "keep",
            "issue",
            "tls.key is not the key of tls.crt",
            id="leaf-key-mismatch",
        ),
        pytest.param(
            _leaf_from_other_ca, "keep", "issue", "was not signed by the CA", id="foreign-leaf"
        ),
        pytest.param(
            _other_names,
            "keep",
            "issue",
            "no longer asked for: old.example.com",
            id="extra-name",
        ),
        pytest.param(
            _fewer_names,
            "keep",
            "issue",
            "names missing from tls.crt: metagpu-webhook.metagpu.svc, "
            "metagpu-webhook.metagpu.svc.cluster.local",
            id="missing-service-names",
        ),
        pytest.param(_rsa_leaf, "keep", "issue", "key is rsa-2048, ecdsa-p256", id="algorithm"),
        pytest.param(_a_ca_as_leaf, "keep", "issue", "not a serving certificate", id="ca-as-leaf"),
    ],
)
def test_what_is_wrong_decides_what_is_reissued(
    bundle: Bundle, mutate: Callable[[Bundle], Bundle], ca: str, leaf: str, reason: str
) -> None:
    d = decide_bundle(mutate(bundle), policy=POLICY, now=T0)
    assert (d.ca, d.leaf) == (ca, leaf)
    assert reason in " | ".join(d.ca_reasons + d.leaf_reasons)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_certificate_that_breaks_when_read_is_replaced_not_a_crash(
    bundle: Bundle, fault: Fault
) -> None:
    """A malformed extension or key (say, from a user's own PKI) reads as "unreadable"."""
    leaf_pem = malformed_leaf(
        _ca(bundle), load_private_key(bundle[TLS_KEY_KEY]), now=T0, fault=fault
    )
    current = {**bundle, TLS_CERT_KEY: leaf_pem}
    d = decide_bundle(current, policy=POLICY, now=T0)
    assert (d.ca, d.leaf) == ("keep", "issue")
    assert "tls.crt is unreadable: certificate is malformed" in d.leaf_reasons[0]
    new = render_bundle(current, d, policy=POLICY, now=T0)
    verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=T0)

    ca_pem = malformed_leaf(
        _ca(bundle),
        load_private_key(bundle[CA_KEY_KEY]),
        now=T0,
        fault=fault,
        common_name=DEFAULT_CA_COMMON_NAME,
    )
    current = {**bundle, CA_CERT_KEY: ca_pem}
    d = decide_bundle(current, policy=POLICY, now=T0)
    assert (d.ca, d.leaf) == ("replace", "issue")
    assert "ca.crt is unreadable: certificate is malformed" in d.ca_reasons[0]
    new = render_bundle(current, d, policy=POLICY, now=T0)
    verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=T0)


@pytest.fixture(scope="module")
def adopted() -> dict[Scheme, Chain]:
    """Secrets someone else filled (cert-manager, their own PKI), one per signature scheme:
    a CA of that scheme and a serving certificate it signed, for exactly the names and
    with the key type bootstrap is asked for, so only the chain check can object."""
    return {
        scheme: build_chain(
            scheme, now=T0, dns_names=SERVICE_NAMES, ip_addresses=(), leaf_key=new_private_key()
        )
        for scheme in SCHEMES
    }


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_adopted_chain_of_any_signature_scheme_is_kept_and_a_forgery_reissued(
    adopted: dict[Scheme, Chain], scheme: Scheme
) -> None:
    """Issue 31: bootstrap replaced a working Ed25519 CA (its key was "unsupported") and
    re-issued an RSA-PSS-signed leaf ("not signed by the CA"). Both are kept now, the
    CA is renewed and signs with its own key type, and a forged leaf is re-issued with
    the reason."""
    chain = adopted[scheme]
    current = {
        CA_CERT_KEY: chain.ca.cert_pem,
        CA_KEY_KEY: chain.ca.key_pem,
        TLS_CERT_KEY: chain.leaf.cert_pem,
        TLS_KEY_KEY: chain.leaf.key_pem,
    }
    d = decide_bundle(current, policy=POLICY, now=T0)
    assert (d.ca, d.leaf) == ("keep", "keep"), d

    forged = {**current, TLS_CERT_KEY: chain.forged}
    d = decide_bundle(forged, policy=POLICY, now=T0)
    assert (d.ca, d.leaf) == ("keep", "issue")
    assert d.leaf_reasons[0].startswith("tls.crt was not signed by the CA in ca.crt: ")
    assert "signature does not verify with its" in d.leaf_reasons[0]
    new = render_bundle(forged, d, policy=POLICY, now=T0)
    assert new[CA_CERT_KEY] == chain.ca.cert_pem
    verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=T0)

    renewed = render_bundle(current, BundleDecision("renew", "keep"), policy=POLICY, now=T0)
    assert renewed[CA_CERT_KEY] != chain.ca.cert_pem
    verify_chain(chain.leaf.cert_pem, renewed[CA_CERT_KEY], now=T0)


def test_ca_missing_but_leaf_present_recreates_both(bundle: Bundle) -> None:
    current = {TLS_CERT_KEY: bundle[TLS_CERT_KEY], TLS_KEY_KEY: bundle[TLS_KEY_KEY]}
    d = decide_bundle(current, policy=POLICY, now=T0)
    assert (d.ca, d.leaf) == ("replace", "issue")
    new = render_bundle(current, d, policy=POLICY, now=T0)
    assert new[TLS_CERT_KEY] != bundle[TLS_CERT_KEY]
    verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=T0)
    assert key_matches(new[CA_CERT_KEY], new[CA_KEY_KEY])


@pytest.mark.parametrize(
    ("offset_s", "leaf"),
    [
        pytest.param(-1, "keep", id="one-second-before"),
        pytest.param(0, "keep", id="at-boundary"),
        pytest.param(1, "issue", id="one-second-after"),
    ],
)
def test_leaf_renewal_boundary_keeps_the_ca(bundle: Bundle, offset_s: int, leaf: str) -> None:
    boundary = inspect_cert(bundle[TLS_CERT_KEY]).renew_at(POLICY.renew_fraction)
    now = boundary + dt.timedelta(seconds=offset_s)
    d = decide_bundle(bundle, policy=POLICY, now=now)
    assert (d.ca, d.leaf) == ("keep", leaf)
    if leaf == "issue":
        assert "due for renewal" in d.leaf_reasons[0]
        new = render_bundle(bundle, d, policy=POLICY, now=now)
        assert new[CA_CERT_KEY] == bundle[CA_CERT_KEY]
        assert new[CA_KEY_KEY] == bundle[CA_KEY_KEY]
        assert new[TLS_CERT_KEY] != bundle[TLS_CERT_KEY]
        verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=now)


@pytest.mark.parametrize(
    ("offset_s", "ca"),
    [
        pytest.param(-1, "keep", id="one-second-before"),
        pytest.param(0, "keep", id="at-boundary"),
        pytest.param(1, "renew", id="one-second-after"),
    ],
)
def test_ca_renewal_boundary_reuses_the_key(bundle: Bundle, offset_s: int, ca: str) -> None:
    boundary = inspect_cert(bundle[CA_CERT_KEY]).renew_at(POLICY.renew_fraction)
    now = boundary + dt.timedelta(seconds=offset_s)
    d = decide_bundle(bundle, policy=POLICY, now=now)
    assert d.ca == ca
    if ca == "renew":
        assert "CA is due for renewal" in d.ca_reasons[0]
        new = render_bundle(bundle, d, policy=POLICY, now=now)
        assert new[CA_KEY_KEY] == bundle[CA_KEY_KEY]  # the same key, byte for byte
        assert new[CA_CERT_KEY] != bundle[CA_CERT_KEY]
        old_ca, new_ca = inspect_cert(bundle[CA_CERT_KEY]), inspect_cert(new[CA_CERT_KEY])
        assert new_ca.subject == old_ca.subject
        assert new_ca.not_after > old_ca.not_after
        verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=now)
        verify_chain(new[TLS_CERT_KEY], bundle[CA_CERT_KEY], now=now)  # old caBundle works too


def test_an_expired_ca_is_renewed_and_the_leaf_reissued(bundle: Bundle) -> None:
    now = inspect_cert(bundle[CA_CERT_KEY]).not_after + dt.timedelta(seconds=1)
    d = decide_bundle(bundle, policy=POLICY, now=now)
    assert (d.ca, d.leaf) == ("renew", "issue")
    assert "CA expired at" in d.ca_reasons[0]
    assert any("tls.crt expired at" in r for r in d.leaf_reasons)
    new = render_bundle(bundle, d, policy=POLICY, now=now)
    verify_chain(new[TLS_CERT_KEY], new[CA_CERT_KEY], now=now)
    assert not decide_bundle(new, policy=POLICY, now=now).changes


def test_force_and_new_ca(bundle: Bundle) -> None:
    forced = decide_bundle(bundle, policy=POLICY, now=T0, force_leaf=True)
    assert (forced.ca, forced.leaf, forced.leaf_reasons) == (
        "keep",
        "issue",
        ("re-issue was forced",),
    )
    fresh = decide_bundle(bundle, policy=POLICY, now=T0, new_ca=True)
    assert (fresh.ca, fresh.leaf) == ("replace", "issue")
    new = render_bundle(bundle, fresh, policy=POLICY, now=T0)
    assert new[CA_KEY_KEY] != bundle[CA_KEY_KEY]


def test_a_different_key_algorithm_keeps_the_ca_with_a_note(bundle: Bundle) -> None:
    policy = IssuePolicy(dns_names=SERVICE_NAMES, algorithm="ecdsa-p384")
    d = decide_bundle(bundle, policy=policy, now=T0)
    assert (d.ca, d.leaf) == ("keep", "issue")
    assert "the CA key is ecdsa-p256" in d.notes[0]
    new = render_bundle(bundle, d, policy=policy, now=T0)
    assert inspect_cert(new[TLS_CERT_KEY]).key_algorithm == "ecdsa-p384"
    assert not decide_bundle(new, policy=policy, now=T0).changes


def test_policy_normalises_names_and_rejects_nonsense() -> None:
    p = IssuePolicy(dns_names=("A.example", "a.example"), ip_addresses=("::0001",))
    assert (p.dns_names, p.ip_addresses) == (("a.example",), ("::1",))
    with pytest.raises(CertError, match="at least one"):
        IssuePolicy(dns_names=())
    with pytest.raises(CertError, match="between 0 and 1"):
        IssuePolicy(dns_names=("x",), renew_fraction=1.5)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(42, "42s", id="seconds"),
        pytest.param(3 * 60 + 5, "3m 5s", id="minutes"),
        pytest.param(5 * 3600 + 3 * 60, "5h 3m", id="hours"),
        pytest.param(364 * 86400 + 23 * 3600, "364d 23h", id="days"),
        pytest.param(-(2 * 86400 + 3600), "-2d 1h", id="negative"),
    ],
)
def test_format_duration(seconds: int, text: str) -> None:
    assert format_duration(dt.timedelta(seconds=seconds)) == text


# -------------------------------------------------------------- the caBundle
def webhook_config(**bundles: str | None) -> dict[str, Any]:
    hooks = []
    for name, bundle in bundles.items():
        client: dict[str, Any] = {"service": {"name": "svc", "namespace": "ns"}}
        if bundle is not None:
            client["caBundle"] = bundle
        hooks.append({"name": name.replace("_", "."), "clientConfig": client})
    return {"metadata": {"name": "metagpu", "resourceVersion": "42"}, "webhooks": hooks}


CA_PEM = b"-----BEGIN CERTIFICATE-----\nours\n-----END CERTIFICATE-----\n"
OURS = base64.b64encode(CA_PEM).decode()


@pytest.mark.parametrize(
    ("config", "only", "stale"),
    [
        pytest.param(webhook_config(a=None, b=None), (), ("a", "b"), id="empty-bundles"),
        pytest.param(webhook_config(a=OURS, b="b2xk"), (), ("b",), id="one-stale"),
        pytest.param(webhook_config(a=OURS, b=OURS), (), (), id="in-sync"),
        pytest.param(webhook_config(a="!!not-base64", b=OURS), (), ("a",), id="junk-bundle"),
        pytest.param(webhook_config(a=None, b=None), ("b",), ("b",), id="only-selected"),
    ],
)
def test_plan_patches_only_selected_webhooks_that_differ(
    config: dict[str, Any], only: tuple[str, ...], stale: tuple[str, ...]
) -> None:
    plan = plan_ca_bundle(config, CA_PEM, only=only)
    assert plan.stale == stale
    if not stale:
        assert plan.patch is None
        return
    assert plan.patch == {
        "metadata": {"resourceVersion": "42"},
        "webhooks": [{"name": n, "clientConfig": {"caBundle": OURS}} for n in stale],
    }


@pytest.mark.parametrize(
    ("config", "only", "expected"),
    [
        pytest.param(
            webhook_config(a=None),
            ("pods.metagpu.io",),
            "no webhook named 'pods.metagpu.io'; it has: a",
            id="unknown-webhook",
        ),
        pytest.param({"metadata": {"name": "m"}, "webhooks": []}, (), "has no webhooks", id="none"),
        pytest.param(
            {
                "metadata": {
                    "name": "m",
                    "annotations": {"cert-manager.io/inject-ca-from": "ns/cert"},
                },
                "webhooks": [{"name": "a"}],
            },
            (),
            "cert-manager.io/inject-ca-from=ns/cert",
            id="owned-by-cainjector",
        ),
    ],
)
def test_plan_refuses_configs_it_must_not_touch(
    config: dict[str, Any], only: tuple[str, ...], expected: str
) -> None:
    with pytest.raises(WebhookConfigError) as err:
        plan_ca_bundle(config, CA_PEM, only=only)
    assert expected in str(err.value)


# ------------------------------------------------- caBundle overlap after a CA replacement
@pytest.fixture(scope="module")
def three_cas() -> tuple[bytes, bytes, bytes]:
    """``(current, replaced, foreign)`` CA certificates."""
    return tuple(  # type: ignore[return-value]
        issue_ca(key=new_private_key(), now=T0, common_name=f"ca-{i}").cert_pem for i in range(3)
    )


JUNK_BLOCK = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
KEY_BLOCK = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
OVERLAP = DEFAULT_CA_OVERLAP


@pytest.mark.parametrize(
    ("replaced_at", "kept"),
    [
        pytest.param(None, False, id="no-replacement-recorded"),
        pytest.param(T0, True, id="just-replaced"),
        pytest.param(T0 - OVERLAP + dt.timedelta(seconds=1), True, id="last-second-of-overlap"),
        pytest.param(T0 - OVERLAP, False, id="overlap-over"),
        pytest.param(T0 + dt.timedelta(seconds=30), True, id="replaced-by-a-clock-30s-ahead"),
        pytest.param(T0 + OVERLAP, False, id="replaced-at-far-in-the-future"),
    ],
)
def test_choose_ca_bundle_keeps_replaced_cas_only_within_the_overlap(
    three_cas: tuple[bytes, bytes, bytes], replaced_at: dt.datetime | None, kept: bool
) -> None:
    current, replaced, foreign = three_cas
    bundles = [replaced + foreign + JUNK_BLOCK, current + replaced, KEY_BLOCK + b"stray text"]
    choice = choose_ca_bundle(current, bundles, replaced_at=replaced_at, now=T0)
    others = [inspect_cert(replaced), inspect_cert(foreign)]
    assert choice.unreadable == 3  # the broken certificate, the key, the stray text
    if kept:
        assert choice.pem == current + replaced + foreign  # ours first, then in order, once
        assert choice.previous == tuple(others)
        assert choice.removed == ()
        assert replaced_at is not None
        assert choice.overlap_until == replaced_at + OVERLAP
    else:
        assert choice.pem == current  # exactly ca.crt, as before replacements kept anything
        assert choice.previous == ()
        assert choice.removed == tuple(others)
        assert choice.overlap_until is None


def test_choose_ca_bundle_is_a_fixed_point(three_cas: tuple[bytes, bytes, bytes]) -> None:
    """Feeding its own output back changes nothing: a second run writes nothing."""
    current, replaced, _ = three_cas
    first = choose_ca_bundle(current, [replaced], replaced_at=T0, now=T0)
    again = choose_ca_bundle(current, [first.pem], replaced_at=T0, now=T0 + dt.timedelta(minutes=5))
    assert again.pem == first.pem
    settled = choose_ca_bundle(current, [current], replaced_at=T0, now=T0)
    assert settled.pem == current
    assert settled.overlap_until is None


def test_selected_ca_bundles_reads_only_selected_decodable_bundles() -> None:
    config = webhook_config(a=OURS, b="!!junk", c=None, d=OURS)
    assert selected_ca_bundles(config) == [CA_PEM, CA_PEM]
    assert selected_ca_bundles(config, only=("d", "b")) == [CA_PEM]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("2030-01-01T12:00:00+00:00", T0, id="iso-utc"),
        pytest.param("2030-01-01T12:00:00Z", T0, id="zulu"),
        pytest.param("2030-01-01T13:00:00+01:00", T0, id="other-zone"),
        pytest.param("2030-01-01T12:00:00", None, id="no-zone"),
        pytest.param("yesterday", None, id="not-a-time"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_parse_replaced_at(value: str | None, expected: dt.datetime | None) -> None:
    assert parse_replaced_at(value) == expected


def test_split_certificates_never_raises_and_counts_what_it_skips(
    three_cas: tuple[bytes, bytes, bytes],
) -> None:
    current, replaced, _ = three_cas
    certs, unreadable = split_certificates(
        b"# comment\n" + current + JUNK_BLOCK + replaced.replace(b"\n", b"\r\n") + KEY_BLOCK
    )
    assert certs == (current, replaced)  # canonical PEM, whatever the line endings were
    assert unreadable == 3
    assert split_certificates(b"") == ((), 0)
