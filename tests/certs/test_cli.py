"""``metagpu certs generate | bootstrap | inspect`` as an operator runs them: a real process.

Each test starts ``python -m metagpu.cli certs ...`` as a subprocess (so
logging set-up, ``asyncio.run`` and exit codes are the real ones) while the
fake API server or a TLS server runs in the test's event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import ssl
import stat
import sys
from pathlib import Path

import pytest

from certs import cli
from certs.issue import (
    KEY_ALGORITHMS,
    CertPair,
    inspect_cert,
    issue_ca,
    issue_serving_cert,
    new_private_key,
)
from tests.certs.chains import KEY_ALGORITHM, SCHEMES, SIGNATURE, Chain, Scheme
from tests.conftest import REPO_ROOT
from tests.harness.kube_api import FakeKubeApi

NS = "metagpu"
SECRET = "metagpu-webhook-tls"
CONFIG = "metagpu"


async def metagpu(
    *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
) -> tuple[int, str, str]:
    """Run ``metagpu ARGS`` in a subprocess; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metagpu.cli",
        *args,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_cli_module_stays_light_and_mirrors_the_key_algorithms() -> None:
    assert cli.KEY_ALGORITHMS == KEY_ALGORITHMS
    assert [c.name for c in cli.COMMANDS] == ["certs"]


async def test_certs_help_does_not_load_heavy_libraries() -> None:
    code = (
        "import sys, certs.cli; "
        "print([m for m in ('cryptography', 'kubernetes_asyncio', 'pydantic', 'aiohttp') "
        "if m in sys.modules])"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert out.decode().strip() == "[]"


# ----------------------------------------------------------------- generate
async def test_generate_writes_the_bundle_and_then_keeps_it(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    rc, stdout, _ = await metagpu(
        "certs", "generate", "--out", str(out), "--dns", "dev.example.com", "--ip", "10.1.2.3"
    )
    assert rc == 0, stdout
    assert "new CA and serving certificate" in stdout
    for name, mode in (
        ("ca.crt", 0o644),
        ("ca.key", 0o600),
        ("tls.crt", 0o644),
        ("tls.key", 0o600),
    ):
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name
    info = inspect_cert((out / "tls.crt").read_bytes())
    assert (info.dns_names, info.ip_addresses) == (("dev.example.com",), ("10.1.2.3",))
    ca_before = (out / "ca.crt").read_bytes()
    rc, stdout, _ = await metagpu(
        "certs", "generate", "--out", str(out), "--dns", "dev.example.com", "--ip", "10.1.2.3",
        "-o", "json",
    )  # fmt: skip
    assert rc == 0
    report = json.loads(stdout)
    assert (report["caAction"], report["leafAction"], report["written"]) == ("keep", "keep", [])
    rc, stdout, _ = await metagpu("certs", "generate", "--out", str(out), "--force")
    assert rc == 0
    assert "names in tls.crt no longer asked for" in stdout  # localhost is the default again
    assert (out / "ca.crt").read_bytes() == ca_before


async def test_generate_for_a_service_and_bad_settings(tmp_path: Path) -> None:
    rc, _, _ = await metagpu(
        "certs", "generate", "--out", str(tmp_path), "--service", "wh", "--namespace", "ns"
    )
    assert rc == 0
    names = inspect_cert((tmp_path / "tls.crt").read_bytes()).dns_names
    assert names == ("wh", "wh.ns", "wh.ns.svc", "wh.ns.svc.cluster.local")
    rc, _, err = await metagpu("certs", "generate", "--out", str(tmp_path), "--service", "wh")
    assert rc == 2
    assert "service and namespace go together" in err
    rc, _, err = await metagpu(
        "certs", "generate", "--out", str(tmp_path), "--validity-days", "4000"
    )
    assert rc == 2
    assert "must not exceed ca_validity_days" in err
    rc, _, err = await metagpu(
        "certs", "generate", "--dns", "x.example", env={"METAGPU_CERTS_OUT": str(tmp_path / "e")}
    )
    assert rc == 0
    assert (tmp_path / "e" / "tls.crt").exists()


# ---------------------------------------------------------------- bootstrap
@pytest.fixture
async def api_with_config(kube_api: tuple[FakeKubeApi, str], kube_config_env: Path) -> FakeKubeApi:
    fake, _ = kube_api
    fake.put(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIG},
            "webhooks": [
                {
                    "name": "pods.metagpu.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "clientConfig": {"service": {"name": "metagpu-webhook", "namespace": NS}},
                }
            ],
        }
    )
    return fake


BOOTSTRAP = ("certs", "bootstrap", "--namespace", NS, "--webhook-config", CONFIG)


