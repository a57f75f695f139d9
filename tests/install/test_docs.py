"""docs/install.md covers what the issue promises operators, and every chart value."""

from __future__ import annotations

import re
from typing import Final

import pytest
import yaml

from tests.install.chart import CHART_DIR, REPO_ROOT

INSTALL_DOC: Final = REPO_ROOT / "docs" / "install.md"

# Values whose children are free-form maps/lists: documented as one entry.
FREE_FORM: Final = {
    "resources",
    "nodeSelector",
    "podAnnotations",
    "podLabels",
    "labels",
    "commonLabels",
    "affinity",
    "updateStrategy",
    "extraConfig",
    "issuerRef",
}


def documented_paths(values: dict[str, object], prefix: tuple[str, ...] = ()) -> list[str]:
    paths = []
    for key, value in values.items():
        path = (*prefix, key)
        if isinstance(value, dict) and value and key not in FREE_FORM:
            paths.extend(documented_paths(value, path))
        else:
            paths.append(".".join(path))
    return paths


def doc() -> str:
    assert INSTALL_DOC.is_file(), "docs/install.md is missing"
    return INSTALL_DOC.read_text()


def test_every_chart_value_is_in_the_configuration_reference() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    text = doc()
    reference = text.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([^`]+)` \|", reference, flags=re.MULTILINE))
    missing = [p for p in documented_paths(values) if p not in rows]
    assert not missing, f"docs/install.md configuration reference lacks: {missing}"
    stale = rows - set(documented_paths(values))
    assert not stale, f"docs/install.md documents values the chart does not have: {sorted(stale)}"


@pytest.mark.parametrize(
    "heading",
    [
        "## Install with Helm",
        "### Without cert-manager",
        "### With cert-manager",
        "## Install with kubectl (static manifests)",
        "## Prepare the GPU nodes",
        "## Configuration reference",
        "## Upgrade",
        "## Uninstall",
        "## Troubleshooting",
        '### "My pod is pending"',
        '### "UnexpectedAdmissionError"',
        '### "Webhook denied"',
        '### "Certificate errors"',
        "## Building the image",
    ],
)
def test_install_guide_has_section(heading: str) -> None:
    assert re.search(rf"^{re.escape(heading)}", doc(), flags=re.MULTILINE), heading


@pytest.mark.parametrize(
    "text",
    [
        "helm install metagpu ./chart -n metagpu --create-namespace",
        "--set certs.mode=cert-manager",
        "kubectl apply --server-side -f manifests/metagpu.yaml",
        "kubectl label node gpu-node-1 accelerator=nvidia",
        "kubectl taint node gpu-node-1 cnvrg.io/metagpu=present:NoSchedule",
        "helm upgrade metagpu ./chart",
        "helm uninstall metagpu",
        "make image",
        "container engine",
        "make image-archive",
        "make image-test",
        "ctr -n k8s.io images import build/metagpu-image.oci.tar",
        "kind load image-archive build/metagpu-image.oci.tar",
        "skopeo copy oci-archive:build/metagpu-image.oci.tar",
        "--build-arg PYTHON_IMAGE=",
        "metagpu.io/inject=false",
    ],
)
def test_install_guide_mentions(text: str) -> None:
    assert text in doc(), text


def test_documented_taint_is_the_one_the_webhook_tolerates() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    first = values["tolerations"][0]
    assert (
        f"kubectl taint node gpu-node-1 {first['key']}={first['value']}:{first['effect']}" in doc()
    )
    label = next(iter(values["plugin"]["nodeSelector"].items()))
    assert f"kubectl label node gpu-node-1 {label[0]}={label[1]}" in doc()
