"""certs.kube: which credentials metagpu uses, and how it reads an API error's body.

``load_credentials`` is shared by bootstrap, the webhook's namespace cache and
the node agent, so a pod never runs as two identities. The in-cluster loader
reads fixed paths under ``/var/run/secrets``; it is replaced here by one that
answers from the ``environ`` it is given, the way the real one decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException

from certs.bootstrap import BootstrapError
from certs.kube import KubeCredentialsError, load_credentials, open_api_client, status_fields

IN_CLUSTER_HOST = "https://10.96.0.1:443"
IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


@pytest.fixture(autouse=True)
def fake_in_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def load_incluster_config(
        client_configuration: client.Configuration, environ: dict[str, str], **_: Any
    ) -> None:
        if "KUBERNETES_SERVICE_HOST" not in environ:
            raise ConfigException("Service host/port is not set.")
        client_configuration.host = IN_CLUSTER_HOST

    monkeypatch.setattr("certs.kube.config.load_incluster_config", load_incluster_config)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config of the machine's user


async def test_in_cluster_comes_before_kubeconfig_from_the_environment(tmp_path: Path) -> None:
    file = kubeconfig(tmp_path / "kubeconfig", "https://from-kubeconfig:6443")
    cfg = client.Configuration()
    source = await load_credentials(cfg, env={**IN_CLUSTER, "KUBECONFIG": str(file)})
    assert source == "in-cluster service account"
    assert cfg.host == IN_CLUSTER_HOST


async def test_a_kubeconfig_given_explicitly_wins(tmp_path: Path) -> None:
    file = kubeconfig(tmp_path / "kubeconfig", "https://from-kubeconfig:6443")
    cfg = client.Configuration()
    source = await load_credentials(cfg, kubeconfig=file, env=IN_CLUSTER)
    assert source == f"kubeconfig {file}"
    assert cfg.host == "https://from-kubeconfig:6443"


async def test_outside_a_pod_kubeconfig_from_the_environment(tmp_path: Path) -> None:
    file = kubeconfig(tmp_path / "kubeconfig", "https://from-kubeconfig:6443")
    cfg = client.Configuration()
    assert await load_credentials(cfg, env={"KUBECONFIG": str(file)}) == f"kubeconfig {file}"
    assert cfg.host == "https://from-kubeconfig:6443"


async def test_open_api_client_yields_a_client_with_those_credentials(tmp_path: Path) -> None:
    file = kubeconfig(tmp_path / "kubeconfig", "https://from-kubeconfig:6443")
    async with open_api_client(kubeconfig=file) as (api, source):
        assert source == f"kubeconfig {file}"
        assert api.configuration.host == "https://from-kubeconfig:6443"


@pytest.mark.parametrize(
    ("contents", "expected"),
    [
        pytest.param(
            None,
            [
                "no Kubernetes credentials",
                "no in-cluster service account (Service host/port is not set.)",
                "no kubeconfig file at ~/.kube/config",
            ],
            id="nothing",
        ),
        pytest.param(
            "this is not a kubeconfig", ["cannot use kubeconfig", "TypeError"], id="garbage"
        ),
    ],
)
async def test_no_usable_credentials_say_what_was_tried(
    tmp_path: Path, contents: str | None, expected: list[str]
) -> None:
    env = {}
    if contents is not None:
        (tmp_path / "kubeconfig").write_text(contents)
        env["KUBECONFIG"] = str(tmp_path / "kubeconfig")
    with pytest.raises(KubeCredentialsError) as err:
        await load_credentials(client.Configuration(), env=env)
    for text in expected:
        assert text in str(err.value)
    # bootstrap reports it like its own failures, and callers of the old type still catch it
    assert isinstance(err.value, BootstrapError)


async def test_an_unreadable_service_account_token_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def load_incluster_config(**_: Any) -> None:
        raise PermissionError(13, "Permission denied", "/var/run/secrets/.../token")

    monkeypatch.setattr("certs.kube.config.load_incluster_config", load_incluster_config)
    with pytest.raises(KubeCredentialsError, match=r"no in-cluster service account .*Permission"):
        await load_credentials(client.Configuration(), env=IN_CLUSTER)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            b'{"kind": "Status", "message": "nope", "reason": "Forbidden"}',
            ("nope", "Forbidden"),
            id="status",
        ),
        pytest.param(
            b'{"kind": "Status", "reason": "NotFound"}',
            ('{"kind": "Status", "reason": "NotFound"}', ""),
            id="no-message",
        ),
        pytest.param(b"<html>bad gateway</html>\n", ("<html>bad gateway</html>", ""), id="html"),
        pytest.param(b"[1, 2]", ("[1, 2]", ""), id="not-an-object"),
        pytest.param(b"x" * 300, ("x" * 200, ""), id="truncated"),
    ],
)
def test_status_fields(body: bytes, expected: tuple[str, str]) -> None:
    assert status_fields(body) == expected
