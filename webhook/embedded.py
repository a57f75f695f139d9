"""Certificates for the embedded default: ``metagpu webhook`` with no ``--tls-cert``.

A CA and a serving certificate for ``localhost``, ``127.0.0.1`` and ``::1``
live in ``tls.generate_dir`` (``ca.crt``, ``ca.key``, ``tls.crt``,
``tls.key``: the names of a ``kubernetes.io/tls`` Secret). The directory is
kept exactly as ``metagpu certs generate`` keeps one
(:func:`certs.files.ensure_bundle_dir`): the CA is reused, renewed with its
own key when due, and replaced only when it cannot be used; the serving
certificate is re-issued only when due or wrong. So the CA a developer
trusted, or pasted into a kind cluster's ``caBundle``, survives restarts and
renewals.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from certs.bootstrap import IssuePolicy
from certs.config import LOCAL_DNS_NAMES, LOCAL_IP_ADDRESSES
from certs.files import BundlePaths, ensure_bundle_dir

logger = logging.getLogger(__name__)


def ensure_local_bundle(directory: Path, *, now: dt.datetime) -> BundlePaths:
    """Reuse, renew or create the bundle in ``directory``; where its files are.

    Raises :class:`certs.bootstrap.BootstrapError` when the directory cannot
    be read or written.
    """
    policy = IssuePolicy(dns_names=LOCAL_DNS_NAMES, ip_addresses=LOCAL_IP_ADDRESSES)
    result = ensure_bundle_dir(directory, policy=policy, now=now)
    ref = {"ca_file": str(result.paths.ca_file)}
    if result.written:
        logger.info("embedded default's certificates: %s", result.decision.summary(), extra=ref)
    else:
        logger.info("reusing the embedded default's certificates", extra=ref)
    return result.paths
