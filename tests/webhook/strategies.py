"""Hypothesis strategies for pods as the API server sends them, with hostile values in them."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from tests.webhook.builders import settings
from webhook.model import NamespaceFacts, RuleSettings

GPU_NAMES = ["nvidia.com/gpu", "cnvrg.io/gpu", "cnvrg.io/metagpu", "cnvrg.io/metagpu-a100"]
OTHER_NAMES = ["cpu", "memory", "example.com/widget"]

SETTINGS: list[RuleSettings] = [
    settings(),
    settings(extra_resource_names=["cnvrg.io/metagpu-a100"]),
    settings(visible_devices_policy="strip", default_compute_policy="fixed"),
    settings(convert_whole_gpus=True, units_per_gpu=1000, runtime_class_name=None),
    settings(units_per_gpu=3, deny_privileged=False, void_non_gpu_containers=False),
    settings(
        tolerations=[
            {"operator": "Exists"},
            {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
        ]
    ),
]

valid_share = st.one_of(
    st.sampled_from(["500m", "250m", "1", "2", "5e-1", ".5", "1500m", "0.1"]),
    st.decimals(min_value=Decimal("0.01"), max_value=Decimal("8"), places=2).map(str),
    st.floats(min_value=0.01, max_value=8).map(lambda f: round(f, 2)),
)
valid_units = st.one_of(
    st.integers(min_value=1, max_value=800), st.integers(min_value=1, max_value=800).map(str)
)
hostile = st.one_of(
    st.sampled_from(["333m", "0", "-1", "1e99", "1Ki", "9", "1m", "abc", "", "500m", "1.5"]),
    st.decimals(min_value=Decimal("-2"), max_value=Decimal("12"), places=3, allow_nan=False).map(
        str
    ),
    st.text(max_size=8),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.booleans(),
    st.none(),
)
"""Mostly values the webhook accepts (so the mutation paths are explored), some hostile ones."""


def quantity_for(name: str) -> st.SearchStrategy[Any]:
    valid = valid_units if "metagpu" in name else valid_share
    return st.one_of(*[valid] * 7, hostile)


@st.composite
def resource_map(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = draw(
        st.dictionaries(
            st.sampled_from(OTHER_NAMES), st.sampled_from(["1", "2Gi", "500m"]), max_size=2
        )
    )
    n_gpu = draw(st.sampled_from([0, 0, 1, 1, 1, 1, 1, 2]))
    for name in draw(
        st.lists(st.sampled_from(GPU_NAMES), min_size=n_gpu, max_size=n_gpu, unique=True)
    ):
        out[name] = draw(quantity_for(name))
    return out


env_item = st.one_of(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(
                [
                    "NVIDIA_VISIBLE_DEVICES",
                    "CUDA_VISIBLE_DEVICES",
                    "METAGPU_COMPUTE_POLICY",
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    *["EPOCHS", "LR", "HOME", "PATH", "SEED", "DEBUG"],
                ]
            ),
            "value": st.sampled_from(["all", "void", "none", "", "0", "30", "80", "fixed", "x"]),
        }
    ),
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(
                ["NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
            ),
            "valueFrom": st.just({"configMapKeyRef": {"name": "c", "key": "k"}}),
        }
    ),
)

toleration = st.sampled_from(
    [
        {"operator": "Exists"},
        {
            "key": "cnvrg.io/metagpu",
            "operator": "Equal",
            "value": "present",
            "effect": "NoSchedule",
        },
        {"key": "cnvrg.io/metagpu", "operator": "Equal", "value": "other"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1},
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ]
)


@st.composite
def container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    resources: dict[str, Any] = {}
    limits = draw(st.sampled_from(["map"] * 5 + ["missing", "null"]))
    if limits == "map":
        resources["limits"] = draw(resource_map())
    elif limits == "null":
        resources["limits"] = None
    requests = draw(st.sampled_from(["copy"] * 4 + ["map", "missing", "null"]))
    if requests == "copy" and isinstance(resources.get("limits"), dict):
        resources["requests"] = dict(resources["limits"])  # what API server defaulting does
    elif requests == "map":
        resources["requests"] = draw(resource_map())
    elif requests == "null":
        resources["requests"] = None
    c["resources"] = resources
    env_choice = draw(st.sampled_from(["list", "missing", "null"]))
    if env_choice == "list":
        c["env"] = draw(st.lists(env_item, max_size=3))
    elif env_choice == "null":
        c["env"] = None
    if draw(st.booleans()):
        c["securityContext"] = {"privileged": draw(st.booleans())}
    return c


@st.composite
def pod(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.sampled_from([1, 1, 2, 3]))
    n_init = draw(st.sampled_from([0, 0, 1, 2]))
    names = [f"c{i}" for i in range(n)] + [f"i{i}" for i in range(n_init)]
    containers = [draw(container(name)) for name in names[:n]]
    init = [draw(container(name)) for name in names[n:]]
    meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    annotations = draw(
        st.dictionaries(
            st.sampled_from(["metagpu.io/compute-policy", "metagpu.io/original-request", "team"]),
            st.sampled_from(
                [
                    "fixed",
                    "balance",
                    "none",
                    "turbo",
                    "{}",
                    json.dumps({"c0": {"x": "1"}}),
                    "[1]",
                    "{",
                ]
            ),
            max_size=2,
        )
    )
    empty_annotations: bool = draw(st.booleans())
    if annotations or empty_annotations:
        meta["annotations"] = annotations
    if draw(st.booleans()):
        meta["labels"] = draw(
            st.dictionaries(
                st.sampled_from(["metagpu.io/inject", "app"]),
                st.sampled_from(["false", "true", "x", "x"]),
                max_size=2,
            )
        )
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    tolerations = draw(st.one_of(st.none(), st.lists(toleration, max_size=3)))
    if tolerations is not None or draw(st.booleans()):
        spec["tolerations"] = tolerations
    runtime = draw(st.sampled_from([None, "nvidia", "kata", ""]))
    if runtime is not None:
        spec["runtimeClassName"] = runtime
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


namespace_facts = st.builds(
    NamespaceFacts,
    compute_policy=st.sampled_from([None, "fixed", "balance", "none", "bogus"]),
    inject=st.sampled_from([None, None, None, "false", "true"]),
    warnings=st.sampled_from([(), ("namespace lookup failed",)]),
)

rule_settings = st.sampled_from(SETTINGS)
