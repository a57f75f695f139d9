"""kubernetes-asyncio adapter of ``metagpu cleanup``: list, patch and delete, each bounded.

Raw JSON in and out (``_preload_content=False``, :func:`webhook.quotas.calls.call_api`),
like the rest of metagpu's API code: a Node's labels are read as the API server
sent them, with no client model in between. Every request has its own
timeout; lists of nodes and pods are read a page at a time (``limit`` and
``continue``), so a 5,000-node cluster is never one huge answer.

Nothing here raises for an API answer: each failure becomes a log line that
says what to run by hand, and a line in the :class:`~metagpu.cleanup.plan.Report`.
The run goes on with the next object, because a hook that stops at the first
403 leaves more behind than one that does what it may.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client

from metagpu.cleanup.plan import (
    COMPANION_SELECTOR,
    MANAGED_BY_SELECTOR,
    Obj,
    Report,
    companion_command,
    lease_command,
    node_command,
    node_patch,
    template_command,
    template_users,
)
from webhook.quotas.calls import Answer, call_api, raw_options

logger = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
DEFAULT_PAGE_SIZE: Final = 500
"""Objects per list request: kubectl's own chunk size, small enough that one page of
Nodes (each several KiB) stays a few MiB."""

TRANSPORT_ERRORS: Final = (aiohttp.ClientError, TimeoutError)
"""A request that got no answer (per-request timeout, connection refused)."""


class ListError(Exception):
    """A list request answered with an error; the message says which and why."""


@dataclass(frozen=True)
class CleanupTarget:
    """What to clean: the release's Leases, the DRA templates when ``dra``, and the quota
    mirror's companions when ``quota_companions``."""

    namespace: str
    leases: tuple[str, ...] = ()
    dra: bool = False
    quota_companions: bool = False


@dataclass(frozen=True)
class Step:
    """One part of the run, with what to do by hand if it never finishes."""

    what: str
    manual: str
    run: Callable[[], Awaitable[None]]