async def test_bootstrap_first_and_second_run_exit_0_and_the_second_writes_nothing(
    api_with_config: FakeKubeApi,
) -> None:
    rc, stdout, stderr = await metagpu(*BOOTSTRAP)
    assert rc == 0, stderr
    assert f'secret "{SECRET}" in namespace "{NS}": created' in stdout
    assert "caBundle patched in pods.metagpu.io" in stdout
    writes = len(api_with_config.writes())
    rc, stdout, stderr = await metagpu(*BOOTSTRAP, "-o", "json")
    assert rc == 0, stderr
    report = json.loads(stdout)
    assert report["secret"]["action"] == "unchanged"
    assert report["webhookConfiguration"] == {
        "name": CONFIG,
        "patched": [],
        "inSync": ["pods.metagpu.io"],
        "previousCAs": [],
        "previousCAsUntil": None,
        "removedCAs": [],
        "removedUnreadable": 0,
    }
    assert len(api_with_config.writes()) == writes
    assert "PRIVATE KEY" not in stdout + stderr


async def test_bootstrap_forbidden_exits_1_naming_what_is_needed(
    api_with_config: FakeKubeApi,
) -> None:
    api_with_config.forbid("patch", "mutatingwebhookconfigurations")
    rc, _, stderr = await metagpu(*BOOTSTRAP)
    assert rc == 1
    assert "metagpu certs bootstrap: error: cannot patch " in stderr
    assert "needs verb patch on mutatingwebhookconfigurations" in stderr
    assert "Traceback" not in stderr
    assert api_with_config.get("v1", "Secret", SECRET, NS) is None


@pytest.mark.parametrize(
    ("extra", "env", "rc", "expected"),
    [
        pytest.param(("--webhook-config", "nope"), {}, 1, '"nope" not found', id="config-missing"),
        pytest.param(("--dns", "bad name"), {}, 2, "'bad name'", id="bad-dns-flag"),
        pytest.param(
            (),
            {"METAGPU_CERTS_NAMESPACE": "Bad_NS"},
            2,
            "from env METAGPU_CERTS_NAMESPACE",
            id="bad-namespace-env",
        ),
        pytest.param(
            (),
            {"KUBECONFIG": "/nonexistent/kubeconfig"},
            1,
            "no Kubernetes credentials",
            id="no-credentials",
        ),
    ],
)
async def test_bootstrap_error_exit_codes(
    api_with_config: FakeKubeApi, extra: tuple[str, ...], env: dict[str, str], rc: int,
    expected: str,
) -> None:  # fmt: skip
    args = ["certs", "bootstrap", "--webhook-config", CONFIG, *extra]
    if "METAGPU_CERTS_NAMESPACE" not in env:
        args += ["--namespace", NS]
    code, _, stderr = await metagpu(*args, env=env)
    assert code == rc, stderr
    assert expected in stderr
    assert api_with_config.writes() == []


# ------------------------------------------------------------------ inspect
@pytest.fixture(scope="module")
def live_pair() -> tuple[CertPair, CertPair]:
    now = dt.datetime.now(dt.UTC)
    ca = issue_ca(key=new_private_key(), now=now)
    leaf = issue_serving_cert(
        ca=ca,
        key=new_private_key(),
        now=now,
        dns_names=["metagpu-webhook.metagpu.svc"],
        ip_addresses=["127.0.0.1"],
    )
    return ca, leaf


