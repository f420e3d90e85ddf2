"""A real Kubernetes control plane for end-to-end tests: etcd, kube-apiserver, kube-scheduler.

This module owns everything between "here is the harness binary" (built by
harness/build.sh) and "here is a kubeconfig that works": the PKI (CA, serving cert,
admin client cert, service-account key), free loopback ports, the three processes with a
log file each, readiness polling with deadlines, the admin kubeconfig, running kubectl,
teardown (SIGTERM, then SIGKILL), and fake GPU nodes created through the API.

Nothing is mocked: the apiserver, admission chain, RBAC and scheduler are upstream code.
There is no kubelet and no controller-manager, so pods get bound (spec.nodeName,
PodScheduled=True) but never run, nodes stay as their status was written, and no
`default` ServiceAccount appears.

The components are started with GPUSHARE_HARNESS_PARENT_PID, which makes the harness
binary die with the thread that started it (PR_SET_PDEATHSIG): start a ControlPlane from a
thread that lives as long as it should, such as pytest's main thread.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from webhook.install.certs import (
    Issued,
    certificate_pem,
    create_ca,
    issue_serving_certificate,
    private_key_pem,
)

LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 60

# Env var the harness binary reads to arm PR_SET_PDEATHSIG (SIGKILL), so a pytest killed with
# SIGKILL does not leave etcd and apiservers running (see pdeathsig_linux.go beside this file).
PARENT_PID_ENV = "GPUSHARE_HARNESS_PARENT_PID"

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component failed to start or become ready; the message carries the log tails."""


def wait_for(
    what: str,
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it returns something other than None; raise after `timeout` seconds.

    `check` may raise ControlPlaneError to stop early (a process died); other exceptions
    count as "not yet" and the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
        except ControlPlaneError:
            raise
        except Exception as exc:  # any transient error just means "not ready yet"
            last_error = exc
            result = None
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise ControlPlaneError(
                f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}"
            )
        time.sleep(interval)


# --------------------------------------------------------------------------------------
# PKI


@dataclass(frozen=True)
class Pki:
    """File paths of the control plane's keys and certificates (all PEM)."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path


def _write_pem(path: Path, data: bytes) -> Path:
    # Keys are secrets even in tests; 0600 also keeps etcd/apiserver from warning.
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _admin_client_certificate(ca: Issued) -> Issued:
    """CN=admin, O=system:masters (bound to cluster-admin by the bootstrap RBAC policy).

    The only certificate kind webhook.install.certs has no reason to issue: a TLS *client* cert.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "admin"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Backdated a little so a clock step between processes cannot make it "not yet valid".
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, certificate)


