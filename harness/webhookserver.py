"""gpushare's webhook next to the e2e control plane, and the test-only admission servers.

This module owns everything between "a control plane runs" (controlplane.py) and "the
apiserver calls gpushare":

- `gpushare(...)`: the CLI exactly as a user runs it (`certs`, `webhook-config`, `mutate`),
  each call its own process; `predict()` is the offline `gpushare mutate` of one pod;
- `WebhookServer`: `gpushare serve` (gunicorn, TLS) as a subprocess on a free loopback port,
  with certificates from `gpushare certs`, its /metrics counters and its JSON admission log;
- `Registration`: server-side apply of the configurations `gpushare webhook-config` prints,
  and their removal; `probe()` says what the apiserver does right now with an annotated pod
  and with a pod asking for the shared resource by hand (server-side dry runs), which is how
  every change of registration is waited for: the apiserver picks webhook configurations up
  through an informer, a moment after the write, so only polling tells when one is in force;
- `create_pod()`: a create through the Python client that keeps what the client drops by
  default: the raw JSON the apiserver stored and its `Warning` headers;
- `AdmissionServer`: a tiny TLS admission webhook inside the test process (a second mutator
  for the reinvocation tests); `DelayingProxy`: a TCP relay that holds each connection back,
  which makes the real webhook slower than its `timeoutSeconds` without changing it.

Used by tests/e2e/conftest.py and bench/e2e_bench.py. Nothing here sleeps for a fixed time:
waits poll with deadlines (`controlplane.wait_for`).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import http.client
import io
import json
import os
import re
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from harness.processes import LOOPBACK, ControlPlaneError, free_ports, wait_for
from webhook.constants import (
    APPLIED_ANNOTATION,
    FRACTION_ANNOTATION,
)

REPO = Path(__file__).resolve().parents[2]
# `gpushare` is the console script for webhook.cli:main; running the module with this very
# interpreter needs no PATH and no installed script.
GPUSHARE = (sys.executable, "-m", "webhook.cli")
CLI_TIMEOUT_S = 60.0
SERVER_START_TIMEOUT_S = 60.0
ADMISSION_LOG_DEADLINE_SECONDS = 5.0

SHARED_RESOURCE = "nvidia.com/gpu.shared"
MUTATING_WEBHOOK = "mutate.gpushare.io"
VALIDATING_WEBHOOK = "validate.gpushare.io"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
FIELD_MANAGER = "gpushare-e2e"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: there is no kubelet

_PR_SET_PDEATHSIG = 1


class CliError(RuntimeError):
    """`gpushare <command>` failed; the message carries its output."""


def gpushare(
    *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `gpushare <args>` and capture its text output."""
    result = subprocess.run(
        [*GPUSHARE, *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=REPO,
        env=_clean_environment(),
        check=False,
    )
    if check and result.returncode != 0:
        raise CliError(
            f"gpushare {' '.join(args)} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
    return result


def _clean_environment() -> dict[str, str]:
    """The caller's environment without settings that would redirect gpushare."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GPUSHARE_") and key != "PROMETHEUS_MULTIPROC_DIR"
    }
    environ["PYTHONUNBUFFERED"] = "1"
    return environ


# --------------------------------------------------------------------------------------
# The offline prediction


@dataclass(frozen=True)
class Prediction:
    """What `gpushare mutate` says about a pod: the admitted pod, or the denial reasons."""

    pod: dict[str, Any] | None
    warnings: tuple[str, ...]
    denied: tuple[str, ...]


def predict(
    pod: Mapping[str, Any], policies: Path, namespace: str, *, in_process: bool = True
) -> Prediction:
    """`gpushare mutate -o json` of `pod` in `namespace` with `policies` (exit 3: denied).

    In process by default: the same `webhook.cli.main` the `gpushare` script runs, with the
    same arguments, minus half a second of interpreter start per call; `in_process=False`
    runs the command in a subprocess.
    """
    with tempfile.TemporaryDirectory(prefix="gpushare-predict-") as scratch:
        manifest = Path(scratch) / "pod.json"
        manifest.write_text(json.dumps(pod))
        argv = [
            "mutate",
            f"--file={manifest}",
            f"--policies={policies}",
            f"--namespace={namespace}",
            "--output=json",
        ]
        if in_process:
            code, stdout, stderr = _run_cli_in_process(argv)
        else:
            result = gpushare(*argv, check=False)
            code, stdout, stderr = result.returncode, result.stdout, result.stderr
    if code not in (0, 3):
        raise CliError(f"gpushare mutate exited {code}\n{stderr}")
    lines = stderr.splitlines()
    warnings = tuple(
        line.removeprefix("warning: ") for line in lines if line.startswith("warning: ")
    )
    denied = tuple(line.removeprefix("denied: ") for line in lines if line.startswith("denied: "))
    mutated = json.loads(stdout) if code == 0 else None
    return Prediction(mutated, warnings, denied)


def _run_cli_in_process(argv: Sequence[str]) -> tuple[int, str, str]:
    from webhook.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


# --------------------------------------------------------------------------------------
# gpushare serve


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the thread that started it dies.

    The process execs into the gunicorn arbiter (the signal setting survives exec), and
    gunicorn workers exit once their arbiter is gone, so a killed test run leaves nothing.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_logged_process(
    command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` with stdout and stderr appended to `log_path`, dying with us."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=dict(env) if env is not None else _clean_environment(),
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl(2)
        )


def write_certificates(directory: Path, service: str = "gpushare") -> Path:
    """`gpushare certs` for `service` in gpushare-system, valid for 127.0.0.1 too."""
    gpushare(
        "certs",
        "--service",
        service,
        "--namespace",
        "gpushare-system",
        "--ip",
        LOOPBACK,
        "--out",
        str(directory),
    )
    return directory


class AdmissionCounts(dict[tuple[str, str], float]):
    """gpushare_admission_requests_total by (endpoint, outcome), summed over workers."""

    def total(self, endpoint: str | None = None) -> float:
        return sum(v for (e, _), v in self.items() if endpoint is None or e == endpoint)

    def minus(self, before: AdmissionCounts) -> dict[tuple[str, str], float]:
        """The counts that changed since `before`, as plain numbers."""
        keys = set(self) | set(before)
        changed = {k: self.get(k, 0.0) - before.get(k, 0.0) for k in keys}
        return {k: v for k, v in changed.items() if v}


@dataclass
class WebhookServer:
    """A running `gpushare serve` (the gunicorn arbiter after exec) on a loopback port."""

    process: subprocess.Popen[bytes]
    port: int
    cert_dir: Path
    policies: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    @classmethod
    def start(
        cls,
        workdir: Path,
        policies: Path,
        *,
        workers: int | None = 2,
        threads: int | None = 4,
        extra_args: Sequence[str] = (),
        timeout: float = SERVER_START_TIMEOUT_S,
    ) -> WebhookServer:
        """`gpushare certs`, then `gpushare serve`; returns once /readyz answers 200."""
        workdir.mkdir(parents=True, exist_ok=True)
        cert_dir = write_certificates(workdir / "certs")
        (port,) = free_ports(1)
        log_path = workdir / "gpushare-serve.log"
        command = [
            *GPUSHARE,
            "serve",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--cert-dir",
            str(cert_dir),
            "--policies",
            str(policies),
            "--state-dir",
            str(workdir / "state"),
            "--exclude-namespace",
            "gpushare-system",
            # None: what `gpushare serve` chooses by itself.
            *(["--workers", str(workers)] if workers is not None else []),
            *(["--threads", str(threads)] if threads is not None else []),
            *extra_args,
        ]
        process = start_logged_process(command, log_path)
        server = cls(process, port, cert_dir, policies, log_path)
        try:
            server.wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ControlPlaneError(f"gpushare serve exited with code {code}\n{self.log_tail()}")

    def wait_ready(self, timeout: float) -> None:
        def ready() -> bool | None:
            self.check_alive()
            status, _ = self.get("/readyz")
            return True if status == 200 else None

        wait_for("gpushare serve /readyz", ready, timeout=timeout, on_timeout=self.log_tail)

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def get(self, path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(
            LOOPBACK, self.port, context=self.ssl_context(), timeout=10
        )
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def admission_counts(self) -> AdmissionCounts:
        """The webhook's own request counters, from /metrics."""
        status, body = self.get("/metrics")
        if status != 200:
            raise AssertionError(f"/metrics answered {status}: {body[:200]!r}")
        counts = AdmissionCounts()
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == "gpushare_admission_requests_total":
                    key = (sample.labels["endpoint"], sample.labels["outcome"])
                    counts[key] = counts.get(key, 0.0) + sample.value
        return counts

    def admissions(
        self, namespace: str | None = None, pod: str | None = None
    ) -> list[dict[str, Any]]:
        """The JSON admission log lines (one per request answered), optionally filtered.

        Workers write these lines in batches, up to 0.2 s late: first wait until there are
        as many as /metrics has counted admissions (both are recorded for every request).
        """
        answered = sum(self.admission_counts().values())
        deadline = time.monotonic() + ADMISSION_LOG_DEADLINE_SECONDS
        entries = self._admission_lines()
        while len(entries) < answered and time.monotonic() < deadline:
            time.sleep(0.05)
            entries = self._admission_lines()
        return [
            entry
            for entry in entries
            if (namespace is None or entry.get("namespace") == namespace)
            and (pod is None or entry.get("pod") == pod)
        ]

    def _admission_lines(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("message") == "admission":
                entries.append(entry)
        return entries

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"--- gpushare serve: cannot read {self.log_path}: {exc}"
        return f"--- gpushare serve ({self.log_path}) ---\n" + "\n".join(text[-lines:])

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (gunicorn drains), then SIGKILL after `grace` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=grace)


# --------------------------------------------------------------------------------------
# Registration


def webhook_configuration(ca_file: Path, url: str, *extra_args: str) -> list[dict[str, Any]]:
    """The documents `gpushare webhook-config --ca CA --url URL [extra]` prints."""
    text = gpushare("webhook-config", "--ca", str(ca_file), "--url", url, *extra_args).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def excluded_namespaces(documents: Sequence[Mapping[str, Any]]) -> set[str]:
    """The namespaces the configurations' namespaceSelector keeps away from the webhook."""
    names: set[str] = set()
    for document in documents:
        for webhook in document["webhooks"]:
            for expression in webhook["namespaceSelector"].get("matchExpressions", []):
                if (
                    expression["key"] == "kubernetes.io/metadata.name"
                    and expression["operator"] == "NotIn"
                ):
                    names.update(expression["values"])
    return names


@dataclass(frozen=True)
class Registration:
    """Writes and removes admission webhook configurations (server-side apply)."""

    api: k8s.ApiClient

    @property
    def _admission(self) -> k8s.AdmissionregistrationV1Api:
        return k8s.AdmissionregistrationV1Api(self.api)

    def apply(self, documents: Sequence[Mapping[str, Any]]) -> None:
        for document in documents:
            name = document["metadata"]["name"]
            options: dict[str, Any] = {
                "field_manager": FIELD_MANAGER,
                "force": True,
                "_content_type": APPLY_CONTENT_TYPE,
            }
            if document["kind"] == "MutatingWebhookConfiguration":
                self._admission.patch_mutating_webhook_configuration(
                    name, dict(document), **options
                )
            elif document["kind"] == "ValidatingWebhookConfiguration":
                self._admission.patch_validating_webhook_configuration(
                    name, dict(document), **options
                )
            else:
                raise ValueError(f"not a webhook configuration: {document['kind']}")

    def delete(self, name: str, *, mutating: bool = True, validating: bool = True) -> None:
        """Delete the configurations called `name`; absent ones are fine."""
        deletes = []
        if mutating:
            deletes.append(self._admission.delete_mutating_webhook_configuration)
        if validating:
            deletes.append(self._admission.delete_validating_webhook_configuration)
        for delete in deletes:
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


class Probe(NamedTuple):
    """What the apiserver does right now with two dry-run pods.

    Each field is "mutated" (admitted with our annotation), "admitted" (admitted as sent) or
    "rejected: <message>".
    """

    annotated: str
    direct: str


def probe_pod(name: str, *, annotated: bool) -> dict[str, Any]:
    """An annotated pod, or one asking for the shared resource by hand."""
    container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE}
    metadata: dict[str, Any] = {"name": name}
    if annotated:
        metadata["annotations"] = {FRACTION_ANNOTATION: "0.5"}
    else:
        resources = {SHARED_RESOURCE: "1"}
        container["resources"] = {"requests": resources, "limits": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container]},
    }


