"""Kueue (sigs.k8s.io/kueue), the real controller, run beside an e2e control plane.

tools/kueue/build.sh builds Kueue's manager from its Go module (pinned in tools/kueue/go.mod)
and copies Kueue's CRDs from the same module into a content-addressed cache directory;
`GPUSHARE_KUEUE` names one built beforehand (scripts/test exports it), else build.sh runs on
demand. `KueuePlane` applies the CRDs server-side, writes a Configuration and certificates
under its work directory, runs the manager on loopback ports until /readyz answers, and
stops it with SIGTERM. Its helpers create ResourceFlavors, ClusterQueues and LocalQueues and
read what Kueue decided: a job's `spec.suspend`, its Workload's admission or pending message.

Kueue's webhooks are served but never registered with the apiserver, so nothing defaults
or validates Kueue's objects or the jobs: create jobs suspended, with the queue-name label
(what Kueue's job webhook would have done). Leader election, internal certificate
management and the visibility server are off. cmd/kueue/main.go reads a metrics serving
certificate from the fixed /etc/kueue/metrics/certs whenever internal certificate
management is off (even with metrics off): the manager runs in a mount namespace of its
own where /etc is an overlay whose upper layer lives in the work directory, so the real
/etc is never written (where mounts are not permitted, the files go to /etc itself).
"""

from __future__ import annotations

import ctypes
import http.client
import ipaddress
import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes.client.exceptions import ApiException

from harness.binary import run_build_script
from harness.controlplane import ControlPlane
from harness.processes import LOG_TAIL_LINES, LOOPBACK, ControlPlaneError, free_ports, terminate
from harness.processes import wait_for as poll
from webhook.install.certs import (
    Issued,
    certificate_pem,
    create_ca,
    issue_serving_certificate,
    private_key_pem,
    write_file_atomically,
)

BUILD_SCRIPT = Path(__file__).resolve().parent / "tools/kueue/build.sh"
ENV = "GPUSHARE_KUEUE"
# A cold build compiles Kueue, controller-runtime and much of client-go: minutes on two cores.
BUILD_TIMEOUT_S = float(os.environ.get("GPUSHARE_KUEUE_BUILD_TIMEOUT", "2400"))
START_TIMEOUT_S = 90.0
WAIT_TIMEOUT_S = 60.0
FIELD_MANAGER = "gpushare-e2e"

API = "/apis/kueue.x-k8s.io/v1beta2"
# The label naming a job's LocalQueue (pkg/controller/constants/constants.go QueueLabel).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Integrations.frameworks names (pkg/controller/jobs/*): a framework whose CRD is missing
# is not refused, its controller waits for the API (jobframework/setup.go).
FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset", "ray.io/rayjob")
# The one path main.go reads the metrics certificate from (no flag or field moves it).
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000


class KueueError(RuntimeError):
    """build.sh failed, a directory is not what build.sh makes, or Kueue did not start."""


# --------------------------------------------------------------------------------------
# The build