class Cleaner:
    """The requests of one run; results go into ``report``."""

    def __init__(
        self,
        api_client: client.ApiClient,
        report: Report,
        *,
        request_timeout_s: float,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._leases = client.CoordinationV1Api(api_client)
        self._resource = client.ResourceV1Api(api_client)
        self._report = report
        self._timeout_s = request_timeout_s
        self._page_size = page_size

    # ------------------------------------------------------------- nodes
    async def clean_nodes(self) -> None:
        """Remove the agent's labels and annotations from every Node that has any."""
        try:
            async for node in self._pages(lambda o: self._core.list_node(**o), "nodes"):
                patch = node_patch(node)
                if patch is not None:
                    await self._patch_node(str(node["metadata"]["name"]), patch)
        except (ListError, *TRANSPORT_ERRORS) as exc:
            self._fail(f"list nodes: {_text(exc)}", node_command())

    async def _patch_node(self, name: str, patch: Obj) -> None:
        keys = [*patch["metadata"].get("labels", {}), *patch["metadata"].get("annotations", {})]
        # A JSON merge patch: null removes a key, every other key is left as it is.
        options: dict[str, Any] = {"_content_type": MERGE_PATCH, **raw_options(self._timeout_s)}
        try:
            answer = await call_api(lambda: self._core.patch_node(name, patch, **options))
        except TRANSPORT_ERRORS as exc:
            self._fail(f"node {name}: {_text(exc)}", node_command(name))
            return
        if answer.ok:
            self._done(f"node {name}: removed {', '.join(keys)}")
        elif answer.status != 404:  # 404: the node left the cluster since the list
            self._fail(f"node {name}: {_status(answer)}", node_command(name))

    # ------------------------------------------------------------ leases
    async def delete_leases(self, namespace: str, names: tuple[str, ...]) -> None:
        """Delete each Lease by name; one already gone counts as done."""
        for name in names:
            await self._delete(
                f"lease {namespace}/{name}",
                partial(self._leases.delete_namespaced_lease, name, namespace),
                uid=None,
                done="deleted",
                manual=lease_command(namespace, name),
            )

    # --------------------------------------------------------- templates
    async def delete_templates(self) -> None:
        """Delete our ResourceClaimTemplates that no pod of their namespace names."""
        by_namespace: dict[str, list[Obj]] = {}
        try:
            async for template in self._pages(
                lambda o: self._resource.list_resource_claim_template_for_all_namespaces(
                    label_selector=MANAGED_BY_SELECTOR, **o
                ),
                "resourceclaimtemplates",
            ):
                namespace = str(template["metadata"]["namespace"])
                by_namespace.setdefault(namespace, []).append(template)
        except (ListError, *TRANSPORT_ERRORS) as exc:
            self._fail(f"list resourceclaimtemplates: {_text(exc)}", template_command())
            return
        for namespace, templates in sorted(by_namespace.items()):
            await self._clean_namespace(namespace, templates)

    async def _clean_namespace(self, namespace: str, templates: list[Obj]) -> None:
        try:
            pods = [
                pod
                async for pod in self._pages(
                    lambda o: self._core.list_namespaced_pod(namespace, **o), "pods"
                )
            ]
        except (ListError, *TRANSPORT_ERRORS) as exc:
            # Without the pods, a template might still be needed: leave them all.
            for template in templates:
                name = template["metadata"]["name"]
                self._fail(
                    f"resourceclaimtemplate {namespace}/{name}: cannot tell whether a pod "
                    f"names it (list pods: {_text(exc)})",
                    f"{template_command(namespace, name)} once no pod names it",
                )
            return
        users = template_users(pods)
        for template in templates:
            name = str(template["metadata"]["name"])
            if name in users:
                self._report.kept.append(
                    f"resourceclaimtemplate {namespace}/{name}: pod(s) "
                    f"{', '.join(sorted(users[name]))} still name it; once they are gone: "
                    f"{template_command(namespace, name)}"
                )
                logger.info(
                    "cleanup: kept a claim template a pod still names",
                    extra={"namespace": namespace, "template": name, "pods": users[name]},
                )
                continue
            await self._delete_template(namespace, name, str(template["metadata"].get("uid", "")))

    async def _delete_template(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(
            f"resourceclaimtemplate {namespace}/{name}",
            partial(self._resource.delete_namespaced_resource_claim_template, name, namespace),
            uid=uid,
            done="deleted (no pod names it)",
            manual=template_command(namespace, name),
        )

    async def _delete(
        self,
        ref: str,
        send: Callable[..., Awaitable[object]],
        *,
        uid: str | None,
        done: str,
        manual: str,
    ) -> None:
        """Delete one object; 404 counts as done. With ``uid`` (an object as it was
        listed) the uid precondition leaves alone one made again since the list, which is
        not ours to judge; without, by name (the release's Leases)."""
        options: dict[str, Any] = raw_options(self._timeout_s)
        if uid is not None:
            options["body"] = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"uid": uid},
            }
        try:
            answer = await call_api(lambda: send(**options))
        except TRANSPORT_ERRORS as exc:
            self._fail(f"{ref}: {_text(exc)}", manual)
            return
        if answer.ok:
            self._done(f"{ref}: {done}")
        elif answer.status == 404:
            self._done(f"{ref}: already gone")
        else:
            self._fail(f"{ref}: {_status(answer)}", manual)

    # -------------------------------------------------------- companions
    async def delete_companions(self) -> None:
        """Delete the quota mirror's companion ResourceQuotas, in every namespace.

        They limit the metagpu resource, which nothing serves once the release is gone;
        the source quotas they mirror are the user's and stay."""
        found: list[Obj] = []
        try:
            async for quota in self._pages(
                lambda o: self._core.list_resource_quota_for_all_namespaces(
                    label_selector=COMPANION_SELECTOR, **o
                ),
                "resourcequotas",
            ):
                found.append(quota)
        except (ListError, *TRANSPORT_ERRORS) as exc:
            self._fail(f"list resourcequotas: {_text(exc)}", companion_command())
            return
        for quota in found:
            meta = quota["metadata"]
            await self._delete_companion(
                str(meta["namespace"]), str(meta["name"]), str(meta.get("uid", ""))
            )

    async def _delete_companion(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(
            f"resourcequota {namespace}/{name}",
            partial(self._core.delete_namespaced_resource_quota, name, namespace),
            uid=uid,
            done="deleted (the quota mirror's companion)",
            manual=companion_command(namespace, name),
        )

    # ------------------------------------------------------------ shared
    async def _pages(
        self, send: Callable[[dict[str, Any]], Awaitable[object]], what: str
    ) -> AsyncIterator[Obj]:
        """Every item of a list, ``page_size`` at a time."""
        token = ""
        while True:
            options: dict[str, Any] = {"limit": self._page_size, **raw_options(self._timeout_s)}
            if token:
                options["_continue"] = token
            answer = await call_api(partial(send, options))
            if not answer.ok or answer.obj is None:
                raise ListError(_status(answer))
            for item in answer.obj.get("items") or []:
                if isinstance(item, dict):
                    yield item
            token = str((answer.obj.get("metadata") or {}).get("continue") or "")
            if not token:
                return

    def _done(self, line: str) -> None:
        self._report.done.append(line)
        logger.info("cleanup: %s", line)

    def _fail(self, line: str, manual: str) -> None:
        self._report.failed.append(f"{line}; by hand: {manual}")
        logger.warning("cleanup: %s; to do it by hand: %s", line, manual)


def _status(answer: Answer) -> str:
    return f"HTTP {answer.status} {answer.reason}: {answer.message}".replace(" :", ":")


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def run_cleanup(
    api_client: client.ApiClient,
    target: CleanupTarget,
    *,
    timeout_s: float,
    request_timeout_s: float,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> Report:
    """Leases, then templates (DRA), then quota companions, then Nodes, all within
    ``timeout_s``.

    Cheap and certain steps first, the one that grows with the cluster last.
    When the deadline passes, every step not finished is reported with the
    command that finishes it by hand (each of them is idempotent).
    """
    report = Report()
    cleaner = Cleaner(api_client, report, request_timeout_s=request_timeout_s, page_size=page_size)
    steps = []
    if target.leases:
        steps.append(
            Step(
                "delete the Leases",
                "; ".join(lease_command(target.namespace, n) for n in target.leases),
                lambda: cleaner.delete_leases(target.namespace, target.leases),
            )
        )
    if target.dra:
        steps.append(
            Step(
                "delete the unused ResourceClaimTemplates",
                f"{template_command()} (once no pod names them)",
                cleaner.delete_templates,
            )
        )
    if target.quota_companions:
        steps.append(
            Step(
                "delete the quota mirror's companion ResourceQuotas",
                companion_command(),
                cleaner.delete_companions,
            )
        )
    steps.append(Step("clean the Nodes", node_command(), cleaner.clean_nodes))
    pending = list(steps)
    try:
        async with asyncio.timeout(timeout_s):
            for step in steps:
                await step.run()
                pending.remove(step)
    except TimeoutError:
        for step in pending:
            line = f"deadline of {timeout_s:g} s passed before it could {step.what}"
            report.failed.append(f"{line}; by hand: {step.manual}")
            logger.warning("cleanup: %s; to do it by hand: %s", line, step.manual)
    return report
