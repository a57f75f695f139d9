"""The static manifests are the chart rendered with its defaults, and up to date with it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import kubernetes_validate
import pytest
import yaml

from tests.install.chart import NAMESPACE, REPO_ROOT, Obj, find, one, tool

SCRIPT: Final = REPO_ROOT / "scripts" / "render_manifests.py"
MANIFESTS: Final = REPO_ROOT / "manifests"


def load(name: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def test_manifests_are_up_to_date_with_the_chart() -> None:
    tool("helm")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, (
        "manifests/ is out of date with chart/: run `make manifests`\n"
        + result.stdout
        + result.stderr
    )


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        pytest.param("metagpu.yaml", "bootstrap", id="bootstrap"),
        pytest.param("metagpu-cert-manager.yaml", "cert-manager", id="cert-manager"),
    ],
)
def test_each_manifest_is_a_complete_install(name: str, mode: str) -> None:
    objects = load(name)
    namespace = objects[0]
    assert namespace["kind"] == "Namespace", (
        "the namespace comes first, so kubectl apply creates it first"
    )
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "DaemonSet", "MutatingWebhookConfiguration", "Service"} <= kinds
    # The device plugin and the agent, each in its own DaemonSet; only the agent's
    # pods get the host PID namespace.
    daemonsets = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in find(objects, "DaemonSet")
    }
    assert set(daemonsets) == {"metagpu-plugin", "metagpu-agent"}
    assert daemonsets["metagpu-agent"]["hostPID"] is True
    assert "hostPID" not in daemonsets["metagpu-plugin"]
    assert [c["name"] for c in daemonsets["metagpu-plugin"]["containers"]] == ["device-plugin"]
    assert [c["name"] for c in daemonsets["metagpu-agent"]["containers"]] == ["agent"]
    for obj in objects:
        if obj["kind"] in (
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "MutatingWebhookConfiguration",
        ):
            continue
        if obj["kind"] == "RoleBinding" and obj["metadata"]["namespace"] == "kube-system":
            assert obj["roleRef"]["name"] == "extension-apiserver-authentication-reader"
            continue
        assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
    if mode == "bootstrap":
        assert len(find(objects, "Job")) == 2
        assert not find(objects, "Certificate")
    else:
        assert len(find(objects, "Certificate")) == 2
        assert not find(objects, "Job")
        annotations = one(objects, "MutatingWebhookConfiguration")["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"].startswith(f"{NAMESPACE}/")


@pytest.mark.parametrize("name", ["metagpu.yaml", "metagpu-cert-manager.yaml"])
def test_no_manifest_carries_the_uninstall_cleanup(name: str) -> None:
    # kubectl knows no hooks: a post-delete Job in a static manifest would run at apply
    # time and strip the labels the agent is about to write.
    objects = load(name)
    assert not [
        o
        for o in objects
        if "delete" in o["metadata"].get("annotations", {}).get("helm.sh/hook", "")
        or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "cleanup"
    ]


def test_manifest_header_says_how_it_was_made() -> None:
    header = (MANIFESTS / "metagpu.yaml").read_text().splitlines()[:3]
    assert any("scripts/render_manifests.py" in line for line in header)
    assert any("do not edit" in line for line in header)


def test_namespace_object_validates() -> None:
    kubernetes_validate.validate(load("metagpu.yaml")[0], "1.35", strict=True)


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    # Proof that the up-to-date check can fail: run it against an edited copy.
    tool("helm")
    for path in MANIFESTS.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    stale = tmp_path / "metagpu.yaml"
    stale.write_text(stale.read_text().replace("replicas: 2", "replicas: 3"))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 1
    assert "-  replicas: 3" in result.stdout
    assert "out of date with chart/: metagpu.yaml" in result.stderr
    assert "make manifests" in result.stderr
