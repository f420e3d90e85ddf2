"""ServingCertificate: the SSLContext follows certificate files replaced on disk."""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

from webhook.install.certs import (
    CertificateFiles,
    create_ca,
    issue_serving_certificate,
    load_certificate,
    write_certificates,
    write_serving,
)
from webhook.server.tls import MINIMUM_TLS_VERSION, ServingCertificate, serving_certificate


def fresh_pair(directory: Path, name: str) -> CertificateFiles:
    files = CertificateFiles(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_serving(files, issue_serving_certificate(create_ca(), [name]))
    return files


def subject_of(serving: ServingCertificate) -> str | None:
    return serving.status().subject


def test_context_requires_tls_1_2(tmp_path: Path) -> None:
    files = write_certificates(tmp_path, ["localhost"])
    context = ServingCertificate(files.serving_cert, files.serving_key).context()
    assert context.minimum_version == MINIMUM_TLS_VERSION == ssl.TLSVersion.TLSv1_2


def test_context_is_reused_while_files_are_unchanged(tmp_path: Path) -> None:
    files = write_certificates(tmp_path, ["localhost"])
    serving = ServingCertificate(files.serving_cert, files.serving_key)
    assert serving.context() is serving.context()


def test_plain_rewrite_is_picked_up(tmp_path: Path) -> None:
    files = fresh_pair(tmp_path, "one.test")
    serving = ServingCertificate(files.serving_cert, files.serving_key)
    first = serving.context()
    replacement = fresh_pair(tmp_path / "next", "two.test")
    # In place, as `cp` or an editor would: same inode, new content.
    files.serving_key.write_bytes(replacement.serving_key.read_bytes())
    files.serving_cert.write_bytes(replacement.serving_cert.read_bytes())
    assert serving.context() is not first
    assert subject_of(serving) == "CN=two.test"
    assert serving.reloads == 1


def test_atomic_rename_is_picked_up(tmp_path: Path) -> None:
    files = fresh_pair(tmp_path, "one.test")
    serving = ServingCertificate(files.serving_cert, files.serving_key)
    serving.context()
    fresh_pair(tmp_path, "two.test")  # write_serving renames temporary files into place
    serving.context()
    assert subject_of(serving) == "CN=two.test"


def test_secret_mount_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    mount = tmp_path / "mount"
    first = fresh_pair(mount / "..2026_01_01_00_00_00.1", "one.test")
    (mount / "..data").symlink_to(first.directory.name)
    for name in ("tls.crt", "tls.key"):
        (mount / name).symlink_to(f"..data/{name}")
    serving = ServingCertificate(mount / "tls.crt", mount / "tls.key")
    serving.context()
    second = fresh_pair(mount / "..2026_01_01_00_01_00.2", "two.test")
    staging = mount / "..data_tmp"
    staging.symlink_to(second.directory.name)
    os.replace(staging, mount / "..data")
    shutil.rmtree(first.directory)
    serving.context()
    assert subject_of(serving) == "CN=two.test"


def test_mismatched_pair_keeps_the_old_context(tmp_path: Path) -> None:
    files = fresh_pair(tmp_path, "one.test")
    serving = ServingCertificate(files.serving_cert, files.serving_key)
    old = serving.context()
    other = fresh_pair(tmp_path / "other", "two.test")
    files.serving_key.write_bytes(other.serving_key.read_bytes())  # new key, old certificate
    assert serving.context() is old
    status = serving.status()
    assert status.loaded and status.subject == "CN=one.test" and status.error
    files.serving_cert.write_bytes(other.serving_cert.read_bytes())  # the pair is complete
    assert serving.context() is not old
    assert serving.status().error is None


def test_status_reports_validity(tmp_path: Path) -> None:
    files = write_certificates(tmp_path, ["localhost"])
    status = ServingCertificate(files.serving_cert, files.serving_key).status()
    certificate = load_certificate(files.serving_cert)
    assert status.not_after == certificate.not_valid_after_utc
    assert status.valid_at(certificate.not_valid_before_utc)
    assert not status.valid_at(certificate.not_valid_after_utc)


def test_missing_files_report_not_loaded(tmp_path: Path) -> None:
    status = ServingCertificate(tmp_path / "tls.crt", tmp_path / "tls.key").status()
    assert not status.loaded and status.error


def test_one_instance_per_pair_per_process(tmp_path: Path) -> None:
    files = write_certificates(tmp_path, ["localhost"])
    first = serving_certificate(files.serving_cert, files.serving_key)
    assert serving_certificate(files.serving_cert, files.serving_key) is first
