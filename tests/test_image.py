"""The container images, built by ``scripts/image`` and run the way a kubelet would run them.

First, without building anything, the Dockerfile itself: its base pinned by digest, nothing
in it specific to one architecture, two targets (the admission image without the Kubernetes
client, the cluster image with it), the base's pip removed, and no claim anywhere that the
image has no shell (both bases have /bin/sh).

``scripts/image`` builds the Dockerfile with buildah on a Debian base made by mmdebstrap
from this machine's package mirror (no registry is reachable here); GPUSHARE_IMAGE_BASE=stock
builds on the Dockerfile's own (pinned) python base instead, where a registry is reachable,
and any other value is passed as ``--base``. The image's own
ENTRYPOINT and CMD, read with ``buildah inspect``, then run under ``buildah run --isolation
chroot`` (``podman run`` cannot set up cgroups here) on the host network, as the image's
non-root USER, with what a Pod would mount: the TLS Secret (key readable only by that
user), a policies ConfigMap (read-only) and an emptyDir at /tmp. The host checks /readyz over
TLS against the CA, sends one admission and stops the server with SIGTERM, as the kubelet does.

Cost: with the base and the dependency layer cached (~/.cache/gpushare/image and
buildah's layer cache), the build takes about a minute and the checks seconds. A cold
machine first spends minutes on mmdebstrap and the wheels (the README's "Image" section
has the figures). The builds are skipped where buildah is not installed, or not as root
(chroot isolation and mmdebstrap need root here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.support import annotated_pod, decoded_patch, free_port, review, wait_until
from webhook.install.certs import parse_ip_addresses, write_certificates

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "image"
DOCKERFILE = REPO / "Dockerfile"
RUNTIME_UID = 65532
BUILD_TIMEOUT_S = 1800  # a cold machine: mmdebstrap plus every wheel from PyPI

# The first build test builds the image: minutes on a cold machine (pytest's default is 300 s).
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 300)
if shutil.which("buildah") is None:
    CANNOT_BUILD = (
        "buildah is not installed (as root: apt-get install -y buildah podman mmdebstrap)"
    )
elif os.geteuid() != 0:
    CANNOT_BUILD = "buildah's chroot isolation and mmdebstrap need root here"
else:
    CANNOT_BUILD = ""
needs_buildah = pytest.mark.skipif(bool(CANNOT_BUILD), reason=CANNOT_BUILD)


# -- the Dockerfile, read ---------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, no comments."""
    lines = [
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def stages() -> dict[str, str]:
    """Stage name -> what it is built FROM, in order."""
    named = {}
    for keyword, rest in instructions():
        if keyword == "FROM":
            parts = rest.split()
            assert len(parts) == 3 and parts[1].upper() == "AS", rest
            named[parts[2]] = parts[0]
    return named


def test_the_base_is_pinned_by_digest_and_every_stage_starts_from_it_or_a_stage() -> None:
    arguments = dict(
        rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest
    )
    assert re.fullmatch(
        r"docker\.io/library/python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", arguments["BASE"]
    ), arguments
    built = stages()
    for name, source in built.items():
        earlier = list(built)[: list(built).index(name)]
        assert source == "${BASE}" or source in earlier, (name, source)
    # The admission image is the default target (the last stage); the cluster image another.
    assert list(built)[-1] == "admission" and "cluster" in built
    # scripts/image pins the base it builds by its image ID.
    script = SCRIPT.read_text()
    assert "--format '{{.FromImageID}}' \"$base_image\")" in script
    assert '--build-arg "BASE=$base_id"' in script


def test_nothing_in_the_dockerfile_is_for_one_architecture_only() -> None:
    """Built for linux/amd64 and linux/arm64 alike: no architecture named outside comments,
    no --platform pinning a stage, nothing downloaded but binary wheels pip picks per
    platform."""
    for keyword, rest in instructions():
        lowered = rest.lower()
        for word in ("amd64", "x86_64", "x86-64", "aarch64", "arm64", "--platform"):
            assert word not in lowered, (keyword, rest)
        assert keyword != "ADD", rest  # no remote or archive downloads
        assert not re.search(r"\b(curl|wget)\b", lowered), rest
        if "pip install" in lowered and "--no-deps" not in lowered:
            assert "--only-binary=:all:" in lowered, rest


def test_the_admission_image_lacks_the_kubernetes_client_and_the_cluster_image_has_it() -> None:
    text = DOCKERFILE.read_text()
    built = stages()
    assert built["cluster"] == "image" and built["admission"] == "image"
    assert built["cluster-dependencies"] == "dependencies"
    stage_text = dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text, re.M | re.S))
    assert '["optional-dependencies"]["cluster"]' in stage_text["cluster-dependencies"]
    assert "optional-dependencies" not in stage_text["dependencies"]
    assert "--from=runtime " in stage_text["admission"]
    assert "--from=cluster-runtime " in stage_text["cluster"]
    # The shared stage takes the base's own installer out before the user switch.
    shared = stage_text["image"]
    assert "pip uninstall" in shared and shared.index("pip uninstall") < shared.index("USER")


