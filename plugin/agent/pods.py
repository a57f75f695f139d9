"""Adapter: a watch on the pods of THIS node, feeding :class:`~plugin.agent.containers.PodIndex`.

The watch itself (LIST then WATCH with ``fieldSelector=spec.nodeName=<node>``,
resume, 410 re-list, capped backoff) is :class:`plugin.kube.node_pods.NodePodWatcher`,
shared with the device plugin; this module binds it to the agent's index.
"""

from __future__ import annotations

from typing import Final

from kubernetes_asyncio import client

from plugin.agent.containers import PodIndex
from plugin.kube import node_pods
from plugin.kube.node_pods import (
    BACKOFF_INITIAL_S as BACKOFF_INITIAL_S,  # noqa: PLC0414 - re-exported
)
from plugin.kube.node_pods import (
    BACKOFF_MAX_S as BACKOFF_MAX_S,  # noqa: PLC0414 - re-exported
)
from plugin.kube.node_pods import (
    LIST_TIMEOUT_S as LIST_TIMEOUT_S,  # noqa: PLC0414 - re-exported
)
from plugin.kube.node_pods import (
    NodePodWatcher,
)
from plugin.kube.node_pods import (
    WatchError as WatchError,  # noqa: PLC0414 - re-exported
)
from plugin.kube.node_pods import (
    WatchExpiredError as WatchExpiredError,  # noqa: PLC0414 - re-exported
)

WATCH_TIMEOUT_S: Final[int] = node_pods.WATCH_TIMEOUT_S
"""Server-side watch timeout; read when a watcher is made (tests shorten it)."""


class PodWatcher(NodePodWatcher):
    """Keeps ``index`` equal to the pods bound to ``node_name``. Run :meth:`run` as a task."""

    def __init__(self, api: client.ApiClient, *, node_name: str, index: PodIndex) -> None:
        super().__init__(api, node_name=node_name, sink=index, watch_timeout_s=WATCH_TIMEOUT_S)
        self.index = index