@dataclass(frozen=True)
class KueueBuild:
    """A directory build.sh made: the manager, Kueue's CRDs and the version they came from."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "kueue"

    @property
    def crd_files(self) -> list[Path]:
        return sorted((self.root / "crds").glob("*.yaml"))

    @property
    def version(self) -> str:
        return (self.root / "VERSION").read_text().strip()


def load_build(timeout: float = BUILD_TIMEOUT_S) -> KueueBuild:
    """$GPUSHARE_KUEUE, else the directory tools/kueue/build.sh prints (building on a miss)."""
    given = os.environ.get(ENV)
    if given:
        root, where = Path(given), f"{ENV}={given}"
    else:
        root = run_build_script(BUILD_SCRIPT, "tools/kueue/build.sh", KueueError, timeout)
        where = f"tools/kueue/build.sh printed {root}, which"
    build = KueueBuild(root)
    if not os.access(build.binary, os.X_OK) or not build.crd_files:
        raise KueueError(f"{where} is not a directory that tools/kueue/build.sh made")
    return build


# --------------------------------------------------------------------------------------
# Configuration and certificates


def configuration(
    *,
    webhook_port: int,
    health_port: int,
    cert_dir: Path,
    frameworks: Sequence[str] = FRAMEWORKS,
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, apis/config/v1beta2) for a
    manager alone on loopback: no leader election, no certificate rotation, no metrics or
    visibility server. `resources` is the Configuration's `resources` section
    (excludeResourcePrefixes, transformations, deviceClassMappings)."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # Served for the manager's readiness check only: the apiserver never calls it.
        "webhook": {"host": LOOPBACK, "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{health_port}"},
        # "0" disables the metrics server (its certificate is still read: see the docstring).
        "metrics": {"bindAddress": "0"},
        # The visibility server is an aggregated API: it would need an APIService and a port.
        "featureGates": {"VisibilityOnDemand": False},
        "integrations": {"frameworks": list(frameworks)},
    }
    if resources is not None:
        config["resources"] = dict(resources)
    return config


def _write_pair(directory: Path, issued: Issued) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_file_atomically(directory / "tls.key", private_key_pem(issued.key), 0o600)
    write_file_atomically(directory / "tls.crt", certificate_pem(issued.certificate), 0o644)


def _serving_pair(ca: Issued) -> Issued:
    # The in-cluster name Kueue's Service would have, and loopback, where it listens here.
    names = ["kueue-webhook-service.kueue-system.svc", "localhost"]
    return issue_serving_certificate(ca, names, [ipaddress.ip_address(LOOPBACK)], valid_days=1)


# --------------------------------------------------------------------------------------
# The process


def _libc_call(libc: ctypes.CDLL, name: str, *args: object) -> None:
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def _child_setup(etc_upper: Path | None, etc_work: Path) -> Callable[[], None]:
    """preexec_fn: die with the thread that started us; with `etc_upper`, see /etc through
    an overlay whose upper layer is `etc_upper`, in a mount namespace of our own."""
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"lowerdir=/etc,upperdir={etc_upper},workdir={etc_work}".encode()

    def setup() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if etc_upper is None:
            return
        _libc_call(libc, "unshare", _CLONE_NEWNS)
        # Private first, so the overlay never propagates back to the host's namespace.
        _libc_call(libc, "mount", None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None)
        _libc_call(libc, "mount", b"overlay", b"/etc", b"overlay", ctypes.c_ulong(0), options)

    return setup


@dataclass
class KueuePlane:
    """Kueue's manager against `plane`, with its files under `workdir`.

    Use as a context manager, or call start() and stop(). `resources` is the
    Configuration's `resources` section (see `configuration`).
    """

    plane: ControlPlane
    build: KueueBuild
    workdir: Path
    frameworks: Sequence[str] = FRAMEWORKS
    resources: Mapping[str, Any] | None = None
    start_timeout: float = START_TIMEOUT_S

    config_path: Path = field(init=False)
    log_path: Path = field(init=False)
    health_port: int = field(init=False, default=0)
    process: subprocess.Popen[bytes] | None = field(init=False, default=None)
    etc_isolated: bool = field(init=False, default=False)
    crds_installed: bool = field(init=False, default=False)
    _log: IO[bytes] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.config_path = self.workdir / "kueue-config.yaml"
        self.log_path = self.workdir / "kueue.log"

    def __enter__(self) -> KueuePlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Apply the CRDs (unless install_crds ran), write the files, start the manager and
        wait for /readyz."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.crds_installed:
            self.install_crds()
        webhook_port, self.health_port = free_ports(2)
        ca = create_ca("kueue-e2e-ca", valid_days=1)
        cert_dir = self.workdir / "webhook-certs"
        _write_pair(cert_dir, _serving_pair(ca))
        config = configuration(
            webhook_port=webhook_port,
            health_port=self.health_port,
            cert_dir=cert_dir,
            frameworks=self.frameworks,
            resources=self.resources,
        )
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        try:
            self._launch(_serving_pair(ca))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM the manager (SIGKILL after a grace period); close its log."""
        if self.process is not None:
            terminate(self.process, 15.0)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def install_crds(self) -> None:
        """Kueue's CRDs, applied server-side (workloads' is 1.4 MB: too big for the
        last-applied annotation of a client-side apply) and Established."""
        files = [arg for path in self.build.crd_files for arg in ("-f", str(path))]
        applied = self._kubectl(
            "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-o", "name", *files
        )
        self._kubectl("wait", "--for=condition=Established", "--timeout=120s", *applied.split())
        self.crds_installed = True

    def _kubectl(self, *args: str) -> str:
        result = self.plane.kubectl(*args, check=False, timeout=300)
        if result.returncode != 0:
            raise KueueError(f"kubectl {' '.join(args[:3])}: {result.stderr}")
        return result.stdout

    def _launch(self, metrics_pair: Issued) -> None:
        upper = self.workdir / "etc-overlay/upper"
        work = self.workdir / "etc-overlay/work"
        work.mkdir(parents=True, exist_ok=True)
        _write_pair(upper / METRICS_CERT_DIR.relative_to("/etc"), metrics_pair)
        self._log = self.log_path.open("ab")
        try:
            self.process = self._popen(_child_setup(upper, work))
            self.etc_isolated = True
            return
        except subprocess.SubprocessError:  # what a failed preexec_fn raises
            pass
        # No mount namespace here (no CAP_SYS_ADMIN): the files go where main.go looks.
        try:
            _write_pair(METRICS_CERT_DIR, metrics_pair)
        except OSError as exc:
            raise KueueError(
                f"kueue reads its metrics certificate from {METRICS_CERT_DIR}, which this "
                f"process can neither overlay (no mount namespace) nor write: {exc}"
            ) from exc
        self.process = self._popen(_child_setup(None, work))

    def _popen(self, setup: Callable[[], None]) -> subprocess.Popen[bytes]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            # A private HOME: nothing of the user's ~/.kube; the kubeconfig is the plane's.
            "HOME": str(self.workdir),
            "KUBECONFIG": str(self.plane.kubeconfig),
        }
        return subprocess.Popen(
            [str(self.build.binary), f"--config={self.config_path}", "--zap-encoder=console"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=env,
            start_new_session=True,
            preexec_fn=setup,  # noqa: PLW1509 - prctl(2), unshare(2) and mount(2) only
        )

    def check_alive(self) -> None:
        """Raise ControlPlaneError (with the log tail) if the manager has exited."""
        code = None if self.process is None else self.process.poll()
        if self.process is None or code is not None:
            raise ControlPlaneError(f"kueue exited with code {code}\n{self.log_tail()}")

    def _wait_ready(self) -> None:
        def ready() -> bool | None:
            self.check_alive()
            connection = http.client.HTTPConnection(LOOPBACK, self.health_port, timeout=5)
            try:
                connection.request("GET", "/readyz")
                return True if connection.getresponse().status == 200 else None
            finally:
                connection.close()

        poll("kueue /readyz", ready, timeout=self.start_timeout, on_timeout=self.log_tail)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of the manager's log, with a header."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"--- kueue: cannot read {self.log_path}: {exc}"
        tail = "\n".join(text[-lines:])
        return f"--- kueue ({self.log_path}, last {min(lines, len(text))} lines) ---\n{tail}"

    # -- API ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """One raw JSON call on the plane's admin client (non-2xx raises ApiException):
        the generated models know no Kueue, JobSet or RayJob types."""
        api = self.plane.api
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        call = api.param_serialize(
            method, path, query_params=list(query), header_params=headers, body=body
        )
        response = api.call_api(*call)
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        result: dict[str, Any] = json.loads(data)
        return result

    def create_resource_flavor(
        self, name: str, node_labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """A ResourceFlavor; one that already exists is left as it is and returned."""
        flavor = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": name},
            "spec": {"nodeLabels": dict(node_labels)} if node_labels else {},
        }
        try:
            return self.request("POST", f"{API}/resourceflavors", flavor)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return self.request("GET", f"{API}/resourceflavors/{name}")

    def create_cluster_queue(
        self,
        name: str,
        quotas: Mapping[str, str | int],
        *,
        flavor: str = "default",
        namespace_selector: Mapping[str, Any] | None = None,
        wait: bool = True,
    ) -> dict[str, Any]:
        """A ClusterQueue of one resource group: `quotas` maps each covered resource to its
        nominal quota in `flavor`. A None selector means every namespace (Kueue's own
        default, a null selector, admits none); waits until Active unless wait=False."""
        queue = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": dict(namespace_selector or {}),
                "resourceGroups": [
                    {
                        "coveredResources": list(quotas),
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": resource, "nominalQuota": str(quota)}
                                    for resource, quota in quotas.items()
                                ],
                            }
                        ],
                    }
                ],
            },
        }
        created = self.request("POST", f"{API}/clusterqueues", queue)
        return self.wait_active(f"{API}/clusterqueues/{name}") if wait else created

    def create_local_queue(
        self, namespace: str, name: str, cluster_queue: str, *, wait: bool = True
    ) -> dict[str, Any]:
        """A LocalQueue in `namespace` pointing at `cluster_queue`; waits until Active."""
        queue = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        }
        path = f"{API}/namespaces/{namespace}/localqueues"
        created = self.request("POST", path, queue)
        return self.wait_active(f"{path}/{name}") if wait else created

    def wait_active(self, path: str, timeout: float = WAIT_TIMEOUT_S) -> dict[str, Any]:
        """The queue at `path` once its Active condition is True (Kueue has taken it in)."""

        def active() -> dict[str, Any] | None:
            self.check_alive()
            queue = self.request("GET", path)
            condition = find_condition(queue, "Active")
            return queue if condition and condition.get("status") == "True" else None

        return poll(f"{path} Active", active, timeout=timeout, on_timeout=self._why(path))

    # -- what Kueue decided -------------------------------------------------------------

    def suspended(self, path: str) -> bool:
        """The `spec.suspend` of the job-like object at `path` (a missing field is False)."""
        return bool(self.request("GET", path).get("spec", {}).get("suspend", False))

    def wait_unsuspended(self, path: str, timeout: float = WAIT_TIMEOUT_S) -> dict[str, Any]:
        """The object at `path` once Kueue has admitted it (spec.suspend false)."""

        def admitted() -> dict[str, Any] | None:
            self.check_alive()
            job = self.request("GET", path)
            return None if job.get("spec", {}).get("suspend", False) else job

        return poll(f"{path} unsuspended", admitted, timeout=timeout, on_timeout=self._why(path))

    def stays_suspended(self, path: str, duration: float) -> bool:
        """True if the object at `path` keeps spec.suspend true for `duration` seconds."""
        try:
            self.wait_unsuspended(path, timeout=duration)
        except ControlPlaneError:
            self.check_alive()
            return self.suspended(path)  # a GET that fails raises, not "still suspended"
        return False

    def workload_of(self, namespace: str, owner_uid: str) -> dict[str, Any] | None:
        """The Workload Kueue made for the object with `owner_uid` (its controller owner)."""
        workloads = self.request("GET", f"{API}/namespaces/{namespace}/workloads")["items"]
        for workload in workloads:
            owners = workload.get("metadata", {}).get("ownerReferences", [])
            if any(owner.get("uid") == owner_uid for owner in owners):
                return dict(workload)
        return None

    def wait_workload(
        self,
        namespace: str,
        owner_uid: str,
        until: Callable[[dict[str, Any]], bool] = lambda _: True,
        timeout: float = WAIT_TIMEOUT_S,
    ) -> dict[str, Any]:
        """The owner's Workload once it exists and `until(workload)` holds."""

        def found() -> dict[str, Any] | None:
            self.check_alive()
            workload = self.workload_of(namespace, owner_uid)
            return workload if workload is not None and until(workload) else None

        what = f"the Workload of {owner_uid} in {namespace}"
        return poll(what, found, timeout=timeout, on_timeout=self.log_tail)

    def _why(self, path: str) -> Callable[[], str]:
        def report() -> str:
            try:
                current = json.dumps(self.request("GET", path).get("status", {}), indent=1)
            except ApiException as exc:
                current = f"GET failed: {exc.status} {exc.reason}"
            return f"status of {path}: {current}\n{self.log_tail()}"

        return report


def find_condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type `kind`, if the object has one."""
    for condition in obj.get("status", {}).get("conditions", []):
        if condition.get("type") == kind:
            return dict(condition)
    return None


def admission(workload: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Workload's `status.admission` (ClusterQueue and podSetAssignments), None if none."""
    found = workload.get("status", {}).get("admission")
    return dict(found) if found else None


def pending_message(workload: Mapping[str, Any]) -> str | None:
    """Why Kueue has not reserved quota for a Workload: the message of its QuotaReserved
    condition while that is False (e.g. "couldn't assign flavors to pod set main:
    insufficient unused quota for ..."), else None."""
    condition = find_condition(workload, "QuotaReserved")
    if condition is None or condition.get("status") != "False":
        return None
    return str(condition.get("message", ""))