async def test_inspect_a_file_with_checks(
    tmp_path: Path, live_pair: tuple[CertPair, CertPair]
) -> None:
    ca, leaf = live_pair
    for name, data in (
        ("ca.crt", ca.cert_pem),
        ("tls.crt", leaf.cert_pem),
        ("tls.key", leaf.key_pem),
    ):
        (tmp_path / name).write_bytes(data)
    rc, stdout, _ = await metagpu(
        "certs", "inspect", str(tmp_path / "tls.crt"), "--ca", str(tmp_path / "ca.crt"),
        "--key", str(tmp_path / "tls.key"), "--server-name", "metagpu-webhook.metagpu.svc",
    )  # fmt: skip
    assert rc == 0, stdout
    info = inspect_cert(leaf.cert_pem)
    assert f"serial:       {info.serial:x}" in stdout
    assert "renewal due:  no" in stdout
    assert "check chain: OK" in stdout
    assert "check key: OK" in stdout
    assert "PRIVATE" not in stdout
    other = issue_ca(key=new_private_key(), now=dt.datetime.now(dt.UTC), common_name="other")
    (tmp_path / "other.crt").write_bytes(other.cert_pem)
    rc, stdout, _ = await metagpu(
        "certs", "inspect", "-", "--ca", str(tmp_path / "other.crt"), "-o", "json",
        stdin=leaf.cert_pem,
    )  # fmt: skip
    assert rc == 1
    report = json.loads(stdout)
    assert report["source"] == "stdin"
    assert report["certificates"][0]["dnsNames"] == ["metagpu-webhook.metagpu.svc"]
    assert {c["name"]: c["ok"] for c in report["checks"]} == {"validity": True, "chain": False}


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_inspect_ca_accepts_every_signature_scheme_and_says_why_a_forgery_fails(
    tmp_path: Path, chains: dict[Scheme, Chain], scheme: Scheme
) -> None:
    """Issue 31: ``inspect tls.crt --ca ca.crt`` said FAIL for good Ed25519 and RSA-PSS
    chains. Every scheme passes; a leaf signed by another key of the same type fails,
    and the report says that its signature does not verify with the CA's key."""
    chain = chains[scheme]
    for name, data in (
        ("ca.crt", chain.ca.cert_pem),
        ("tls.crt", chain.leaf.cert_pem),
        ("tls.key", chain.leaf.key_pem),
        ("forged.crt", chain.forged),
    ):
        (tmp_path / name).write_bytes(data)
    ca = str(tmp_path / "ca.crt")
    (rc, stdout, stderr), (forged_rc, forged_out, _) = await asyncio.gather(
        metagpu(
            "certs", "inspect", str(tmp_path / "tls.crt"), "--ca", ca,
            "--key", str(tmp_path / "tls.key"), "--server-name", "localhost",
        ),
        metagpu("certs", "inspect", str(tmp_path / "forged.crt"), "--ca", ca, "-o", "json"),
    )  # fmt: skip
    assert rc == 0, stdout + stderr
    assert "check chain: OK — signed by the given CA" in stdout
    assert "check key: OK" in stdout
    assert f"key:          {KEY_ALGORITHM[scheme]}" in stdout
    assert f"signed with:  {SIGNATURE[scheme]}" in stdout
    assert forged_rc == 1
    checks = {c["name"]: c for c in json.loads(forged_out)["checks"]}
    assert checks["validity"]["ok"]
    assert not checks["chain"]["ok"]
    assert "signature does not verify with its" in checks["chain"]["detail"]
    assert "would be accepted" in checks["chain"]["detail"]


async def test_inspect_an_expired_file_exits_1(tmp_path: Path) -> None:
    then = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    ca = issue_ca(key=new_private_key(), now=then)
    leaf = issue_serving_cert(
        ca=ca, key=new_private_key(), now=then, dns_names=["x"], validity=dt.timedelta(days=1)
    )
    (tmp_path / "tls.crt").write_bytes(leaf.cert_pem)
    rc, stdout, _ = await metagpu("certs", "inspect", str(tmp_path / "tls.crt"))
    assert rc == 1
    assert "EXPIRED" in stdout
    assert "check validity: FAIL — certificate expired at" in stdout
    assert "renewal due:  yes" in stdout


async def test_inspect_url_shows_what_is_served_and_verifies_like_a_client(
    tmp_path: Path, live_pair: tuple[CertPair, CertPair]
) -> None:
    ca, leaf = live_pair
    (tmp_path / "tls.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "tls.key").write_bytes(leaf.key_pem)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    other = issue_ca(key=new_private_key(), now=dt.datetime.now(dt.UTC), common_name="other")
    (tmp_path / "other.crt").write_bytes(other.cert_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    svc = "metagpu-webhook.metagpu.svc"
    async with server:
        rc, stdout, stderr = await metagpu(
            "certs", "inspect", "--url", url, "--ca", str(tmp_path / "ca.crt"),
            "--server-name", svc,
        )  # fmt: skip
        assert rc == 0, stdout + stderr
        assert f"serial:       {inspect_cert(leaf.cert_pem).serial:x}" in stdout
        assert f"check handshake: OK — a client trusting {tmp_path / 'ca.crt'} accepts it" in stdout
        rc, stdout, _ = await metagpu(
            "certs", "inspect", "--url", url, "--ca", str(tmp_path / "other.crt"),
            "--server-name", svc, "-o", "json",
        )  # fmt: skip
        assert rc == 1
        checks = {c["name"]: c for c in json.loads(stdout)["checks"]}
        assert not checks["handshake"]["ok"]
        assert "unable to get local issuer certificate" in checks["handshake"]["detail"]
        rc, stdout, _ = await metagpu(
            "certs", "inspect", "--url", url, "--server-name", "other.metagpu.svc"
        )
        assert rc == 1
        assert "check name: FAIL — other.metagpu.svc is not among" in stdout
    rc, _, stderr = await metagpu("certs", "inspect", "--url", url, "--timeout-s", "2")
    assert rc == 1
    assert "cannot connect to 127.0.0.1" in stderr


async def test_inspect_needs_exactly_one_source() -> None:
    rc, _, stderr = await metagpu("certs", "inspect")
    assert rc == 2
    assert "give a certificate FILE" in stderr
    rc, _, stderr = await metagpu("certs", "inspect", "--url", "http://x:1")
    assert rc == 1
    assert "https://host:port" in stderr
