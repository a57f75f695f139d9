"""``metagpu scheduler-extender``, with the Kubernetes credentials every component uses.

The extender (:mod:`plugin.extender`) may not import certs, yet it must talk
to the API server as the same identity loader as the other components:
:func:`certs.kube.open_api_client` is the one place metagpu loads credentials.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from plugin.extender.cli import extender_command

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


def open_api_client(
    kubeconfig: Path | None,
) -> AbstractAsyncContextManager[tuple[ApiClient, str]]:
    """:func:`certs.kube.open_api_client`, imported when the extender runs, not for ``--help``."""
    from certs.kube import open_api_client as open_client  # noqa: PLC0415 - kubernetes-asyncio

    return open_client(kubeconfig=kubeconfig)


COMMANDS: Final = (extender_command(open_api=open_api_client),)
