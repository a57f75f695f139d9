"""An in-memory Kubernetes API server that speaks real HTTP+JSON, for tests.

No API server runs on these machines, so the adapters that use
kubernetes-asyncio (certs bootstrap, the webhook's namespace cache, the node
agent) are tested against this one instead. It is deliberately narrow but
faithful where our code can notice the difference:

* the URL layout of core (``/api/v1``) and group (``/apis/<g>/<v>``) resources,
  namespaced and cluster-scoped, with ``/status`` subresources;
* get, list (label and field selectors; ``limit``/``continue`` paging), create
  (``generateName``), replace
  (PUT, with optimistic concurrency: a stale ``metadata.resourceVersion`` is a
  409 Conflict), JSON Patch, merge patch and strategic merge patch (lists of
  objects with a ``name`` merge by name, as ``containers`` and ``webhooks`` do),
  delete;
* watch (``?watch=true``): newline-delimited events, ADDED for the current
  state when no resourceVersion is given, replay from a resourceVersion, a
  410 Gone ERROR event for a compacted one, ``timeoutSeconds``;
* errors as ``Status`` objects with the reason and message wording of the real
  API server (NotFound, AlreadyExists, Conflict, Forbidden, Invalid);
* ``pods/{name}/binding`` (create): UID precondition, "already assigned" conflict,
  the Binding's annotations applied with ``spec.nodeName``, as the real registry does;
* ``pods/{name}/eviction`` (create, policy/v1 Eviction) with the PodDisruptionBudget
  checks of ``pkg/registry/core/pod/storage/eviction.go`` (429 TooManyRequests when the
  budget allows no disruption, ``disruptionsAllowed`` decremented and the pod recorded
  in ``disruptedPods``) and the pod registry's graceful deletion of a bound pod
  (``deletionTimestamp`` set; the test plays the kubelet and removes it);
* scripted faults: :meth:`FakeKubeApi.forbid` (RBAC 403s naming the verb and
  resource) and :meth:`FakeKubeApi.fail_next` (e.g. a one-off 409), either
  for every client or for one ``User-Agent``;
* delete preconditions (``DeleteOptions.preconditions.uid``: 409 Conflict
  with the API server's "Precondition failed" wording when the uid differs);
* the garbage collector's part of ``ownerReferences``: when an object is
  deleted, every object whose owners are then all gone is deleted too
  (background propagation, the default), unless ``garbage_collector=False``
  (to test what a controller deletes itself).

Every request is recorded in :attr:`FakeKubeApi.requests` with its verb, the
client's ``User-Agent`` and the event-loop time it arrived at, so
tests can assert "the second run wrote nothing" and the install tests can
compare the verbs our code uses with what the chart's RBAC grants.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jsonpatch
from aiohttp import web

Obj = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    """One API resource the fake serves."""

    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False),
    ResourceType("", "v1", "nodes", "Node", namespaced=False),
    ResourceType("", "v1", "pods", "Pod", namespaced=True),
    ResourceType("", "v1", "secrets", "Secret", namespaced=True),
    ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True),
    ResourceType("", "v1", "events", "Event", namespaced=True),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", namespaced=True),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
    ResourceType("events.k8s.io", "v1", "events", "Event", namespaced=True),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True),
    # DRA, as a v1.36 API server serves it (../shared/fixtures/dra): slices are
    # cluster-scoped and selected by spec.nodeName/spec.driver, claims namespaced.
    ResourceType("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True),
    # The webhook's DRA mode: templates per namespace, ``spec.spec`` a claim's spec
    # (resourceclaimtemplate-50-units-40gi-accepted.json).
    ResourceType(
        "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
    ),
)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake saw it."""

    verb: str  # get list watch create update patch delete
    method: str
    path: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None
    query: dict[str, str]
    content_type: str
    body: Any
    status: int
    user_agent: str = ""
    at: float = 0.0
    """``loop.time()`` when the request arrived."""


@dataclass
class _WatchEvent:
    rv: int
    type: str
    obj: Obj


@dataclass
class _Fault:
    verb: str
    resource: str
    status: int
    reason: str
    message: str
    name: str | None = None
    remaining: int | None = 1  # None: forever
    user_agent: str | None = None
    """Only requests from this ``User-Agent`` (None: every client)."""