def annotated_pod(name: str, fraction: str = "0.5", **extra: Any) -> dict[str, Any]:
    """A small annotated pod (TensorFlow image: the policy adds its memory knobs)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "tensorflow/tensorflow:2.17.0-gpu",
        "command": ["python", "/app/serve.py"],
        **extra,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {FRACTION_ANNOTATION: fraction}},
        "spec": {"containers": [container]},
    }


def plain_pod(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "plain"}},
        "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE, **extra}]},
    }


def _probe_one(api: k8s.ApiClient, namespace: str, pod: dict[str, Any]) -> str:
    try:
        admitted = create_pod(api, namespace, pod, dry_run=True)
    except ApiException as exc:
        return f"rejected: {status_message(exc)}"
    annotations = admitted.pod["metadata"].get("annotations") or {}
    return "mutated" if APPLIED_ANNOTATION in annotations else "admitted"


def probe(api: k8s.ApiClient, namespace: str) -> Probe:
    """Server-side dry runs (no side effects) of an annotated and of a direct-request pod."""
    suffix = uuid.uuid4().hex[:8]
    return Probe(
        annotated=_probe_one(api, namespace, probe_pod(f"probe-a-{suffix}", annotated=True)),
        direct=_probe_one(api, namespace, probe_pod(f"probe-d-{suffix}", annotated=False)),
    )


def wait_for_probe(
    api: k8s.ApiClient,
    namespace: str,
    expected: Callable[[Probe], bool],
    what: str,
    timeout: float = 30.0,
) -> Probe:
    """Poll `probe()` until `expected` holds; the last probe goes into the timeout message."""
    last: list[Probe] = []

    def check() -> Probe | None:
        result = probe(api, namespace)
        last[:] = [result]
        return result if expected(result) else None

    return wait_for(
        what, check, timeout=timeout, interval=0.05, on_timeout=lambda: f"last probe: {last}"
    )


def registered(result: Probe) -> bool:
    """gpushare's default registration is in force: both webhooks answer."""
    return result.annotated == "mutated" and result.direct.startswith(
        f'rejected: admission webhook "{VALIDATING_WEBHOOK}" denied the request'
    )


