"""``gpushare certs`` and the checks ``gpushare serve`` makes before it execs gunicorn."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.server.serve import ServeError, ServeRequest, prepare, startup_message
from webhook.server.settings import ServeSettings, SettingsError

from .support import BUNDLED_POLICIES


def serve_request(tmp_path: Path, **overrides: object) -> ServeRequest:
    values: dict[str, object] = {
        "host": "127.0.0.1",
        "port": 8443,
        "policies": BUNDLED_POLICIES,
        "tls_cert": None,
        "tls_key": None,
        "cert_dir": None,
        "state_dir": tmp_path / "state",
        "workers": None,
        "threads": 4,
        "exclude_namespaces": ("gpushare-system",),
        "policy_poll_seconds": 2.0,
        "max_body_bytes": 7 * 1024 * 1024,
        "keepalive_seconds": 75,
        "graceful_timeout_seconds": 25,
        "log_level": "info",
    }
    values.update(overrides)
    return ServeRequest(**values)  # type: ignore[arg-type]


def test_certs_command_writes_secret_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    args = ["certs", "--service", "gpushare", "--namespace", "gpushare-system", "--out", str(out)]
    assert main([*args, "--ip", "10.0.0.1"]) == 0
    assert {p.name for p in out.iterdir()} == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    assert "create secret" in capsys.readouterr().out
    assert main(args) == 2  # the CA exists: refuses without --renew
    assert "--renew" in capsys.readouterr().err
    ca = (out / "ca.crt").read_bytes()
    assert main([*args, "--renew"]) == 0
    assert (out / "ca.crt").read_bytes() == ca


def test_certs_command_rejects_a_bad_ip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["certs", "--service", "s", "--namespace", "n", "--out", str(tmp_path), "--ip", "x"]
    assert main(args) == 2
    assert "not an IP address" in capsys.readouterr().err


def test_serve_defaults_create_local_certificates(tmp_path: Path) -> None:
    prepared = prepare(serve_request(tmp_path))
    settings = prepared.settings
    assert settings.tls_cert == (tmp_path / "state" / "certs" / "tls.crt").absolute()
    assert prepared.ca_cert == (tmp_path / "state" / "certs" / "ca.crt").absolute()
    assert settings.exclude_namespaces == ("kube-system", "gpushare-system")
    message = startup_message(prepared)
    assert "gpushare webhook-config --ca" in message
    assert "--url https://127.0.0.1:8443" in message


def test_serve_refuses_invalid_policies(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: GpuSharingPolicy\n")
    with pytest.raises(ServeError, match=r"bad\.yaml"):
        prepare(serve_request(tmp_path, policies=bad))


def test_serve_command_exits_2_with_the_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--policies", str(tmp_path / "missing"), "--state-dir", str(tmp_path)])
    assert code == 2
    assert "missing" in capsys.readouterr().err


def test_serve_refuses_half_a_certificate_pair(tmp_path: Path) -> None:
    with pytest.raises(ServeError, match="both"):
        prepare(serve_request(tmp_path, tls_cert=tmp_path / "tls.crt"))


def test_serve_refuses_an_unloadable_certificate(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("nope")
    (tmp_path / "tls.key").write_text("nope")
    with pytest.raises(ServeError, match="do not load"):
        prepare(serve_request(tmp_path, cert_dir=tmp_path))


def test_settings_travel_through_the_environment(tmp_path: Path) -> None:
    settings = prepare(serve_request(tmp_path, workers=3)).settings
    assert ServeSettings.from_environ(settings.to_environ()) == settings


def test_settings_errors_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="GPUSHARE_TLS_CERT"):
        ServeSettings.from_environ({})
    base = {"GPUSHARE_TLS_CERT": "c", "GPUSHARE_TLS_KEY": "k", "GPUSHARE_POLICIES": "p"}
    with pytest.raises(SettingsError, match="GPUSHARE_PORT"):
        ServeSettings.from_environ({**base, "GPUSHARE_PORT": "zero"})
