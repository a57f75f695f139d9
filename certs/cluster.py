"""The slice of the Kubernetes API that bootstrap uses, as a port, and its errors.

:class:`ClusterApi` is what :mod:`certs.reconcile` talks to; :mod:`certs.kube`
implements it with kubernetes-asyncio and turns HTTP statuses into the
:class:`ApiError` subclasses below, so the reconcile loop never sees a
transport. Objects travel as plain JSON dicts, exactly as the API server sent
them, so an update sends back every field it read.

Error messages are written for the operator reading a failed Helm hook Job:
a 403 names the verb, the resource, its name and namespace, and the RBAC rule
that would allow it (taken from :mod:`certs.permissions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from certs.bootstrap import BootstrapError
from plugin.api.permissions import Permission

Obj = dict[str, Any]


@dataclass(frozen=True)
class ApiCall:
    """One request, described the way RBAC and error messages talk about it."""

    verb: str
    resource: str
    """Plural, as RBAC names it (``secrets``)."""
    group: str = ""
    name: str | None = None
    namespace: str | None = None

    def describe(self) -> str:
        """``patch mutatingwebhookconfigurations "metagpu" (admissionregistration.k8s.io)``."""
        what = f'{self.resource} "{self.name}"' if self.name else self.resource
        where = f' in namespace "{self.namespace}"' if self.namespace else ""
        return f"{self.verb} {what}{where} ({self.group or 'core API group'})"


class ApiError(BootstrapError):
    """A request the API server refused or could not answer."""

    def __init__(self, call: ApiCall, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.status = status


class ApiForbiddenError(ApiError):
    """403: RBAC (or an admission policy) does not allow the call."""


class ApiNotFoundError(ApiError):
    """404: the object (or its namespace) does not exist."""


class ApiConflictError(ApiError):
    """409 on update/patch: someone else changed the object since we read it."""


class ApiAlreadyExistsError(ApiError):
    """409 on create: someone else created the object since we looked."""


class ApiUnavailableError(ApiError):
    """A timeout, a refused connection, 429 or 5xx: worth retrying."""


class ClusterApi(Protocol):
    """Secret get/create/replace and MutatingWebhookConfiguration get/patch."""

    async def get_secret(self, namespace: str, name: str) -> Obj | None:
        """The Secret, or None when it does not exist."""
        ...

    async def create_secret(self, namespace: str, body: Obj) -> Obj: ...

    async def replace_secret(self, namespace: str, name: str, body: Obj) -> Obj:
        """PUT; ``body.metadata.resourceVersion`` makes a concurrent change a 409."""
        ...

    async def get_webhook_config(self, name: str) -> Obj | None:
        """The MutatingWebhookConfiguration, or None when it does not exist."""
        ...

    async def patch_webhook_config(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj:
        """Strategic-merge patch; ``dry_run`` checks permission and validity only."""
        ...


# ------------------------------------------------------------------ messages
def forbidden_message(
    call: ApiCall, server_message: str, permissions: Iterable[Permission] = ()
) -> str:
    """``cannot VERB RESOURCE "NAME" ...: forbidden — the identity running bootstrap needs ...``."""
    rule = _rule_for(call, permissions)
    scope = (
        "a ClusterRole (cluster-scoped resource)"
        if not call.namespace
        else f'a Role in namespace "{call.namespace}"'
    )
    names = (
        f" with resourceNames [{', '.join(sorted(rule.resource_names))}]"
        if rule and rule.resource_names
        else ""
    )
    if call.verb == "create":
        names = " (RBAC cannot restrict create by resource name)"
    text = (
        f"cannot {call.describe()}: forbidden — the identity running bootstrap (the hook "
        f"Job's ServiceAccount, or your kubeconfig user) needs verb {call.verb} on "
        f'{call.resource} in API group "{call.group}"{names}, granted by {scope}'
    )
    if server_message:
        text += f". API server said: {server_message}"
    return text


def _rule_for(call: ApiCall, permissions: Iterable[Permission]) -> Permission | None:
    for perm in permissions:
        if (perm.group, perm.resource) == (call.group, call.resource) and call.verb in perm.verbs:
            return perm
    return None