def unregistered(result: Probe) -> bool:
    """No webhook of gpushare is in force: both pods go through as sent."""
    return result == Probe("admitted", "admitted")


# --------------------------------------------------------------------------------------
# Creating pods and reading what the apiserver said


@dataclass(frozen=True)
class Admitted:
    """A pod as the apiserver returned it (raw JSON) and the warnings it sent along."""

    pod: dict[str, Any]
    warnings: list[str]


_WARNING = re.compile(r'^\d{3} \S+ "(?P<text>(?:[^"\\]|\\.)*)"')


def parse_warnings(values: Sequence[str]) -> list[str]:
    """Texts of `Warning: 299 - "text"` headers (RFC 7234 warn-code, agent, quoted text)."""
    texts = []
    for value in values:
        match = _WARNING.match(value)
        if match is None:
            raise AssertionError(f"unexpected Warning header: {value!r}")
        texts.append(re.sub(r"\\(.)", r"\1", match.group("text")))
    return texts


def create_pod(
    api: k8s.ApiClient, namespace: str, pod: Mapping[str, Any], *, dry_run: bool = False
) -> Admitted:
    """POST the pod as raw JSON and keep what the client models drop: the body and warnings.

    Goes through the client's own request path (auth, TLS, the urllib3 pool) but not its
    generated `create_namespaced_pod`: since v35 that validates a dict body against pydantic
    models, which refuse JSON the apiserver accepts (a quantity written as the integer 1).
    The models also never surface the apiserver's `Warning` headers (kubectl prints them as
    `Warning: ...` on stderr); the raw response carries them. Non-2xx raises ApiException,
    as the generated method would.
    """
    query: list[tuple[str, str]] = [("dryRun", "All")] if dry_run else []
    method, url, headers, body, post = api.param_serialize(
        "POST",
        "/api/v1/namespaces/{namespace}/pods",
        path_params={"namespace": namespace},
        query_params=query,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=dict(pod),
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, headers, body, post)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return Admitted(json.loads(data), parse_warnings(response.headers.getlist("Warning")))


