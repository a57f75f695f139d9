"""Property tests for the pure certificate code (issue, inspect, decide).

Kept apart from the example tests, as yarl keeps ``test_quoting_hypothesis.py``.
Keys are made once at import: generating one per example would test
cryptography's key generation, not our code, and slow the run down.
"""

from __future__ import annotations

import datetime as dt
import ipaddress

from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from certs.bootstrap import IssuePolicy, decide_bundle, render_bundle
from certs.issue import (
    CLOCK_SKEW,
    inspect_cert,
    issue_ca,
    issue_serving_cert,
    new_private_key,
    should_renew,
    verify_chain,
)

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
CA_KEY = new_private_key()
LEAF_KEY = new_private_key()
CA = issue_ca(key=CA_KEY, now=T0)
CA_INFO = inspect_cert(CA.cert_pem)
LEAF_INFO = inspect_cert(issue_serving_cert(ca=CA, key=LEAF_KEY, now=T0, dns_names=["x"]).cert_pem)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

labels = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,12}[a-zA-Z0-9])?", fullmatch=True)
dns_names = st.builds(
    lambda wildcard, parts: ("*." if wildcard and len(parts) > 1 else "") + ".".join(parts),
    st.booleans(),
    st.lists(labels, min_size=1, max_size=4),
)
ip_texts = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str)
instants = st.datetimes(
    min_value=dt.datetime(2030, 1, 1),
    max_value=dt.datetime(2035, 1, 1),
    timezones=st.just(dt.UTC),
).map(lambda d: d.replace(microsecond=0))  # X.509 times have whole seconds


def dedupe(values: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


@SETTINGS
@given(
    dns=st.lists(dns_names, max_size=8),
    ips=st.lists(ip_texts, max_size=6),
)
@example(dns=["A.example", "a.example"], ips=["::ffff:10.0.0.1", "10.0.0.1"])
def test_random_san_sets_round_trip(dns: list[str], ips: list[str]) -> None:
    if not dns and not ips:
        dns = ["only.name"]
    leaf = issue_serving_cert(ca=CA, key=LEAF_KEY, now=T0, dns_names=dns, ip_addresses=ips)
    info = inspect_cert(leaf.cert_pem)
    note(f"sans: {info.dns_names} {info.ip_addresses}")
    assert info.dns_names == dedupe([d.lower() for d in dns])
    assert info.ip_addresses == dedupe([str(ipaddress.ip_address(i)) for i in ips])


@SETTINGS
@given(now=instants, validity_days=st.integers(min_value=1, max_value=4000))
def test_pem_parses_back_to_the_same_facts(now: dt.datetime, validity_days: int) -> None:
    validity = dt.timedelta(days=validity_days)
    leaf = issue_serving_cert(
        ca=CA, key=LEAF_KEY, now=now, dns_names=["svc.ns.svc"], validity=validity
    )
    info = inspect_cert(leaf.cert_pem)
    assert info.not_before == now - CLOCK_SKEW
    assert info.not_after == min(now + validity, CA_INFO.not_after)
    assert info.not_after <= CA_INFO.not_after  # never outlives its CA
    assert info.issuer == CA_INFO.subject
    assert info.subject == "CN=svc.ns.svc"
    assert not info.is_ca
    assert info.server_auth
    assert info.key_algorithm == "ecdsa-p256"
    assert inspect_cert(leaf.cert_pem) == info  # parsing is deterministic
    verify_chain(leaf.cert_pem, CA.cert_pem, now=now)


@SETTINGS
@given(
    a=st.integers(min_value=-(10**7), max_value=4 * 10**7),
    b=st.integers(min_value=-(10**7), max_value=4 * 10**7),
    fraction=st.floats(min_value=0.01, max_value=0.99),
)
def test_renewal_once_due_stays_due(a: int, b: int, fraction: float) -> None:
    info = LEAF_INFO
    early, late = sorted((T0 + dt.timedelta(seconds=a), T0 + dt.timedelta(seconds=b)))
    if should_renew(info, now=early, fraction=fraction):
        assert should_renew(info, now=late, fraction=fraction)
    assert should_renew(info, now=info.renew_at(fraction), fraction=fraction) is False


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dns=st.lists(dns_names, min_size=1, max_size=5),
    ips=st.lists(ip_texts, max_size=3),
    elapsed_s=st.integers(min_value=0, max_value=200 * 86400),
)
def test_a_rendered_bundle_needs_nothing_until_due(
    dns: list[str], ips: list[str], elapsed_s: int
) -> None:
    """Idempotence of the decision: what render_bundle wrote, decide_bundle keeps."""
    policy = IssuePolicy(dns_names=tuple(dns), ip_addresses=tuple(ips))
    first = decide_bundle(None, policy=policy, now=T0)
    data = render_bundle(None, first, policy=policy, now=T0, new_key=lambda _: LEAF_KEY)
    later = T0 + dt.timedelta(seconds=elapsed_s)
    again = decide_bundle(data, policy=policy, now=later)
    assert not again.changes, again.summary()
