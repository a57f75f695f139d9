"""The in-repo DRA fixtures are an exact copy of the shared captures (as for admission)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO_ROOT
from tests.plugin.dra.fixtures import DRA_FIXTURES

SHARED = REPO_ROOT.parent / "shared" / "fixtures" / "dra"


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared checkout beside this clone")
def test_dra_fixture_copy_matches_shared() -> None:
    shared = {p.name: p.read_bytes() for p in SHARED.iterdir() if p.is_file()}
    ours = {p.name: p.read_bytes() for p in DRA_FIXTURES.iterdir() if p.is_file()}
    assert ours == shared, "re-copy ../shared/fixtures/dra into tests/fixtures/dra"
