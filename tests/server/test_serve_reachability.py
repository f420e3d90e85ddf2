"""``gpushare serve`` for a local cluster: the certificate names where kind and minikube reach
this machine, --ip and --dns add names, the start-up lines give a URL per cluster, the
GPUSHARE_* variables are the flags' defaults, and the README's curl call and Ctrl-C work
against the real server."""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from webhook.cli import main, serve, serve_command
from webhook.cli.host_addresses import HostAddress, host_addresses
from webhook.cli.serve import CertificateSource, ServeError, prepare, startup_message
from webhook.install.certs import certificate_names, load_certificate
from webhook.server.settings import ServeSettings

from .support import BUNDLED_POLICIES, REPO, running_server, wait_until

BRIDGE = HostAddress(ipaddress.ip_address("172.18.0.1"), "br-5e1f0c2a9d3b")
LAN = HostAddress(ipaddress.ip_address("192.0.2.7"), "eth0")


@pytest.fixture
def this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with a kind bridge and a LAN address, named devbox."""
    monkeypatch.setattr(serve, "host_addresses", lambda: [BRIDGE, LAN])
    monkeypatch.setattr(serve, "host_name", lambda: "devbox")


def names_of(certificate: Path) -> set[str]:
    dns, ips = certificate_names(load_certificate(certificate))
    return dns | {str(ip) for ip in ips}


def test_a_wildcard_host_gets_a_certificate_for_every_way_in(
    tmp_path: Path, this_machine: None
) -> None:
    source = CertificateSource(state_dir=tmp_path)
    prepared = prepare(BUNDLED_POLICIES, source, {"host": "0.0.0.0"})
    assert names_of(prepared.settings.tls_cert) == {
        "localhost", "host.docker.internal", "host.minikube.internal", "devbox",
        "127.0.0.1", "::1", "172.18.0.1", "192.0.2.7",
    }  # fmt: skip
    # A loopback host keeps its small certificate.
    prepared = prepare(BUNDLED_POLICIES, CertificateSource(state_dir=tmp_path / "l"), {})
    assert names_of(prepared.settings.tls_cert) == {"localhost", "127.0.0.1", "::1"}


def test_ip_and_dns_flags_reach_the_local_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[ServeSettings] = []
    monkeypatch.setattr(serve_command, "exec_gunicorn", started.append)
    flags = ["--state-dir", str(tmp_path), "--ip", "10.1.2.3", "--dns", "webhook.lab"]
    assert main(["serve", "--policies", str(BUNDLED_POLICIES), *flags]) == 1
    (settings,) = started
    assert {"10.1.2.3", "webhook.lab"} <= names_of(settings.tls_cert)
    assert "for localhost, webhook.lab, 10.1.2.3, 127.0.0.1, ::1" in capsys.readouterr().out


def test_ip_and_dns_do_not_apply_to_a_certificate_of_your_own(tmp_path: Path) -> None:
    source = CertificateSource(cert_dir=tmp_path, dns_names=("x.lab",))
    with pytest.raises(ServeError, match=r"gpushare certs --ip \.\.\. --dns"):
        prepare(BUNDLED_POLICIES, source, {})


def test_a_bad_ip_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--state-dir", str(tmp_path), "--ip", "not-an-ip"]) == 2
    assert "not an IP address" in capsys.readouterr().err


def test_startup_lines_give_a_url_for_kind_and_minikube(tmp_path: Path, this_machine: None) -> None:
    prepared = prepare(BUNDLED_POLICIES, CertificateSource(state_dir=tmp_path), {"host": "0.0.0.0"})
    text = startup_message(prepared, [BRIDGE, LAN])
    ca = tmp_path.absolute() / "certs" / "ca.crt"
    line = f"gpushare webhook-config --ca {ca} --url https://{{}}:8443 | kubectl apply -f -"
    assert text.splitlines()[0] == (
        "gpushare: serving https://0.0.0.0:8443 (every address of this machine): /mutate, "
        "/validate, /healthz, /readyz, /metrics"
    )
    for host in ("127.0.0.1", "host.minikube.internal", "172.18.0.1", "host.docker.internal"):
        assert f"    {line.format(host)}\n" in text + "\n", host
    assert "docker bridge (br-5e1f0c2a9d3b)" in text
    assert "this machine's other addresses: 192.0.2.7" in text
    assert "reachable from this machine only" not in text
    # No docker bridge here: the gateway is to be looked up.
    text = startup_message(prepared, [LAN])
    assert f"    {line.format('GATEWAY')}" in text
    assert "`docker network inspect kind`" in text


def test_startup_lines_of_a_loopback_host_say_how_to_reach_it_from_a_cluster(
    tmp_path: Path,
) -> None:
    prepared = prepare(BUNDLED_POLICIES, CertificateSource(state_dir=tmp_path), {})
    text = startup_message(prepared)
    assert "host.minikube.internal" not in text
    assert text.splitlines()[-1] == (
        "gpushare: 127.0.0.1 is reachable from this machine only; for kind or minikube, "
        "serve with --host 0.0.0.0"
    )
    assert re.search(r"pid \d+; stop it with Ctrl-C, or kill -TERM \d+", text)


def test_gpushare_variables_are_the_flags_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[ServeSettings] = []
    monkeypatch.setattr(serve_command, "exec_gunicorn", started.append)
    monkeypatch.setenv("GPUSHARE_PORT", "9555")
    monkeypatch.setenv("GPUSHARE_THREADS", "3")
    monkeypatch.setenv("GPUSHARE_POLICIES", str(BUNDLED_POLICIES))
    assert main(["serve", "--state-dir", str(tmp_path), "--threads", "2"]) == 1
    (settings,) = started
    assert (settings.port, settings.threads) == (9555, 2)  # the flag wins over its variable
    assert settings.policies == BUNDLED_POLICIES
    monkeypatch.setenv("GPUSHARE_PORT", "zero")
    assert main(["serve", "--state-dir", str(tmp_path)]) == 2
    assert "GPUSHARE_PORT='zero' must be a positive number" in capsys.readouterr().err


# -- against the real server ----------------------------------------------------------------


@pytest.mark.server
def test_a_cluster_verifies_the_certificate_at_each_way_in(tmp_path: Path) -> None:
    with running_server(tmp_path, "--host", "0.0.0.0") as server:
        context = server.context()
        routes = [("127.0.0.1", "host.minikube.internal"), ("127.0.0.1", "host.docker.internal")]
        # 0.0.0.0 is IPv4 only: this machine's IPv4 addresses, by address.
        ipv4 = [str(a.address) for a in host_addresses() if a.address.version == 4]
        routes += [(address, address) for address in ipv4]
        for address, name in routes:
            with (
                socket.create_connection((address, server.port), timeout=10) as raw,
                context.wrap_socket(raw, server_hostname=name) as tls,
            ):
                assert tls.version() in ("TLSv1.2", "TLSv1.3"), (address, name)
        assert "--url https://host.minikube.internal:" in server.log()


def readme_curl() -> str:
    """The README's curl call to /mutate, one command line."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```sh\n(curl --cacert \.state/certs/ca\.crt .*?)```", text, re.DOTALL)
    assert block, "README.md shows no `curl --cacert .state/certs/ca.crt ...` block"
    return block.group(1)


@pytest.mark.server
def test_the_readme_curl_call_and_ctrl_c_work(tmp_path: Path) -> None:
    with running_server(tmp_path) as server:
        state = server.state_dir.relative_to(tmp_path)
        command = readme_curl().replace(".state/", f"{state}/").replace(":8443", f":{server.port}")
        run = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        response = json.loads(run.stdout)["response"]
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"
        assert shlex.split(command)[2] == f"{state}/certs/ca.crt"
        server.process.send_signal(signal.SIGINT)  # Ctrl-C
        assert wait_until(lambda: server.process.poll() is not None, timeout=20)
        assert "Shutting down: Master" in server.log()
