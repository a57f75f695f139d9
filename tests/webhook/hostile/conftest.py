"""Fixtures of the hostile-client suite: one serving pair for 127.0.0.1, per module."""

from __future__ import annotations

import datetime as dt

import pytest

from certs.files import BundlePaths, generate_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> BundlePaths:
    return generate_bundle(
        tmp_path_factory.mktemp("tls"),
        now=dt.datetime.now(dt.UTC),
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
    )
