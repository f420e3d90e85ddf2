"""``gpushare certs`` and the checks ``gpushare serve`` makes before it execs gunicorn."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.cli.serve import (
    CertificateSource,
    Prepared,
    ServeError,
    prepare,
    startup_message,
)
from webhook.server.settings import ServeSettings, SettingsError

from .support import BUNDLED_POLICIES


def prepare_local(
    tmp_path: Path, policies: Path = BUNDLED_POLICIES, **certificates: Path
) -> Prepared:
    """``prepare`` as ``gpushare serve`` calls it, with the state dir under ``tmp_path``."""
    certificates.setdefault("state_dir", tmp_path / "state")
    return prepare(policies, CertificateSource(**certificates), {"host": "127.0.0.1"})


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
    prepared = prepare_local(tmp_path)
    settings = prepared.settings
    assert settings.tls_cert == (tmp_path / "state" / "certs" / "tls.crt").absolute()
    assert prepared.ca_cert == (tmp_path / "state" / "certs" / "ca.crt").absolute()
    assert settings.port == ServeSettings.__dataclass_fields__["port"].default
    message = startup_message(prepared)
    assert "gpushare webhook-config --ca" in message
    assert "--url https://127.0.0.1:8443" in message


def test_serve_refuses_invalid_policies(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: GpuSharingPolicy\n")
    with pytest.raises(ServeError, match=r"bad\.yaml"):
        prepare_local(tmp_path, policies=bad)


def test_serve_command_exits_2_with_the_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--policies", str(tmp_path / "missing"), "--state-dir", str(tmp_path)])
    assert code == 2
    assert "missing" in capsys.readouterr().err


def test_serve_refuses_half_a_certificate_pair(tmp_path: Path) -> None:
    with pytest.raises(ServeError, match="both"):
        prepare_local(tmp_path, tls_cert=tmp_path / "tls.crt")


def test_serve_refuses_an_unloadable_certificate(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("nope")
    (tmp_path / "tls.key").write_text("nope")
    with pytest.raises(ServeError, match="do not load"):
        prepare_local(tmp_path, cert_dir=tmp_path)


def test_settings_travel_through_the_environment(tmp_path: Path) -> None:
    prepared = prepare(
        BUNDLED_POLICIES,
        CertificateSource(state_dir=tmp_path / "state"),
        {"workers": 3, "keepalive_seconds": 9, "log_level": "debug"},
    )
    settings = prepared.settings
    assert (settings.workers, settings.keepalive_seconds, settings.log_level) == (3, 9, "debug")
    assert ServeSettings.from_environ(settings.to_environ()) == settings


def test_settings_errors_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="GPUSHARE_TLS_CERT"):
        ServeSettings.from_environ({})
    base = {"GPUSHARE_TLS_CERT": "c", "GPUSHARE_TLS_KEY": "k", "GPUSHARE_POLICIES": "p"}
    with pytest.raises(SettingsError, match="GPUSHARE_PORT"):
        ServeSettings.from_environ({**base, "GPUSHARE_PORT": "zero"})
    with pytest.raises(SettingsError, match="GPUSHARE_LOOP_ANSWER_MAX_BYTES='-1' must be 0 or"):
        ServeSettings.from_environ({**base, "GPUSHARE_LOOP_ANSWER_MAX_BYTES": "-1"})
    every_request_to_a_thread = {**base, "GPUSHARE_LOOP_ANSWER_MAX_BYTES": "0"}
    assert ServeSettings.from_environ(every_request_to_a_thread).loop_answer_max_bytes == 0
    # The metrics port: 0 (the default) is none; never the admission port.
    metrics = ServeSettings.from_environ({**base, "GPUSHARE_METRICS_PORT": "9090"})
    assert (metrics.metrics_port, metrics.metrics_bind) == (9090, "127.0.0.1:9090")
    assert ServeSettings.from_environ(base).metrics_bind is None
    with pytest.raises(SettingsError, match="GPUSHARE_METRICS_PORT=8443 is the admission port"):
        ServeSettings.from_environ({**base, "GPUSHARE_METRICS_PORT": "8443"})
    with pytest.raises(SettingsError, match="GPUSHARE_METRICS_PORT='-1' must be 0 or"):
        ServeSettings.from_environ({**base, "GPUSHARE_METRICS_PORT": "-1"})


def test_serve_flags_reach_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from webhook.cli import serve_command

    started: list[ServeSettings] = []
    monkeypatch.setattr(serve_command, "exec_gunicorn", started.append)
    flags = ["--state-dir", str(tmp_path), "--port", "9443", "--threads", "2"]
    flags += ["--keepalive", "9", "--graceful-timeout", "7", "--max-body-bytes", "4096"]
    assert main(["serve", "--policies", str(BUNDLED_POLICIES), *flags]) == 1
    (settings,) = started
    assert (settings.port, settings.threads, settings.max_body_bytes) == (9443, 2, 4096)
    assert (settings.keepalive_seconds, settings.graceful_timeout_seconds) == (9, 7)
    assert (
        settings.policy_poll_seconds
        == ServeSettings.__dataclass_fields__["policy_poll_seconds"].default
    )