NO_SHELL = re.compile(r"\bno (?:/bin/sh|sh|shell)\b", re.IGNORECASE)


def test_nothing_claims_the_image_has_no_shell() -> None:
    """Both bases (python slim, Debian) have /bin/sh: no comment or page may say otherwise."""
    paths = [DOCKERFILE, REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    paths += sorted(p for p in (REPO / "deploy").rglob("*") if p.suffix in (".yaml", ".tpl"))
    claims = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for path in paths
        for line in path.read_text().splitlines()
        if NO_SHELL.search(line)
    ]
    assert not claims, claims


# -- the images, built and run ----------------------------------------------------------------


def build(*args: str) -> str:
    base = os.environ.get("GPUSHARE_IMAGE_BASE", "")
    chosen = ["--stock"] if base == "stock" else ["--base", base] if base else []
    started = time.monotonic()
    result = subprocess.run(
        [str(SCRIPT), *chosen, *args],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"scripts/image failed:\n{result.stderr[-4000:]}"
    name = result.stdout.strip().splitlines()[-1]
    elapsed = time.monotonic() - started
    size = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", name],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout.strip()  # fmt: skip
    print(f"\nscripts/image {' '.join(args)}: {name} built in {elapsed:.0f}s, {size} bytes")
    return name


def buildah(*args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"buildah {' '.join(args)}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def image() -> str:
    return build()


@pytest.fixture(scope="module")
def cluster_image(image: str) -> str:
    del image  # built first: the cluster image reuses its cached stages
    return build("--cluster")


@pytest.fixture(scope="module")
def config(image: str) -> dict[str, Any]:
    inspected = json.loads(buildah("inspect", "--type", "image", image))
    oci_config: dict[str, Any] = inspected["OCIv1"]["config"]
    return oci_config


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = buildah("from", "--pull-never", image).strip()
    try:
        yield name
    finally:
        buildah("rm", name)


@pytest.fixture
def cluster_container(cluster_image: str) -> Iterator[str]:
    name = buildah("from", "--pull-never", cluster_image).strip()
    try:
        yield name
    finally:
        buildah("rm", name)


def run_in(container: str, *command: str, timeout: float = 60) -> str:
    """A command in the container as the image's USER (buildah run applies it)."""
    return buildah("run", "--isolation", "chroot", container, "--", *command, timeout=timeout)


@needs_buildah
def test_the_image_runs_as_a_numeric_non_root_user(config: dict[str, Any], container: str) -> None:
    # Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
    assert config["User"] == f"{RUNTIME_UID}:{RUNTIME_UID}"
    ids = run_in(container, "python3", "-c", "import os; print(os.getuid(), os.getgid())")
    assert ids.split() == [str(RUNTIME_UID), str(RUNTIME_UID)]


# Run inside the image: what the runtime must not carry or must not allow. The base's own
# interpreter is asked too: the stock python base ships pip in /usr/local (the Dockerfile's
# shared stage removes it), a Debian base has none.
INSPECT_RUNTIME = """
import importlib.util, json, os, shutil, subprocess, sys
FIND = "import importlib.util as u, sys; sys.exit(0 if u.find_spec(sys.argv[1]) else 3)"
def base_has(module):
    return subprocess.run([sys._base_executable, "-c", FIND, module]).returncode == 0
print(json.dumps({
    "python": sys.executable,
    "pip_importable": importlib.util.find_spec("pip") is not None,
    "setuptools_importable": importlib.util.find_spec("setuptools") is not None,
    "base_pip_importable": base_has("pip"),
    "base_setuptools_importable": base_has("setuptools"),
    "kubernetes_importable": importlib.util.find_spec("kubernetes") is not None,
    "tools": [t for t in ("gcc", "cc", "c++", "make", "ld", "apt-get", "dpkg-buildpackage",
                          "pip", "pip3", "pip3.11", "pip3.12", "pip3.13", "easy_install")
              if shutil.which(t)],
    "left_over": [p for p in ("/src", "/wheels", "/tmp/requirements.txt", "/root/.cache")
                  if os.path.exists(p)],
    "package_files": [os.path.join(d, n) for top in ("/var/lib/apt/lists", "/var/cache")
                      for d, _, names in os.walk(top) for n in names if n != "lock"],
    "pip_caches": [os.path.join(d, n) for d in ("/root/.cache", "/tmp", "/home")
                   if os.path.isdir(d) for n in os.listdir(d) if "pip" in n],
    "app_writable": os.access("/opt/gpushare/lib", os.W_OK),
    "policies": sorted(n for n in os.listdir("/etc/gpushare/policies")
                       if n.endswith((".yaml", ".yml"))),
}))
"""


def inspect_runtime(container: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(run_in(container, "python3", "-c", INSPECT_RUNTIME))
    assert found["python"].startswith("/opt/gpushare/"), found
    assert not found["pip_importable"] and not found["setuptools_importable"], found
    # Nor the base's interpreter (the stock base's pip in /usr/local: GPUSHARE_IMAGE_BASE=stock).
    assert not found["base_pip_importable"], found
    assert not found["base_setuptools_importable"], found
    assert found["tools"] == [], found  # pip on no PATH entry, nor a compiler or apt
    return found


@needs_buildah
def test_the_runtime_has_no_installer_build_tools_or_caches(container: str) -> None:
    found = inspect_runtime(container)
    # The admission image: no Kubernetes client (the cluster image has it).
    assert not found["kubernetes_importable"], found
    assert found["left_over"] == [] and found["pip_caches"] == [], found
    assert found["package_files"] == [], found  # no package lists or downloaded .debs
    # The code belongs to root: the webhook's user cannot change what it runs.
    assert not found["app_writable"]
    assert found["policies"] == sorted(p.name for p in (REPO / "policies").glob("*.yaml"))
    # The offline CLI is on PATH and works without the client; the cluster commands say
    # what to install instead of a traceback.
    assert run_in(container, "gpushare", "--version").strip().endswith("0.1.0")
    refused = subprocess.run(
        ["buildah", "run", "--isolation", "chroot", container, "--",
         "gpushare", "share-capacity", "--once"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused
    assert "pip install 'gpushare[cluster]'" in refused.stderr, refused.stderr


@needs_buildah
def test_the_cluster_image_has_the_client_and_runs_gpushare(
    cluster_image: str, cluster_container: str
) -> None:
    config = json.loads(buildah("inspect", "--type", "image", cluster_image))["OCIv1"]["config"]
    assert config["Entrypoint"] == ["gpushare"] and config["User"] == f"{RUNTIME_UID}:{RUNTIME_UID}"
    found = inspect_runtime(cluster_container)
    assert found["kubernetes_importable"], found
    assert not found["app_writable"] and found["left_over"] == [], found
    # The commands the chart's cluster components run parse here (--help: no cluster).
    for command in ("certs", "dra-templates", "share-capacity", "mps-daemon"):
        assert "usage: gpushare" in run_in(cluster_container, "gpushare", command, "--help")


def pod_mounts(tmp_path: Path) -> tuple[Path, list[str]]:
    """The TLS Secret, the policies ConfigMap and an emptyDir /tmp; the CA file to trust."""
    tls, policies, scratch = (tmp_path / name for name in ("tls", "policies", "tmp"))
    files = write_certificates(
        tls,
        ["gpushare.gpushare-system.svc"],
        parse_ip_addresses(["127.0.0.1"]),
    )
    # As a Secret volume with fsGroup: the key is the runtime user's and no one else's.
    for path in (files.serving_cert, files.serving_key):
        os.chown(path, RUNTIME_UID, RUNTIME_UID)
    files.serving_key.chmod(0o600)
    tls.chmod(0o755)
    shutil.copytree(REPO / "policies", policies)
    scratch.mkdir()
    os.chown(scratch, RUNTIME_UID, RUNTIME_UID)
    scratch.chmod(0o700)
    mounts = [
        f"{tls}:/etc/gpushare/tls:ro",
        f"{policies}:/etc/gpushare/policies:ro",
        f"{scratch}:/tmp",
    ]
    return files.ca_cert, mounts


def descendants(pid: int) -> list[int]:
    """Every process under ``pid``, parents before children."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop(0)
        kids = []
        # Every thread's children: buildah is a Go program, which forks from any thread.
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids.extend(int(child) for child in children.read_text().split())
            except OSError:
                continue
        found.extend(kids)
        queue.extend(kids)
    return found


def gunicorn_arbiter(run_pid: int) -> int | None:
    """The container's first gunicorn process: the arbiter, PID 1 in a real container."""
    for pid in descendants(run_pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"/gunicorn") for part in command[:2]) and b"python" in command[0]:
            return pid
    return None


def https_get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}{path}", context=context, timeout=5
        ) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


@needs_buildah
def test_the_entrypoint_serves_readyz_and_admissions_over_tls(
    config: dict[str, Any], container: str, tmp_path: Path
) -> None:
    command = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    assert command and command[0] == "gunicorn", config
    ca_file, mounts = pod_mounts(tmp_path)
    port = free_port()
    volumes = [arg for mount in mounts for arg in ("--volume", mount)]
    # The image's GPUSHARE_HOST is 0.0.0.0; on the host network the test keeps to loopback
    # and a free port, as a Pod's container port would be its own.
    environment = ["--env", "GPUSHARE_HOST=127.0.0.1", "--env", f"GPUSHARE_PORT={port}"]
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        run = subprocess.Popen(
            ["buildah", "run", "--isolation", "chroot", *environment, *volumes, container, "--",
             *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    context = ssl.create_default_context(cafile=str(ca_file))
    try:

        def ready() -> bool:
            assert run.poll() is None, f"the image's server exited:\n{log_path.read_text()}"
            try:
                return https_get(port, "/readyz", context)[0] == 200
            except OSError:
                return False

        assert wait_until(ready, timeout=60), log_path.read_text()
        status, body = https_get(port, "/readyz", context)
        readiness = json.loads(body)
        assert readiness["ready"] and readiness["certificate"]["valid"], readiness
        assert readiness["policies"]["loaded"], readiness

        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/mutate",
            data=json.dumps(review(annotated_pod("0.5"))).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            answer = json.loads(response.read())["response"]
        assert answer["allowed"] and decoded_patch(answer), answer

        status, metrics = https_get(port, "/metrics", context)
        assert status == 200
        assert b'gpushare_admission_requests_total{endpoint="mutate",outcome="patched"} 1.0' in (
            metrics
        )

        # Every server process runs as the image's user.
        arbiter = gunicorn_arbiter(run.pid)
        assert arbiter is not None, "no gunicorn process under buildah run"
        for pid in [arbiter, *descendants(arbiter)]:
            status_lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            uids = next(line for line in status_lines if line.startswith("Uid:")).split()[1:]
            assert set(uids) == {str(RUNTIME_UID)}, (pid, uids)

        # The kubelet's stop: SIGTERM to the container's first process; gunicorn drains and
        # exits 0, and buildah run passes the exit status on.
        os.kill(arbiter, signal.SIGTERM)
        assert run.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
    log = log_path.read_text()
    assert "Traceback" not in log, log
    assert '"level":"error"' not in log.replace(" ", ""), log
