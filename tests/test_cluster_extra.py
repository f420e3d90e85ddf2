"""The Kubernetes client is an optional extra (``gpushare[cluster]``): the admission service
never imports it, the offline commands work without it, and the commands that talk to the
API say what to install instead of failing on an import.

Each check runs in a fresh interpreter, as the admission image's gunicorn would: once as
installed here (the dev extra includes the client), to see that the client is never
imported, and once with the client and its own dependencies made unimportable, as in the
admission image, to see that everything still works. tests/test_packaging.py holds the
package metadata to the same split; tests/test_image.py the images.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.server.support import annotated_pod, review
from webhook.cli.cluster_client import CLUSTER_EXTRA
from webhook.install.certs import write_certificates

REPO = Path(__file__).resolve().parents[1]
# The client and what it alone brings (kubernetes' own requirements that no base dependency
# has): absent from the admission image.
CLIENT_MODULES = (
    "kubernetes",
    "urllib3",
    "requests",
    "requests_oauthlib",
    "oauthlib",
    "google.auth",
    "websocket",
    "durationpy",
)
# Run first in every child: make the client unimportable (argv[1] == "absent").
BLOCK = f"""
import sys
if sys.argv.pop(1) == "absent":
    for name in {CLIENT_MODULES!r}:
        sys.modules[name] = None
"""
LOADED = f"""
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {{
    n.split(".")[0] for n in {CLIENT_MODULES!r}}} and sys.modules[m] is not None)
"""

SERVE_ONE_REVIEW = (
    BLOCK
    + """
import io, json, os
from wsgiref.util import setup_testing_defaults
import webhook.server.gunicorn_conf  # what gunicorn loads first (-c python:...)
from webhook.server.wsgi import app   # then, in each worker, the app

body = sys.stdin.buffer.read()
environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/mutate", "CONTENT_TYPE": "application/json",
           "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
setup_testing_defaults(environ)
started = []
answer = b"".join(app(environ, lambda status, headers, *_: started.append(status)))
"""
    + LOADED
    + """
print(json.dumps({"status": started[0], "answer": json.loads(answer), "loaded": loaded}))
"""
)

CLI = (
    BLOCK
    + """
from webhook.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:  # --help, --version and usage errors end in argparse
    code = stop.code if isinstance(stop.code, int) else 0
"""
    + LOADED
    + """
print(json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
sys.exit(code)
"""
).replace("import sys\n", "import json, sys\n", 1)


def child(
    script: str, client: str, *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, client, *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
        env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def serving_environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The GPUSHARE_* variables of the admission image, with a certificate of its own."""
    tmp = tmp_path_factory.mktemp("serve")
    files = write_certificates(tmp / "tls", ["gpushare.gpushare-system.svc"], [])
    return {
        **os.environ,
        "GPUSHARE_TLS_CERT": str(files.serving_cert),
        "GPUSHARE_TLS_KEY": str(files.serving_key),
        "GPUSHARE_POLICIES": str(REPO / "policies"),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics"),
    }


@pytest.mark.parametrize("client", ["installed", "absent"])
def test_the_admission_path_never_imports_the_kubernetes_client(
    client: str, serving_environment: dict[str, str]
) -> None:
    """gunicorn's config, the WSGI app and one admission through it: with the client
    installed it is never imported, and without it the pod is mutated all the same."""
    stdin = json.dumps(review(annotated_pod("0.5")))
    result = child(SERVE_ONE_REVIEW, client, stdin=stdin, env=serving_environment)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["status"].startswith("200"), found
    answer = found["answer"]["response"]
    assert answer["allowed"] and answer["patch"], answer
    assert found["loaded"] == [], f"the admission path imported {found['loaded']}"


def write_ca(tmp_path: Path) -> Path:
    return write_certificates(tmp_path / "ca", ["x"], []).ca_cert


OFFLINE_COMMANDS = {
    "version": ["--version"],
    "help": ["--help"],
    "serve help": ["serve", "--help"],
    "certs to files": ["certs", "--service", "gpushare", "--namespace", "ns", "--out", "{out}"],
    "webhook-config": [
        "webhook-config", "--ca", "{ca}", "--service", "gpushare", "--namespace", "ns",
    ],
    "dra-templates printed": [
        "dra-templates", "--policies", "policies/examples/dra.yaml", "-n", "gpu-dra-a",
    ],
    "device-plugin-config": [
        "device-plugin-config", "--policies", "policies/examples/mps-daemon.yaml",
    ],
    "dra-templates help": ["dra-templates", "--help"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(OFFLINE_COMMANDS))
def test_offline_commands_work_without_the_client(name: str, tmp_path: Path) -> None:
    ca = write_ca(tmp_path)
    for client in ("installed", "absent"):
        args = [a.format(out=tmp_path / client, ca=ca) for a in OFFLINE_COMMANDS[name]]
        result = child(CLI, client, *args)
        assert result.returncode == 0, (client, result.stderr)
        report = json.loads(result.stderr.strip().splitlines()[-1])
        assert report["loaded"] == [], f"{name} imported {report['loaded']}"


CLUSTER_COMMANDS = {
    "gpushare certs --in-cluster": [
        "certs", "--in-cluster", "--secret", "s", "--service", "gpushare", "--namespace", "ns",
    ],
    "gpushare dra-templates --apply": ["dra-templates", "--apply"],
    "gpushare share-capacity": ["share-capacity", "--once"],
    "gpushare mps-daemon": [
        "mps-daemon", "--policies", "policies/examples/mps-daemon.yaml", "--node-name", "n",
    ],
    "gpushare plan --cluster": ["plan", "--cluster"],
}  # fmt: skip


@pytest.mark.parametrize("command", list(CLUSTER_COMMANDS))
def test_cluster_commands_without_the_client_say_what_to_install(command: str) -> None:
    result = child(CLI, "absent", *CLUSTER_COMMANDS[command])
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first == (
        f"error: {command} talks to the Kubernetes API and needs its Python client, which "
        "this installation lacks: pip install 'gpushare[cluster]', or run it from the "
        "gpushare-cluster image (the admission image ships without the client)."
    ), result.stderr
    assert "Traceback" not in result.stderr


def test_the_extra_the_message_names_is_the_one_that_brings_the_client() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"{project['name']}[cluster]" == CLUSTER_EXTRA
    assert project["optional-dependencies"]["cluster"] == ["kubernetes>=30"]
    assert not [d for d in project["dependencies"] if d.startswith("kubernetes")]