# Where the apiserver's defaulting alone (no webhook: kube-system is excluded by the
# registration's namespaceSelector) turns a predicted pod into what storage would hold.
NORMALIZE_NAMESPACE = "kube-system"
SERVER_SET_METADATA = ("uid", "creationTimestamp", "resourceVersion", "managedFields", "generation")


def as_admitted(api: k8s.ApiClient, pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the apiserver would store it, by a server-side dry run in kube-system.

    The webhook never sees kube-system, so this is the apiserver's decoding and defaulting
    only (imagePullPolicy, terminationMessagePath, quantity canonical forms, ...): the
    offline prediction made comparable, field for field, with a pod that went through the
    webhook.
    """
    expected = copy.deepcopy(pod)
    expected["metadata"]["namespace"] = NORMALIZE_NAMESPACE
    expected["metadata"]["name"] = f"expected-{uuid.uuid4().hex[:8]}"
    expected["metadata"].pop("generateName", None)
    return create_pod(api, NORMALIZE_NAMESPACE, expected, dry_run=True).pod


def webhook_input(api: k8s.ApiClient, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the mutating webhook receives it: decoded and defaulted by the apiserver.

    Defaulting matters: limits without requests get requests copied from them, and the
    DefaultTolerationSeconds plugin (which runs before webhooks) appends its tolerations.
    Name and namespace are the original ones; fields the apiserver sets only when storing
    (uid, timestamps, status) are dropped, as the webhook never sees them.
    """
    defaulted = as_admitted(api, pod)
    metadata = defaulted["metadata"]
    for key in SERVER_SET_METADATA:
        metadata.pop(key, None)
    for key in ("namespace", "name"):
        metadata.pop(key, None)
    for key in ("namespace", "name", "generateName"):
        if key in pod["metadata"]:
            metadata[key] = pod["metadata"][key]
    defaulted.pop("status", None)
    return defaulted


def status_message(exc: ApiException) -> str:
    """The `message` of the Status the apiserver answered an error with."""
    try:
        status = json.loads(exc.body or "")
    except json.JSONDecodeError:
        return str(exc.body)
    return str(status.get("message", exc.body))


def ensure_namespace(core: k8s.CoreV1Api, name: str) -> None:
    """Create namespace `name` unless it exists (nothing deletes namespaces here)."""
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    except ApiException as exc:
        if exc.status != 409:
            raise


# --------------------------------------------------------------------------------------
# A test-only admission webhook


Responder = Callable[[dict[str, Any]], dict[str, Any]]


class _AdmissionHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection ends its thread
    server: _TlsHttpServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        review = json.loads(self.rfile.read(length))
        request = review["request"]
        owner = self.server.owner
        owner.record(request)
        response = {"uid": request["uid"], **owner.respond(request)}
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest's output clean; requests are recorded instead


class _TlsHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: AdmissionServer, context: ssl.SSLContext) -> None:
        self.owner = owner
        self.context = context
        super().__init__((LOOPBACK, 0), _AdmissionHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handshake runs in the connection's own thread, not in the accept loop.
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)  # type: ignore[arg-type]
        except (ssl.SSLError, OSError):
            pass
        finally:
            tls.close()


