"""ResourceQuota objects as the API server returns them, for the quota tests."""

from __future__ import annotations

import uuid
from typing import Any

from webhook.quotas.mirror import MirrorSettings

SETTINGS = MirrorSettings(resource_name="cnvrg.io/metagpu", units_per_gpu=100)


def quota(
    name: str,
    hard: dict[str, str],
    *,
    namespace: str = "team-a",
    uid: str | None = None,
    scopes: list[str] | None = None,
    scope_selector: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())}
    if labels:
        meta["labels"] = labels
    if owners:
        meta["ownerReferences"] = owners
    spec: dict[str, Any] = {"hard": hard}
    if scopes:
        spec["scopes"] = scopes
    if scope_selector:
        spec["scopeSelector"] = scope_selector
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta, "spec": spec}


def for_put(obj: dict[str, Any]) -> dict[str, Any]:
    """A quota for ``FakeKubeApi.put``: the server assigns the uid."""
    meta = dict(obj["metadata"])
    meta.pop("uid", None)
    return {**obj, "metadata": meta}
