"""A real Kubernetes control plane for end-to-end tests: etcd, kube-apiserver, kube-scheduler.

This module owns everything between "here is the harness binary" (built by build.sh
beside it) and "here is a kubeconfig that works": the three processes with a log file
each, readiness polling with deadlines, the admin kubeconfig, running kubectl and teardown
(SIGTERM, then SIGKILL). The PKI is in pki.py; processes, ports and waiting in processes.py.

Nothing is mocked: the apiserver, admission chain, RBAC and scheduler are upstream code.
There is no kubelet, and no controller-manager unless a test starts one with only the
controllers it needs (start_controller_manager), so pods get bound (spec.nodeName,
PodScheduled=True) but never run, nodes stay as their status was written, and no
`default` ServiceAccount appears.

The components are started with GPUSHARE_HARNESS_PARENT_PID, which makes the harness
binary die with the thread that started it (PR_SET_PDEATHSIG): start a ControlPlane from a
thread that lives as long as it should, such as pytest's main thread.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from harness.pki import Pki, generate_pki
from harness.processes import LOG_TAIL_LINES, LOOPBACK, Component, free_ports, wait_for


def _opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """A urllib opener that never uses HTTP(S)_PROXY: everything here is on loopback."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


# --------------------------------------------------------------------------------------
# Control plane


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler) from one harness binary, under `workdir`.

    Use as a context manager, or call start() and stop(). After start():
      - `server` is the apiserver URL and `kubeconfig` an admin kubeconfig (cert data inline);
      - `api_client()` gives a kubernetes ApiClient; `kubectl(...)` runs the harness's kubectl.
    """

    binary: Path
    workdir: Path
    with_scheduler: bool = True
    start_timeout: float = 120.0
    extra_apiserver_flags: Sequence[str] = ()

    server: str = field(init=False, default="")
    kubeconfig: Path = field(init=False)
    pki: Pki = field(init=False)
    components: list[Component] = field(init=False, default_factory=list)
    etcd_url: str = field(init=False, default="")
    scheduler_port: int | None = field(init=False, default=None)
    _api: k8s.ApiClient | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.binary = Path(self.binary)
        self.workdir = Path(self.workdir)
        self.kubeconfig = self.workdir / "kubeconfig"

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Generate PKI, start every component and wait until the API serves requests."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = generate_pki(self.workdir / "pki")
        etcd_client, etcd_peer, api_port, sched_port = free_ports(4)
        self.etcd_url = f"http://{LOOPBACK}:{etcd_client}"
        self.server = f"https://{LOOPBACK}:{api_port}"
        self._write_kubeconfig()
        deadline = time.monotonic() + self.start_timeout
        try:
            self._start_etcd(etcd_client, etcd_peer, deadline)
            self._start_apiserver(api_port, deadline)
            if self.with_scheduler:
                self._start_scheduler(sched_port, deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Close the shared client and stop components in reverse start order."""
        if self._api is not None:
            self._api.close()  # type: ignore[no-untyped-call]
            self._api = None
        while self.components:
            self.components.pop().stop()

    def _remaining(self, deadline: float) -> float:
        return max(deadline - time.monotonic(), 0.0)

    def _start(self, name: str, args: Sequence[str]) -> Component:
        component = Component.start(name, self.binary, args, self.workdir)
        self.components.append(component)
        return component

    def _start_etcd(self, client_port: int, peer_port: int, deadline: float) -> None:
        data_dir = self.workdir / "etcd-data"
        # etcd refuses (or warns about) a data dir readable by others.
        data_dir.mkdir(mode=0o700, exist_ok=True)
        etcd = self._start(
            "etcd",
            [
                "etcd",
                f"--data-dir={data_dir}",
                f"--listen-client-url={self.etcd_url}",
                f"--listen-peer-url=http://{LOOPBACK}:{peer_port}",
            ],
        )

        def healthy() -> bool | None:
            etcd.check_alive()
            with _opener().open(f"{self.etcd_url}/health", timeout=2) as resp:
                return True if json.load(resp).get("health") == "true" else None

        wait_for(
            "etcd /health",
            healthy,
            timeout=self._remaining(deadline),
            on_timeout=etcd.log_tail,
        )

    def _start_apiserver(self, port: int, deadline: float) -> None:
        pki = self.pki
        apiserver = self._start(
            "kube-apiserver",
            [
                "apiserver",
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                f"--service-account-issuer={self.server}/",
                f"--service-account-key-file={pki.service_account_key}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                # ServiceAccount: no controller-manager creates the `default` SA it requires.
                # TaintNodesByCondition: it taints every new Node not-ready:NoSchedule and
                # only the node lifecycle controller (absent here) would remove the taint.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                *self.extra_apiserver_flags,
            ],
        )
        opener = _opener(self.ssl_context())

        def get(path: str) -> int:
            apiserver.check_alive()
            try:
                with opener.open(f"{self.server}{path}", timeout=5) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as exc:
                exc.close()
                return exc.code

        wait_for(
            "kube-apiserver /readyz",
            lambda: True if get("/readyz") == 200 else None,
            timeout=self._remaining(deadline),
            on_timeout=apiserver.log_tail,
        )
        # /readyz can pass a moment before the system namespaces controller has run.
        wait_for(
            "namespace default",
            lambda: True if get("/api/v1/namespaces/default") == 200 else None,
            timeout=self._remaining(deadline),
            on_timeout=apiserver.log_tail,
        )

    def _start_scheduler(self, port: int, deadline: float) -> None:
        scheduler = self._start(
            "kube-scheduler",
            [
                "scheduler",
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
            ],
        )
        self.scheduler_port = port
        # The scheduler serves a self-signed in-memory cert; only its status code matters.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def ready() -> bool | None:
            scheduler.check_alive()
            conn = http.client.HTTPSConnection(LOOPBACK, port, timeout=5, context=insecure)
            try:
                conn.request("GET", "/readyz")
                return True if conn.getresponse().status == 200 else None
            finally:
                conn.close()

        wait_for(
            "kube-scheduler /readyz",
            ready,
            timeout=self._remaining(deadline),
            on_timeout=scheduler.log_tail,
        )

    def start_controller_manager(
        self, controllers: Sequence[str], ready_log: str, timeout: float = 60.0
    ) -> None:
        """Run kube-controller-manager with only `controllers` (its --controllers names).

        Opt-in, for tests that need an upstream controller (the resourceclaim controller
        makes a pod's claims from ResourceClaimTemplates); at most once per control plane,
        stopped with it. It serves no port (--secure-port=0), so it counts as started when
        its log shows `ready_log` (a line the controllers print when they run).
        """
        if any(c.name == "kube-controller-manager" for c in self.components):
            return
        manager = self._start(
            "kube-controller-manager",
            [
                "controller-manager",
                f"--kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(controllers)}",
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )

        def started() -> bool | None:
            manager.check_alive()
            return True if ready_log in manager.log_path.read_text(errors="replace") else None

        wait_for(
            "kube-controller-manager controllers",
            started,
            timeout=timeout,
            on_timeout=manager.log_tail,
        )

    # -- access -------------------------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        pki = self.pki
        user = {
            "client-certificate-data": _b64(pki.admin_cert),
            "client-key-data": _b64(pki.admin_key),
        }
        config = self._kubeconfig("e2e", "admin", user)
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _kubeconfig(self, context: str, user_name: str, user: dict[str, str]) -> dict[str, Any]:
        """A kubeconfig for this apiserver (trusting the cluster CA) as ``user``."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.pki.ca_cert),
                    },
                }
            ],
            "users": [{"name": user_name, "user": user}],
            "contexts": [{"name": context, "context": {"cluster": "e2e", "user": user_name}}],
            "current-context": context,
        }

    def service_account_kubeconfig(
        self, namespace: str, account: str, path: Path, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig at ``path`` holding a bound token of ServiceAccount
        ``namespace/account`` (TokenRequest API): what a pod of that ServiceAccount would
        present, for running a component under its shipped RBAC."""
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
        )
        token = (
            k8s.CoreV1Api(self.api)
            .create_namespaced_service_account_token(account, namespace, request)
            .status.token
        )
        config = self._kubeconfig("sa", account, {"token": token})
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context that trusts the cluster CA and presents the admin client cert."""
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    @property
    def api(self) -> k8s.ApiClient:
        """The shared admin ApiClient, created on first use and closed by stop()."""
        if self._api is None:
            self._api = self.api_client()
        return self._api

    def api_client(self) -> k8s.ApiClient:
        """A new kubernetes ApiClient for the admin user; the caller closes it.

        It ignores HTTP(S)_PROXY, which the client would otherwise apply even to 127.0.0.1.
        """
        configuration = k8s.Configuration(proxy="")
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig),
            client_configuration=configuration,
            persist_config=False,
        )
        return k8s.ApiClient(configuration)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run `kubectl <args>` from the harness against this cluster; text output captured.

        With check=True a non-zero exit raises subprocess.CalledProcessError, whose
        `stderr` holds kubectl's message.
        """
        home = self.workdir / "kubectl-home"
        home.mkdir(exist_ok=True)
        # A private HOME keeps the user's ~/.kube (cache, kuberc) out of the tests.
        env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(self.kubeconfig)}
        env.pop("KUBERC", None)
        return subprocess.run(
            [str(self.binary), "kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env=env,
        )

    def logs(self, lines: int = LOG_TAIL_LINES) -> str:
        """The tail of every component's log, for failure reports."""
        return "\n".join(c.log_tail(lines) for c in self.components)