@dataclass
class AdmissionServer:
    """An AdmissionReview v1 server over TLS in this process, answering with `respond`.

    `respond(request)` returns the response fields besides `uid` (allowed, patch, ...);
    every request it got is kept in `requests`, in order.
    """

    cert_dir: Path
    respond: Responder
    requests: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _server: _TlsHttpServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def record(self, request: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(request)

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def __enter__(self) -> AdmissionServer:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert_dir / "tls.crt"), str(self.cert_dir / "tls.key"))
        context.set_alpn_protocols(["http/1.1"])
        self._server = _TlsHttpServer(self, context)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


# --------------------------------------------------------------------------------------
# A slow network path


@dataclass
class DelayingProxy:
    """A TCP relay to 127.0.0.1:`upstream_port` that waits `delay` seconds per connection.

    TLS passes through untouched (the upstream's certificate is what the client sees), so
    registering `https://127.0.0.1:<proxy port>` with the upstream's CA makes a webhook as
    slow as `delay` without changing it. Set `delay` to 0 to make it transparent.
    """

    upstream_port: int
    delay: float
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _listener: socket.socket | None = field(default=None, repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, repr=False)
    _sockets: list[socket.socket] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return int(self._listener.getsockname()[1])

    def __enter__(self) -> DelayingProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((LOOPBACK, 0))
        listener.listen(64)
        listener.settimeout(0.1)
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=10)
        with self._lock:
            for sock in self._sockets:
                sock.close()
        if self._listener is not None:
            self._listener.close()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
        return sock

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, self._track(client))

    def _serve(self, client: socket.socket) -> None:
        # The client's bytes (its TLS ClientHello first) wait here; the apiserver's own
        # timeout is what ends the request.
        if self._stop.wait(self.delay):
            return
        try:
            upstream = self._track(socket.create_connection((LOOPBACK, self.upstream_port), 5))
        except OSError:
            return
        self._relay(client, upstream)

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    ready = typing.cast(socket.socket, key.fileobj)
                    try:
                        data = ready.recv(65536)
                        if not data:
                            return
                        peers[ready].sendall(data)
                    except OSError:
                        return


