"""``metagpu agent``: the node agent, with the Kubernetes credentials every component uses.

The agent (:mod:`plugin.agent`) may not import certs, yet it must talk to the
API server as the same identity as bootstrap and the webhook's namespace cache:
:func:`certs.kube.open_api_client` is the one place metagpu loads credentials.
The umbrella composes the two, as it composes webhook, plugin and certs for
``metagpu dev``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Final

from plugin.agent.cli import agent_command

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


def open_api_client() -> AbstractAsyncContextManager[tuple[ApiClient, str]]:
    """:func:`certs.kube.open_api_client`, imported when the agent runs, not for ``--help``."""
    from certs.kube import open_api_client as open_client  # noqa: PLC0415 - kubernetes-asyncio

    return open_client()


COMMANDS: Final = (agent_command(open_api=open_api_client),)
