"""The Kubernetes client is an optional extra: ``pip install 'gpushare[cluster]'``.

The admission service never talks to the API (its pods mount no token), so its image ships
without the client, 126 MB of it. The commands that do talk to the API (``certs
--in-cluster``, ``dra-templates --apply``, ``share-capacity``, ``mps-daemon`` and ``plan
--cluster``) import it, and the packages behind them, only once they run, after
``require_cluster_client`` has said, in one line, what to install where it is missing. Every
other command, and ``gpushare --help``, works without it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from webhook.errors import GpushareError

if TYPE_CHECKING:
    from kubernetes import client as k8s

CLUSTER_EXTRA = "gpushare[cluster]"
CLIENT_PACKAGE = "kubernetes"


def cluster_client_installed() -> bool:
    """Whether the Kubernetes client can be imported here."""
    try:
        return importlib.util.find_spec(CLIENT_PACKAGE) is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        return False


def require_cluster_client(command: str) -> None:
    """Raise a GpushareError naming the extra when the Kubernetes client is not installed."""
    if not cluster_client_installed():
        raise GpushareError(
            f"{command} talks to the Kubernetes API and needs its Python client, which this "
            f"installation lacks: pip install '{CLUSTER_EXTRA}', or run it from the "
            "gpushare-cluster image (the admission image ships without the client)."
        )


def api_client(kubeconfig: Path | None, service_account: str) -> k8s.ApiClient:
    """A client from ``kubeconfig``, else from the pod's ServiceAccount (in the cluster);
    a GpushareError saying which when neither works. Call ``require_cluster_client`` first."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    try:
        if kubeconfig is not None:
            client: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig), persist_config=False
            )
            return client
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        return k8s.ApiClient()
    except (k8s_config.ConfigException, OSError) as exc:
        where = str(kubeconfig) if kubeconfig else "the in-cluster service account"
        raise GpushareError(
            f"cannot configure a Kubernetes client from {where}: {exc}. Run in the cluster "
            f"(with the {service_account} ServiceAccount) or pass --kubeconfig."
        ) from exc
