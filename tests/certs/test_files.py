"""certs.files: the directory form of the bundle (``metagpu certs generate``)."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from certs.bootstrap import BootstrapError, IssuePolicy
from certs.files import (
    BundlePaths,
    ensure_bundle_dir,
    generate_bundle,
    read_bundle_dir,
    write_atomic,
)
from certs.issue import inspect_cert, key_matches, verify_chain
from tests.certs.conftest import T0

POLICY = IssuePolicy(dns_names=("localhost",), ip_addresses=("127.0.0.1", "::1"))
FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key")


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {n: ((directory / n).read_bytes(), (directory / n).stat().st_mtime_ns) for n in FILES}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_run_writes_four_files_with_private_keys_0600(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    result = ensure_bundle_dir(out, policy=POLICY, now=T0)
    assert [p.name for p in result.written] == ["ca.key", "ca.crt", "tls.key", "tls.crt"]
    assert (mode(out / "ca.key"), mode(out / "tls.key")) == (0o600, 0o600)
    assert (mode(out / "ca.crt"), mode(out / "tls.crt")) == (0o644, 0o644)
    paths = result.paths
    assert paths == BundlePaths.in_dir(out)
    assert paths.ca_key_file == out / "ca.key"
    verify_chain(paths.cert_file.read_bytes(), paths.ca_file.read_bytes(), now=T0)
    assert key_matches(paths.cert_file.read_bytes(), paths.key_file.read_bytes())
    assert inspect_cert(paths.cert_file.read_bytes()).ip_addresses == ("127.0.0.1", "::1")


def test_second_run_writes_nothing(tmp_path: Path) -> None:
    ensure_bundle_dir(tmp_path, policy=POLICY, now=T0)
    before = snapshot(tmp_path)
    result = ensure_bundle_dir(tmp_path, policy=POLICY, now=T0 + dt.timedelta(days=30))
    assert result.written == ()
    assert not result.decision.changes
    assert snapshot(tmp_path) == before


def test_due_leaf_is_reissued_and_the_ca_reused(tmp_path: Path) -> None:
    ensure_bundle_dir(tmp_path, policy=POLICY, now=T0)
    before = snapshot(tmp_path)
    due = inspect_cert(before["tls.crt"][0]).renew_at(POLICY.renew_fraction)
    result = ensure_bundle_dir(tmp_path, policy=POLICY, now=due + dt.timedelta(seconds=1))
    assert [p.name for p in result.written] == ["tls.key", "tls.crt"]
    after = snapshot(tmp_path)
    assert after["ca.crt"] == before["ca.crt"]
    assert after["ca.key"] == before["ca.key"]
    verify_chain(after["tls.crt"][0], after["ca.crt"][0], now=due)


def test_new_names_force_and_new_ca(tmp_path: Path) -> None:
    ensure_bundle_dir(tmp_path, policy=POLICY, now=T0)
    ca_before = (tmp_path / "ca.crt").read_bytes()
    wider = IssuePolicy(dns_names=("localhost", "dev.example.com"))
    result = ensure_bundle_dir(tmp_path, policy=wider, now=T0)
    assert result.decision.leaf == "issue"
    assert "dev.example.com" in inspect_cert((tmp_path / "tls.crt").read_bytes()).dns_names
    forced = ensure_bundle_dir(tmp_path, policy=wider, now=T0, force_leaf=True)
    assert [p.name for p in forced.written] == ["tls.key", "tls.crt"]
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    replaced = ensure_bundle_dir(tmp_path, policy=wider, now=T0, new_ca=True)
    assert len(replaced.written) == 4
    assert (tmp_path / "ca.crt").read_bytes() != ca_before


def test_dry_run_decides_but_writes_nothing(tmp_path: Path) -> None:
    result = ensure_bundle_dir(tmp_path / "new", policy=POLICY, now=T0, dry_run=True)
    assert result.decision.changes
    assert result.written == ()
    assert not (tmp_path / "new").exists()


def test_a_bundle_without_ca_key_gets_a_new_ca(tmp_path: Path) -> None:
    """What the older generate_bundle wrote (no ca.key) is upgraded, not trusted blindly."""
    generate_bundle(tmp_path, now=T0, dns_names=["localhost"], ip_addresses=["127.0.0.1", "::1"])
    assert not (tmp_path / "ca.key").exists()
    result = ensure_bundle_dir(tmp_path, policy=POLICY, now=T0)
    assert (result.decision.ca, result.decision.leaf) == ("replace", "issue")
    assert "no CA key" in result.decision.ca_reasons[0]
    assert (tmp_path / "ca.key").exists()


def test_unreadable_and_oversized_files_are_errors_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").mkdir()
    with pytest.raises(BootstrapError, match=r"cannot read .*tls\.crt"):
        read_bundle_dir(tmp_path)
    (tmp_path / "tls.crt").rmdir()
    (tmp_path / "ca.crt").write_bytes(b"x" * (1 << 20 | 1))
    with pytest.raises(BootstrapError, match=r"ca\.crt is larger than"):
        ensure_bundle_dir(tmp_path, policy=POLICY, now=T0)


def test_write_atomic_replaces_and_sets_mode(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f"
    write_atomic(target, b"one", mode=0o600)
    write_atomic(target, b"two", mode=0o600)
    assert target.read_bytes() == b"two"
    assert mode(target) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["f"]  # no temp files left
