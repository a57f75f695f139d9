"""The in-repo admission fixtures are an exact copy of the shared captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ADMISSION_FIXTURES, REPO_ROOT

SHARED = REPO_ROOT.parent / "shared" / "fixtures" / "admission"


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared checkout beside this clone")
def test_admission_fixture_copy_matches_shared() -> None:
    shared = {p.name: p.read_bytes() for p in SHARED.iterdir() if p.is_file()}
    ours = {p.name: p.read_bytes() for p in ADMISSION_FIXTURES.iterdir() if p.is_file()}
    assert ours == shared, "re-copy ../shared/fixtures/admission into tests/fixtures/admission"


def test_every_fixture_is_an_admission_review() -> None:
    import json

    names = sorted(Path(ADMISSION_FIXTURES).glob("*.json"))
    # one per row of the README tables (two UPDATE captures share a row)
    assert len(names) == 17
    for path in names:
        review = json.loads(path.read_text())
        assert review["apiVersion"] == "admission.k8s.io/v1", path.name
        assert review["kind"] == "AdmissionReview", path.name
        assert review["request"]["uid"], path.name


EXTENDER_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "scheduler-extender"
SHARED_EXTENDER = REPO_ROOT.parent / "shared" / "fixtures" / "scheduler-extender"


@pytest.mark.skipif(not SHARED_EXTENDER.is_dir(), reason="no ../shared checkout beside this clone")
def test_scheduler_extender_fixture_copy_matches_shared() -> None:
    shared = {p.name: p.read_bytes() for p in SHARED_EXTENDER.iterdir() if p.is_file()}
    ours = {p.name: p.read_bytes() for p in EXTENDER_FIXTURES.iterdir() if p.is_file()}
    assert ours == shared, (
        "re-copy ../shared/fixtures/scheduler-extender into tests/fixtures/scheduler-extender"
    )