def generate_pki(directory: Path) -> Pki:
    """Create a CA, an apiserver serving cert, an admin client cert and a service-account key.

    CA and serving certificate come from webhook.install.certs, the code `gpushare certs` runs.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = create_ca("gpushare-e2e-ca", valid_days=1)
    serving = issue_serving_certificate(
        ca,
        # localhost, plus the in-cluster names for clients that resolve `kubernetes`.
        ["localhost", "kubernetes", "kubernetes.default.svc"],
        [ipaddress.ip_address(LOOPBACK), ipaddress.ip_address("10.0.0.1")],
        valid_days=1,
    )
    admin = _admin_client_certificate(ca)
    # The apiserver signs service-account tokens with RS256 by default.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    return Pki(
        ca_cert=_write_pem(directory / "ca.crt", certificate_pem(ca.certificate)),
        serving_cert=_write_pem(directory / "apiserver.crt", certificate_pem(serving.certificate)),
        serving_key=_write_pem(directory / "apiserver.key", private_key_pem(serving.key)),
        admin_cert=_write_pem(directory / "admin.crt", certificate_pem(admin.certificate)),
        admin_key=_write_pem(directory / "admin.key", private_key_pem(admin.key)),
        service_account_key=_write_pem(directory / "sa.key", _key_pem(sa_key)),
    )


def free_ports(count: int) -> list[int]:
    """Ask the kernel for `count` distinct free ports on 127.0.0.1.

    All sockets stay open until every port is picked, so the ports differ from each other;
    another process could still take one before our component binds it (then startup
    fails loudly with the component's log).
    """
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """A urllib opener that never uses HTTP(S)_PROXY: everything here is on loopback."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


# --------------------------------------------------------------------------------------
# Processes


@dataclass
class Component:
    """One running harness subcommand with its log file."""

    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    _log: IO[bytes] = field(repr=False)

    @classmethod
    def start(cls, name: str, binary: Path, args: Sequence[str], log_dir: Path) -> Component:
        """Start `binary <args>` with stdout and stderr going to `<log_dir>/<name>.log`."""
        log_path = log_dir / f"{name}.log"
        log = log_path.open("ab")
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        try:
            process = subprocess.Popen(
                [str(binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Own process group: a Ctrl-C in the terminal reaches pytest only, and
                # teardown decides the order in which components stop.
                start_new_session=True,
            )
        except BaseException:
            log.close()
            raise
        return cls(name=name, args=list(args), log_path=log_path, process=process, _log=log)

    def check_alive(self) -> None:
        """Raise ControlPlaneError (with the log tail) if the process has exited."""
        code = self.process.poll()
        if code is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {code} during startup\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of this component's log, with a header."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"--- {self.name}: cannot read {self.log_path}: {exc}"
        tail = "\n".join(text[-lines:])
        return f"--- {self.name} ({self.log_path}, last {min(lines, len(text))} lines) ---\n{tail}"

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL; always close the log."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=grace)
        finally:
            self._log.close()


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

    # -- access -------------------------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        pki = self.pki
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate-data": _b64(pki.admin_cert),
                        "client-key-data": _b64(pki.admin_key),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

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


def as_json(api: k8s.ApiClient, obj: object) -> dict[str, Any]:
    """A client model as the API serves it (camelCase keys, unset fields absent)."""
    data: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data


# --------------------------------------------------------------------------------------
# Fake GPU nodes


@dataclass(frozen=True)
class FakeGpuNode:
    """A Node that looks like a GPU node after GPU Feature Discovery and the device plugin.

    `shared_resource` is advertised as `gpus * replicas` in capacity and allocatable,
    as the NVIDIA device plugin does with time-slicing and renameByDefault.
    """

    name: str
    replicas: int = 1
    gpus: int = 1
    product: str = "NVIDIA-A100-SXM4-80GB"
    gpu_memory_mib: int = 81920
    sharing_strategy: str = "time-slicing"
    shared_resource: str = "nvidia.com/gpu.shared"
    cpu: str = "16"
    memory: str = "64Gi"
    pods: str = "110"
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def labels(self) -> dict[str, str]:
        """Node labels: the well-known ones plus GPU Feature Discovery's."""
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.replicas": str(self.replicas),
            "nvidia.com/gpu.sharing-strategy": self.sharing_strategy,
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            **self.extra_labels,
        }

    def resources(self) -> dict[str, str]:
        """Capacity (and allocatable) including the shared GPU resource."""
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            self.shared_resource: str(self.gpus * self.replicas),
        }


def create_fake_node(core: k8s.CoreV1Api, spec: FakeGpuNode) -> k8s.V1Node:
    """Create the Node, then write its status (capacity, allocatable, Ready) via /status.

    The create call ignores `status`, so the second, status-subresource write is what the
    scheduler sees. Returns the node as stored after the status write.
    """
    core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=spec.name, labels=spec.labels())))
    now = datetime.datetime.now(datetime.UTC)
    status = k8s.V1NodeStatus(
        capacity=spec.resources(),
        allocatable=spec.resources(),
        conditions=[
            k8s.V1NodeCondition(
                type="Ready",
                status="True",
                reason="KubeletReady",
                message="fake node created by the gpushare e2e harness",
                last_heartbeat_time=now,
                last_transition_time=now,
            )
        ],
        node_info=k8s.V1NodeSystemInfo(
            architecture="amd64",
            boot_id="",
            container_runtime_version="fake://0",
            kernel_version="",
            kube_proxy_version="",
            kubelet_version="v0.0.0-fake",
            machine_id="",
            operating_system="linux",
            os_image="fake",
            system_uuid="",
        ),
    )
    # A merge patch of the status subresource: no read-modify-write race with anyone.
    # The client would default a dict body to a JSON Patch, hence the explicit type.
    body = {"status": as_json(core.api_client, status)}
    node: k8s.V1Node = core.patch_node_status(
        spec.name, body, _content_type="application/merge-patch+json"
    )
    return node
