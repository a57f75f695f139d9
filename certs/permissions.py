"""Kubernetes API permissions ``metagpu certs bootstrap`` needs, and nothing more.

Light on purpose (standard library and ``plugin.api`` only) so the chart's
RBAC tests and ``--help`` can import it without kubernetes-asyncio.

* ``secrets``: ``get`` and ``update`` on the one TLS Secret (by name), and
  ``create`` for the first run (RBAC cannot restrict ``create`` by name).
  No ``list``/``watch``/``delete``: bootstrap never looks at other Secrets and
  never deletes one.
* ``mutatingwebhookconfigurations``: ``get`` and ``patch`` on the one
  configuration whose caBundle it keeps (by name; cluster-scoped, so a
  ClusterRole). Only needed for runs with ``--webhook-config``; the chart's
  pre-install hook can run with the Secret rules alone.

The tests in ``tests/certs/test_bootstrap_api.py`` assert that the verbs
bootstrap sends across all scenarios equal :func:`plugin.api.permissions.verb_set`
of :data:`PERMISSIONS`.
"""

from __future__ import annotations

from typing import Final

from plugin.api.permissions import Permission

ADMISSION_GROUP: Final = "admissionregistration.k8s.io"

DEFAULT_SECRET_NAME: Final = "metagpu-webhook-tls"
"""The TLS Secret bootstrap keeps (``--secret``)."""

DEFAULT_WEBHOOK_CONFIG_NAME: Final = "metagpu"
"""The MutatingWebhookConfiguration whose caBundle bootstrap keeps (``--webhook-config``)."""


def permissions_for(
    *, secret: str = DEFAULT_SECRET_NAME, webhook_config: str | None = DEFAULT_WEBHOOK_CONFIG_NAME
) -> tuple[Permission, ...]:
    """The rules for one Secret name and (optionally) one webhook configuration name."""
    rules = [
        Permission(
            group="",
            resource="secrets",
            verbs=frozenset({"get", "update"}),
            resource_names=frozenset({secret}),
            why="read the webhook's TLS Secret; write a renewed certificate into it",
        ),
        Permission(
            group="",
            resource="secrets",
            verbs=frozenset({"create"}),
            why="create the webhook's TLS Secret on first install "
            "(RBAC cannot restrict create by name)",
        ),
    ]
    if webhook_config is not None:
        rules.append(
            Permission(
                group=ADMISSION_GROUP,
                resource="mutatingwebhookconfigurations",
                verbs=frozenset({"get", "patch"}),
                resource_names=frozenset({webhook_config}),
                namespaced=False,
                why="set caBundle to the CA that signed the webhook's serving certificate",
            )
        )
    return tuple(rules)


PERMISSIONS: Final[tuple[Permission, ...]] = permissions_for()
"""With the default names; the chart renders :func:`permissions_for` with its own."""