def closed_port() -> int:
    """A loopback port nothing listens on (a webhook that is down: connection refused)."""
    (port,) = free_ports(1)
    with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1):
        raise ControlPlaneError(f"port {port} unexpectedly accepts connections")
    return port


# --------------------------------------------------------------------------------------
# gpushare served and registered


@dataclass
class GpushareWebhook:
    """`gpushare serve` plus its registration in one control plane.

    `documents` are the configurations `gpushare webhook-config --ca <ca> --url <server>
    --policies <policies>` prints: the default registration that `register()` puts in force
    and that `registered_as()` comes back to.
    """

    server: WebhookServer
    api: k8s.ApiClient
    probe_namespace: str
    documents: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.documents:
            self.documents = self.configuration()

    @property
    def registration(self) -> Registration:
        return Registration(self.api)

    @property
    def policies(self) -> Path:
        return self.server.policies

    def configuration(self, *extra_args: str, url: str | None = None) -> list[dict[str, Any]]:
        """`gpushare webhook-config` for this server (or `url`), with `extra_args`."""
        return webhook_configuration(
            self.server.ca_file,
            url or self.server.url,
            "--policies",
            str(self.server.policies),
            *extra_args,
        )

    def probe(self) -> Probe:
        return probe(self.api, self.probe_namespace)

    def wait(self, expected: Callable[[Probe], bool], what: str, timeout: float = 30.0) -> Probe:
        return wait_for_probe(self.api, self.probe_namespace, expected, what, timeout)

    def register(self) -> None:
        """Apply the default registration and wait until both webhooks answer."""
        self.registration.apply(self.documents)
        self.wait(registered, "gpushare's webhooks to be in force")

    def unregister(self) -> None:
        """Delete the registration and wait until pods go through as sent."""
        for document in self.documents:
            self.registration.delete(document["metadata"]["name"])
        self.wait(unregistered, "gpushare's webhooks to be gone")

    def swap(
        self,
        documents: Sequence[Mapping[str, Any]],
        expected: Callable[[Probe], bool],
        what: str,
        timeout: float = 30.0,
    ) -> Probe:
        """Apply `documents` (replacing same-named ones) and wait until `expected` holds."""
        self.registration.apply(documents)
        return self.wait(expected, what, timeout)

    def restore(self, extra_names: Sequence[str] = ()) -> None:
        """Back to the default registration: delete `extra_names`, re-apply, wait."""
        for name in extra_names:
            self.registration.delete(name)
        self.register()