@dataclass
class FakeKubeApi:
    """The server state and its aiohttp app. Use :func:`running_kube_api` to serve it."""

    resources: tuple[ResourceType, ...] = DEFAULT_RESOURCES
    requests: list[RecordedRequest] = field(default_factory=list)
    user: str = "system:serviceaccount:metagpu:metagpu"
    garbage_collector: bool = True
    """Delete dependents whose owners are all gone, as the cluster's garbage collector does."""

    def __post_init__(self) -> None:
        self._rv = itertools.count(1000)
        self._store: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {
            (r.group, r.plural): {} for r in self.resources
        }
        self._events: dict[tuple[str, str], list[_WatchEvent]] = {
            (r.group, r.plural): [] for r in self.resources
        }
        self._compacted_below: dict[tuple[str, str], int] = {}
        self._changed = asyncio.Condition()
        self._faults: list[_Fault] = []

    # ------------------------------------------------------ test-side API
    def put(self, obj: Obj) -> Obj:
        """Create or replace an object directly (no request recorded); returns the stored copy."""
        rtype = self._type_for_kind(obj["apiVersion"], obj["kind"])
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", "") if rtype.namespaced else "", meta["name"])
        store = self._store[(rtype.group, rtype.plural)]
        existed = key in store
        stored = self._stamp(copy.deepcopy(obj), rtype, new=not existed)
        store[key] = stored
        self._record_event(rtype, "MODIFIED" if existed else "ADDED", stored)
        return copy.deepcopy(stored)

    def remove(self, api_version: str, kind: str, name: str, namespace: str = "") -> None:
        """Delete an object directly, emitting a DELETED watch event."""
        rtype = self._type_for_kind(api_version, kind)
        key = (namespace if rtype.namespaced else "", name)
        obj = self._store[(rtype.group, rtype.plural)].pop(key)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self._record_event(rtype, "DELETED", obj)
        self._collect_garbage()

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> Obj | None:
        """The stored object, or None."""
        rtype = self._type_for_kind(api_version, kind)
        key = (namespace if rtype.namespaced else "", name)
        obj = self._store[(rtype.group, rtype.plural)].get(key)
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        """Every stored object of a kind (optionally in one namespace)."""
        rtype = self._type_for_kind(api_version, kind)
        return [
            copy.deepcopy(o)
            for (ns, _), o in sorted(self._store[(rtype.group, rtype.plural)].items())
            if namespace is None or ns == namespace
        ]

    def forbid(
        self,
        verb: str,
        resource: str,
        *,
        name: str | None = None,
        times: int | None = None,
        user_agent: str | None = None,
    ) -> None:
        """Answer ``verb`` on ``resource`` (plural, e.g. ``secrets``) with 403, like RBAC."""
        self._faults.append(
            _Fault(
                verb,
                resource,
                403,
                "Forbidden",
                "",
                name=name,
                remaining=times,
                user_agent=user_agent,
            )
        )

    def heal(self) -> None:
        """Drop every scripted fault."""
        self._faults.clear()

    def fail_next(
        self,
        verb: str,
        resource: str,
        *,
        status: int = 409,
        reason: str = "Conflict",
        message: str = "the object has been modified; please apply your changes to the "
        "latest version and try again",
        times: int | None = 1,
        user_agent: str | None = None,
    ) -> None:
        """Make the next ``times`` ``verb`` requests on ``resource`` fail with ``status``
        (None: every one, until :meth:`heal`)."""
        self._faults.append(
            _Fault(verb, resource, status, reason, message, remaining=times, user_agent=user_agent)
        )

    def compact(self) -> None:
        """Forget watch history, so watches from an old resourceVersion get 410 Gone."""
        for key, events in self._events.items():
            if events:
                self._compacted_below[key] = events[-1].rv + 1
            events.clear()

    def writes(self) -> list[RecordedRequest]:
        """Recorded requests that change state (create, update, patch, delete)."""
        return [r for r in self.requests if r.verb in ("create", "update", "patch", "delete")]

    def verbs_used(self) -> set[tuple[str, str, str]]:
        """``(group, resource[/subresource], verb)`` for every recorded request."""
        return {
            (r.group, r.resource + (f"/{r.subresource}" if r.subresource else ""), r.verb)
            for r in self.requests
        }

    # ------------------------------------------------------------ the app
    def app(self) -> web.Application:
        app = web.Application()
        core = "/api/v1"
        grp = "/apis/{group}/{version}"
        for prefix in (core, grp):
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}", self._handle)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}", self._handle)
            app.router.add_route(
                "*", prefix + "/namespaces/{ns}/{plural}/{name}/{sub}", self._handle
            )
            app.router.add_route("*", prefix + "/{plural}", self._handle)
            app.router.add_route("*", prefix + "/{plural}/{name}", self._handle)
            app.router.add_route("*", prefix + "/{plural}/{name}/{sub}", self._handle)
        return app

    # ----------------------------------------------------------- handling
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        group = m.get("group", "")
        version = m.get("version", "v1")
        plural = m["plural"]
        ns = m.get("ns")
        name = m.get("name")
        sub = m.get("sub")
        # /api/v1/namespaces/{name} is the namespace object itself, not a collection
        namespaced_plurals = {r.plural for r in self.resources if r.namespaced}
        if ns is not None and plural not in namespaced_plurals and group == "" and name is None:
            plural, name, ns, sub = "namespaces", ns, None, m["plural"]
        rtype = self._type(group, version, plural)
        query = dict(request.query)
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                return self._status(400, "BadRequest", f"invalid JSON body: {raw[:80]!r}")
        verb = self._verb(request.method, name, query)
        user_agent = request.headers.get("User-Agent", "")
        at = asyncio.get_running_loop().time()
        resp = await self._dispatch(
            request, rtype, verb=verb, ns=ns, name=name, sub=sub, query=query, body=body
        )
        self.requests.append(
            RecordedRequest(
                verb=verb,
                method=request.method,
                path=request.path,
                group=group,
                resource=plural,
                subresource=sub,
                namespace=ns,
                name=name,
                query=query,
                content_type=request.content_type,
                body=body,
                status=resp.status,
                user_agent=user_agent,
                at=at,
            )
        )
        return resp

    async def _dispatch(
        self,
        request: web.Request,
        rtype: ResourceType | None,
        *,
        verb: str,
        ns: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        body: Any,
    ) -> web.StreamResponse:
        if rtype is None:
            return self._status(404, "NotFound", "the server could not find the requested resource")
        fault = self._take_fault(verb, rtype.plural, name, request.headers.get("User-Agent", ""))
        if fault is not None:
            if fault.status == 403:
                return self._forbidden(verb, rtype, ns, name)
            return self._status(fault.status, fault.reason, fault.message)
        key_ns = (ns or "") if rtype.namespaced else ""
        store = self._store[(rtype.group, rtype.plural)]
        if verb == "create" and sub == "binding" and rtype.plural == "pods" and name:
            return self._bind(rtype, store, (key_ns, name), body=body, query=query)
        if verb == "create" and sub == "eviction" and rtype.plural == "pods" and name:
            return self._evict(rtype, store, (key_ns, name), body=body, query=query)
        if verb == "watch":
            return await self._watch(request, rtype, ns, query)
        if verb == "list":
            selected = [
                (key, o)
                for key, o in sorted(store.items())
                if (ns is None or key[0] == ns) and _selected(o, query)
            ]
            list_meta: Obj = {"resourceVersion": str(self._current_rv())}
            if query.get("continue"):
                last, snapshot_rv = json.loads(query["continue"])
                after = tuple(last)
                selected = [(key, o) for key, o in selected if key > after]
                # Every page of one list carries the first page's resourceVersion, as the
                # API server serves them from one snapshot: a watch from it replays whatever
                # changed while the pages were read (here the later pages may already show
                # such a change; the watch then repeats it, which a consumer must bear).
                list_meta["resourceVersion"] = snapshot_rv
            if query.get("limit") and int(query["limit"]) < len(selected):
                # Paging as the API server does it: an opaque token (here the last key
                # served and the snapshot's resourceVersion) and the count still to come.
                rest = len(selected) - int(query["limit"])
                selected = selected[: int(query["limit"])]
                list_meta["continue"] = json.dumps(
                    [list(selected[-1][0]), list_meta["resourceVersion"]]
                )
                list_meta["remainingItemCount"] = rest
            return web.json_response(
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": rtype.api_version,
                    "metadata": list_meta,
                    "items": [copy.deepcopy(o) for _, o in selected],
                }
            )
        if verb == "create":
            if not isinstance(body, dict):
                return self._status(400, "BadRequest", "request body must be an object")
            meta = body.setdefault("metadata", {})
            if not meta.get("name"):
                if not meta.get("generateName"):
                    return self._invalid(
                        rtype, "", "metadata.name: Required value: name or generateName is required"
                    )
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if rtype.namespaced:
                meta["namespace"] = ns or meta.get("namespace", "default")
            key = (key_ns, meta["name"])
            if key in store:
                return self._status(
                    409,
                    "AlreadyExists",
                    f'{rtype.plural}{self._group_suffix(rtype)} "{meta["name"]}" already exists',
                )
            body.setdefault("apiVersion", rtype.api_version)
            body.setdefault("kind", rtype.kind)
            stored = self._stamp(body, rtype, new=True)
            if query.get("dryRun") != "All":
                store[key] = stored
                self._record_event(rtype, "ADDED", stored)
            return web.json_response(copy.deepcopy(stored), status=201)
        assert name is not None
        key = (key_ns, name)
        current = store.get(key)
        if current is None:
            return self._not_found(rtype, name)
        if verb == "get":
            return web.json_response(copy.deepcopy(current))
        if verb == "delete":
            wanted_uid = ((body or {}).get("preconditions") or {}).get("uid")
            if wanted_uid and wanted_uid != current["metadata"].get("uid"):
                return self._status(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {rtype.plural}{self._group_suffix(rtype)} "
                    f'"{name}": Precondition failed: UID in precondition: {wanted_uid}, '
                    f"UID in object meta: {current['metadata'].get('uid')}",
                    {"name": name, "group": rtype.group, "kind": rtype.plural},
                )
            del store[key]
            current["metadata"]["resourceVersion"] = str(next(self._rv))
            self._record_event(rtype, "DELETED", current)
            self._collect_garbage()
            return web.json_response(copy.deepcopy(current))
        if verb == "update":
            if not isinstance(body, dict):
                return self._status(400, "BadRequest", "request body must be an object")
            sent_rv = body.get("metadata", {}).get("resourceVersion")
            if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                return self._conflict(rtype, name)
            new = body
            if sub == "status":
                new = copy.deepcopy(current)
                new["status"] = body.get("status", {})
        elif verb == "patch":
            try:
                new = _apply_patch(current, body, request.content_type)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                return self._status(422, "Invalid", f"the server rejected our request: {exc}")
            except ValueError as exc:
                return self._status(415, "UnsupportedMediaType", str(exc))
            sent_rv = (
                (body or {}).get("metadata", {}).get("resourceVersion")
                if isinstance(body, dict)
                else None
            )
            if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                return self._conflict(rtype, name)
        else:
            return self._status(405, "MethodNotAllowed", f"{verb} is not supported here")
        meta = new.setdefault("metadata", {})
        for immutable in ("name", "namespace", "uid", "creationTimestamp"):
            if immutable in current["metadata"]:
                meta[immutable] = current["metadata"][immutable]
        new.setdefault("apiVersion", rtype.api_version)
        new.setdefault("kind", rtype.kind)
        if new == current:
            return web.json_response(copy.deepcopy(current))  # no-op write keeps its RV
        stored = self._stamp(new, rtype, new=False)
        if query.get("dryRun") != "All":
            store[key] = stored
            self._record_event(rtype, "MODIFIED", stored)
        return web.json_response(copy.deepcopy(stored))

    def _bind(
        self,
        rtype: ResourceType,
        store: dict[tuple[str, str], Obj],
        key: tuple[str, str],
        *,
        body: Any,
        query: dict[str, str],
    ) -> web.Response:
        """``POST pods/{name}/binding``, as ``pkg/registry/core/pod/storage/storage.go`` does it.

        The Binding's ``metadata.uid`` (and ``resourceVersion``) are preconditions; a pod
        already on a node is a 409 Conflict; the Binding's annotations are set on the pod
        in the same update as ``spec.nodeName`` and the PodScheduled condition. The answer
        is a Status (201, Success), not a Binding.
        """
        ns, name = key
        if not isinstance(body, dict) or body.get("kind", "Binding") != "Binding":
            return self._status(400, "BadRequest", "request body must be a Binding")
        meta = body.get("metadata") or {}
        target = body.get("target") or {}
        if meta.get("name", name) != name:
            return self._status(
                400, "BadRequest", "name in the Binding does not match the name on the URL"
            )
        if not target.get("name"):
            return self._invalid(rtype, name, "target.name: Required value")
        current = store.get((ns, name))
        if current is None:
            return self._not_found(rtype, name)
        cur_meta = current["metadata"]
        if meta.get("uid") and meta["uid"] != cur_meta.get("uid"):
            return self._conflict_message(
                "pods",
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {cur_meta.get('uid')}",
            )
        if cur_meta.get("deletionTimestamp"):
            return self._conflict_message(
                "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        node = (current.get("spec") or {}).get("nodeName")
        if node:
            return self._conflict_message(
                "pods/binding", name, f'pod {name} is already assigned to node "{node}"'
            )
        new = copy.deepcopy(current)
        new.setdefault("spec", {})["nodeName"] = target["name"]
        if meta.get("annotations"):
            new["metadata"].setdefault("annotations", {}).update(meta["annotations"])
        conditions = new.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True"})
        if query.get("dryRun") != "All":
            stored = self._stamp(new, rtype, new=False)
            store[(ns, name)] = stored
            self._record_event(rtype, "MODIFIED", stored)
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
            status=201,
        )

    def _evict(
        self,
        rtype: ResourceType,
        store: dict[tuple[str, str], Obj],
        key: tuple[str, str],
        *,
        body: Any,
        query: dict[str, str],
    ) -> web.Response:
        """``POST pods/{name}/eviction``, as ``pkg/registry/core/pod/storage/eviction.go`` does it.

        * a pod that is Pending, Succeeded, Failed or already being deleted is deleted
          without looking at budgets (``canIgnorePDB``);
        * the budgets of the pod's namespace whose non-empty selector matches its labels:
          more than one is a 500; a budget whose status is older than its spec
          (``observedGeneration < generation``) or that allows no disruption is a 429
          TooManyRequests, "Cannot evict pod as it would violate the pod's disruption
          budget.", with a ``DisruptionBudget`` cause; a negative budget is a 403;
        * otherwise the budget's ``disruptionsAllowed`` is decremented, the pod recorded in
          its ``disruptedPods``, and the pod deleted the way the pod registry deletes:
          a pod bound to a node gets ``deletionTimestamp`` (grace from DeleteOptions, else
          ``spec.terminationGracePeriodSeconds``, else 30) and stays until its kubelet
          removes it (the test does, with :meth:`remove`); an unbound pod or a grace of 0
          goes at once. The answer is a Status (201, Success).

        A not-Ready pod while the budget is healthy enough skips the decrement, as there.
        """
        ns, name = key
        if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction":
            return self._status(400, "BadRequest", f"not a Eviction object: {type(body)}")
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            return self._status(
                400, "BadRequest", "name in URL does not match name in Eviction object"
            )
        pod = store.get((ns, name))
        if pod is None:
            return self._not_found(rtype, name)
        options = body.get("deleteOptions") or {}
        wanted_uid = (options.get("preconditions") or {}).get("uid")
        if wanted_uid and wanted_uid != pod["metadata"].get("uid"):
            return self._conflict_message(
                "pods",
                name,
                f"Precondition failed: UID in precondition: {wanted_uid}, "
                f"UID in object meta: {pod['metadata'].get('uid')}",
            )
        dry_run = query.get("dryRun") == "All" or "All" in (options.get("dryRun") or [])
        phase = (pod.get("status") or {}).get("phase")
        if not (
            phase in ("Pending", "Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp")
        ):
            budgets = [
                b
                for b in self._store[("policy", "poddisruptionbudgets")].values()
                if b["metadata"].get("namespace") == ns
                and _selector_matches((b.get("spec") or {}).get("selector"), pod)
            ]
            if len(budgets) > 1:
                return self._status(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            if budgets and not self._ready_enough(pod, budgets[0]):
                refused = self._decrement(budgets[0], name, dry_run=dry_run)
                if refused is not None:
                    return refused
        if not dry_run:
            self._delete_gracefully(rtype, store, (ns, name), options)
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"},
            status=201,
        )

    @staticmethod
    def _ready_enough(pod: Obj, budget: Obj) -> bool:
        """A pod that is not Ready while the budget has its healthy pods is evicted freely."""
        status = budget.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        desired = int(status.get("desiredHealthy") or 0)
        return not ready and int(status.get("currentHealthy") or 0) >= desired and desired > 0

    def _decrement(self, budget: Obj, pod_name: str, *, dry_run: bool) -> web.Response | None:
        """``checkAndDecrement``: None when the budget allowed it (and now allows one fewer)."""
        meta, status = budget["metadata"], budget.setdefault("status", {})
        bname = meta["name"]
        refusal = "Cannot evict pod as it would violate the pod's disruption budget."
        if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
            return self._status(
                429,
                "TooManyRequests",
                refusal,
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {bname} is still being "
                            "processed by the server.",
                        }
                    ],
                    "retryAfterSeconds": 10,
                },
            )
        allowed = int(status.get("disruptionsAllowed") or 0)
        if allowed < 0:
            return self._status(
                403,
                "Forbidden",
                f'poddisruptionbudget.policy "{bname}" is forbidden: pdb disruptions '
                "allowed is negative",
            )
        if allowed == 0:
            return self._status(
                429,
                "TooManyRequests",
                refusal,
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {bname} needs "
                            f"{int(status.get('desiredHealthy') or 0)} healthy pods and has "
                            f"{int(status.get('currentHealthy') or 0)} currently",
                        }
                    ]
                },
            )
        if dry_run:
            return None
        status["disruptionsAllowed"] = allowed - 1
        status.setdefault("disruptedPods", {})[pod_name] = dt.datetime.now(dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        rtype = self._type_for_kind("policy/v1", "PodDisruptionBudget")
        stored = self._stamp(budget, rtype, new=False)
        self._record_event(rtype, "MODIFIED", stored)
        return None

    def _delete_gracefully(
        self,
        rtype: ResourceType,
        store: dict[tuple[str, str], Obj],
        key: tuple[str, str],
        options: Obj,
    ) -> None:
        """The pod registry's delete: a bound, running pod is marked, not removed."""
        pod = store[key]
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        phase = (pod.get("status") or {}).get("phase")
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        if pod["metadata"].get("deletionTimestamp"):
            return
        if not bound or int(grace) <= 0 or phase in ("Succeeded", "Failed"):
            del store[key]
            pod["metadata"]["resourceVersion"] = str(next(self._rv))
            self._record_event(rtype, "DELETED", pod)
            self._collect_garbage()
            return
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=int(grace))
        pod["metadata"]["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        pod["metadata"]["deletionGracePeriodSeconds"] = int(grace)
        stored = self._stamp(pod, rtype, new=False)
        self._record_event(rtype, "MODIFIED", stored)

    async def _watch(
        self, request: web.Request, rtype: ResourceType, ns: str | None, query: dict[str, str]
    ) -> web.StreamResponse:
        key = (rtype.group, rtype.plural)
        rv_param = query.get("resourceVersion", "")
        timeout_s = float(query.get("timeoutSeconds", "3600"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)

        async def send(ev_type: str, obj: Obj) -> None:
            line = json.dumps({"type": ev_type, "object": obj}) + "\n"
            await resp.write(line.encode())

        if rv_param and rv_param != "0":
            since = int(rv_param)
            if since < self._compacted_below.get(key, 0) - 1:
                await send(
                    "ERROR",
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": f"too old resource version: {since}",
                        "reason": "Expired",
                        "code": 410,
                    },
                )
                return resp
        else:
            for (ons, _), obj in sorted(self._store[key].items()):
                if (ns is None or ons == ns) and _selected(obj, query):
                    await send("ADDED", copy.deepcopy(obj))
            since = self._current_rv()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                for ev in [e for e in self._events[key] if e.rv > since]:
                    since = ev.rv
                    ons = ev.obj["metadata"].get("namespace", "")
                    if (ns is None or ons == ns) and _selected(ev.obj, query):
                        await send(ev.type, copy.deepcopy(ev.obj))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                # wait_for checks the predicate under the lock before sleeping, so an
                # event recorded while we were writing is never a lost wake-up.
                async with self._changed:
                    try:
                        await asyncio.wait_for(
                            self._changed.wait_for(partial(self._newer_than, key, since)),
                            timeout=remaining,
                        )
                    except TimeoutError:
                        break
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            # A client that goes away ends its watch; that is normal, not an error
            # (also when it goes away just as the watch times out).
            return resp
        return resp

    # ---------------------------------------------------------- internals
    @staticmethod
    def _verb(method: str, name: str | None, query: dict[str, str]) -> str:
        if method == "GET":
            if query.get("watch") in ("true", "1", "True"):
                return "watch"
            return "get" if name else "list"
        return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, method.lower()
        )

    def _type(self, group: str, version: str, plural: str) -> ResourceType | None:
        for r in self.resources:
            if (r.group, r.version, r.plural) == (group, version, plural):
                return r
        return None

    def _type_for_kind(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for r in self.resources:
            if (r.group, r.version, r.kind) == (group, version, kind):
                return r
        raise KeyError(f"fake API does not serve {api_version} {kind}")

    def _current_rv(self) -> int:
        """A fresh resourceVersion: newer than every stored object, as a list returns."""
        return next(self._rv)

    def _newer_than(self, key: tuple[str, str], rv: int) -> bool:
        return self._latest_rv(key) > rv

    def _latest_rv(self, key: tuple[str, str]) -> int:
        events = self._events[key]
        return events[-1].rv if events else self._compacted_below.get(key, 1) - 1

    def _stamp(self, obj: Obj, rtype: ResourceType, *, new: bool) -> Obj:
        meta = obj.setdefault("metadata", {})
        if new:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp", dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
        meta["resourceVersion"] = str(next(self._rv))
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        return obj

    def _record_event(self, rtype: ResourceType, ev_type: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._events[(rtype.group, rtype.plural)].append(
            _WatchEvent(rv, ev_type, copy.deepcopy(obj))
        )

        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.create_task(notify())  # noqa: RUF006 - fire and forget wake-up

    def _collect_garbage(self) -> None:
        """Delete every object whose ``ownerReferences`` all name objects that are gone.

        The garbage collector's background propagation, done at once: the real one
        acts moments later, which no caller here can tell apart from at once.
        """
        if not self.garbage_collector:
            return
        while True:
            alive = {
                o["metadata"].get("uid") for store in self._store.values() for o in store.values()
            }
            orphans = [
                (rtype, key)
                for rtype in self.resources
                for key, o in self._store[(rtype.group, rtype.plural)].items()
                if (refs := o["metadata"].get("ownerReferences"))
                and not any(r.get("uid") in alive for r in refs)
            ]
            if not orphans:
                return
            for rtype, key in orphans:
                obj = self._store[(rtype.group, rtype.plural)].pop(key, None)
                if obj is not None:
                    obj["metadata"]["resourceVersion"] = str(next(self._rv))
                    self._record_event(rtype, "DELETED", obj)

    def _take_fault(
        self, verb: str, resource: str, name: str | None, user_agent: str = ""
    ) -> _Fault | None:
        for fault in self._faults:
            if (
                fault.verb == verb
                and fault.resource == resource
                and (fault.name is None or fault.name == name)
                and (fault.user_agent is None or fault.user_agent == user_agent)
            ):
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    @staticmethod
    def _group_suffix(rtype: ResourceType) -> str:
        return f".{rtype.group}" if rtype.group else ""

    @staticmethod
    def _status(code: int, reason: str, message: str, details: Obj | None = None) -> web.Response:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
        if details:
            body["details"] = details
        return web.json_response(body, status=code)

    def _not_found(self, rtype: ResourceType, name: str) -> web.Response:
        return self._status(
            404,
            "NotFound",
            f'{rtype.plural}{self._group_suffix(rtype)} "{name}" not found',
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )

    def _conflict(self, rtype: ResourceType, name: str) -> web.Response:
        return self._status(
            409,
            "Conflict",
            f"Operation cannot be fulfilled on {rtype.plural}{self._group_suffix(rtype)} "
            f'"{name}": the object has been modified; please apply your changes to the '
            "latest version and try again",
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )

    def _conflict_message(self, what: str, name: str, why: str) -> web.Response:
        return self._status(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {what} "{name}": {why}',
            {"name": name, "kind": what},
        )

    def _invalid(self, rtype: ResourceType, name: str, message: str) -> web.Response:
        return self._status(
            422,
            "Invalid",
            f'{rtype.kind} "{name}" is invalid: {message}',
            {"name": name, "group": rtype.group, "kind": rtype.kind},
        )

    def _forbidden(
        self, verb: str, rtype: ResourceType, ns: str | None, name: str | None
    ) -> web.Response:
        what = f"{rtype.plural}{self._group_suffix(rtype)}"
        subject = f'{what} "{name}"' if name else what
        where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        return self._status(
            403,
            "Forbidden",
            f'{subject} is forbidden: User "{self.user}" cannot {verb} resource '
            f'"{rtype.plural}" in API group "{rtype.group}"{where}',
            {"name": name or "", "group": rtype.group, "kind": rtype.plural},
        )


# --------------------------------------------------------------- selectors
def _selector_matches(selector: Any, obj: Obj) -> bool:
    """A LabelSelector against an object's labels; nil or empty matches nothing, as a
    budget's selector does in the eviction registry."""
    if not isinstance(selector, dict) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    ):
        return False
    labels = obj.get("metadata", {}).get("labels") or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _field_value(obj: Obj, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    return "" if node is None else str(node)


def _selected(obj: Obj, query: dict[str, str]) -> bool:
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if _field_value(obj, k) == v:
                return False
        else:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if _field_value(obj, k) != v:
                return False
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, query.get("labelSelector", "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


# ------------------------------------------------------------------ patches
def _apply_patch(current: Obj, body: Any, content_type: str) -> Obj:
    if content_type == "application/json-patch+json":
        if not isinstance(body, list):
            raise jsonpatch.JsonPatchException("a JSON patch must be a list of operations")
        result: Obj = jsonpatch.apply_patch(current, body)
        return result
    if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        strategic = content_type.startswith("application/strategic")
        merged: Obj = _merge(copy.deepcopy(current), body, strategic=strategic)
        return merged
    raise ValueError(f"unsupported patch content type {content_type!r}")


def _merge(target: Any, patch: Any, *, strategic: bool) -> Any:
    """RFC 7386 merge; with ``strategic``, lists of named objects merge by ``name``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif (
            strategic
            and isinstance(value, list)
            and isinstance(target.get(key), list)
            and _named(value)
            and _named(target[key])
        ):
            merged = {item["name"]: item for item in target[key]}
            for item in value:
                merged[item["name"]] = _merge(
                    copy.deepcopy(merged.get(item["name"], {})), item, strategic=True
                )
            target[key] = list(merged.values())
        else:
            target[key] = _merge(target.get(key), value, strategic=strategic)
    return target


def _named(items: Iterable[Any]) -> bool:
    return all(isinstance(i, dict) and "name" in i for i in items)


# ------------------------------------------------------------------ serving
@asynccontextmanager
async def running_kube_api(
    api: FakeKubeApi | None = None,
) -> AsyncIterator[tuple[FakeKubeApi, str]]:
    """Serve ``api`` on a loopback port; yields ``(api, "http://127.0.0.1:PORT")``."""
    api = api or FakeKubeApi()
    runner = web.AppRunner(api.app(), handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield api, f"http://{host}:{port}"
    finally:
        await asyncio.shield(runner.cleanup())
