"""Fixtures for the certs tests: a fixed clock and a CA + serving pair made once per module.

Key generation is the slow part of these tests (kopf's ``certpkey`` fixture is
module-scoped for the same reason), so the pairs are built once per module
and tests that need their own build it explicitly.
"""

from __future__ import annotations

import datetime as dt

import pytest

from certs.issue import CertPair, issue_ca, issue_serving_cert, new_private_key, service_dns_names
from tests.certs.chains import SCHEMES, Chain, Scheme, build_chain

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
"""A fixed "now" for everything that does not go through a real TLS stack."""

SERVICE = "metagpu-webhook"
NAMESPACE = "metagpu"
SERVICE_NAMES = tuple(service_dns_names(SERVICE, NAMESPACE))


@pytest.fixture(scope="module")
def ca_pair() -> CertPair:
    return issue_ca(key=new_private_key(), now=T0)


@pytest.fixture(scope="module")
def leaf_pair(ca_pair: CertPair) -> CertPair:
    return issue_serving_cert(
        ca=ca_pair,
        key=new_private_key(),
        now=T0,
        dns_names=SERVICE_NAMES,
        ip_addresses=["10.0.0.7"],
    )


@pytest.fixture(scope="session")
def chains() -> dict[Scheme, Chain]:
    """One chain per signature scheme (:mod:`tests.certs.chains`), for ``localhost`` and
    ``127.0.0.1``, issued at the real time: the CLI and TLS tests check them with real clocks."""
    now = dt.datetime.now(dt.UTC)
    return {scheme: build_chain(scheme, now=now) for scheme in SCHEMES}
