"""Small builders for pod dicts shaped like the API server sends them (after defaulting)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch

from webhook.config import WebhookConfig
from webhook.rules import Decision, Denial, Mutation, RuleSettings

Obj = dict[str, Any]


def settings(**overrides: Any) -> RuleSettings:
    """Rule settings from a config with ``overrides`` (validated like a real config)."""
    return RuleSettings.from_config(WebhookConfig.model_validate(overrides))


def container(
    name: str = "main",
    *,
    limits: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    env: Sequence[Mapping[str, Any]] | None = None,
    privileged: bool | None = None,
    **extra: Any,
) -> Obj:
    c: Obj = {"name": name, "image": "busybox:1"}
    resources: Obj = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    c["resources"] = resources
    if env is not None:
        c["env"] = [dict(e) for e in env]
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    c.update(extra)
    return c


def gpu(value: Any, name: str = "main", resource: str = "nvidia.com/gpu", **kw: Any) -> Obj:
    """A container asking for ``value`` of ``resource`` in limits and requests (as defaulted)."""
    return container(name, limits={resource: value}, requests={resource: value}, **kw)


def pod(
    *containers: Obj,
    init: Sequence[Obj] = (),
    ephemeral: Sequence[Obj] = (),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    runtime_class: str | None = None,
    tolerations: Sequence[Mapping[str, Any]] | None = None,
    name: str = "p",
    **spec_extra: Any,
) -> Obj:
    meta: Obj = {"name": name, "namespace": "team-a"}
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: Obj = {"containers": [copy.deepcopy(c) for c in containers] or [container()]}
    if init:
        spec["initContainers"] = [copy.deepcopy(c) for c in init]
    if ephemeral:
        spec["ephemeralContainers"] = [copy.deepcopy(c) for c in ephemeral]
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
    if tolerations is not None:
        spec["tolerations"] = [dict(t) for t in tolerations]
    spec.update(spec_extra)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def workload(
    kind: str, template_spec: Obj, *, template_labels: Mapping[str, str] | None = None
) -> Obj:
    """A workload of ``kind`` around a pod template spec."""
    template: Obj = {
        "metadata": {"labels": dict(template_labels or {"app": "x"})},
        "spec": template_spec,
    }
    group = {"Job": "batch", "CronJob": "batch", "ReplicationController": ""}.get(kind, "apps")
    api_version = f"{group}/v1" if group else "v1"
    spec: Obj
    if kind == "CronJob":
        spec = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}
    else:
        spec = {"selector": {"matchLabels": {"app": "x"}}, "template": template}
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "w"}, "spec": spec}


def applied(obj: Obj, decision: Decision) -> Obj:
    """``obj`` after the decision's patch (a deep copy; the input is untouched)."""
    assert isinstance(decision, Mutation), decision
    return jsonpatch.apply_patch(copy.deepcopy(obj), list(decision.patch))  # type: ignore[no-any-return]


def denied(decision: Decision) -> Denial:
    assert isinstance(decision, Denial), f"expected a denial, got {decision}"
    return decision


def allowed(decision: Decision) -> Mutation:
    assert isinstance(decision, Mutation), f"expected an allow, got {decision}"
    return decision


def env_of(c: Mapping[str, Any]) -> dict[str, Any]:
    """A container's env as ``name -> value`` (the last entry wins, as in Kubernetes)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}
