"""webhook.install.cluster_certs, the pure part: when a Secret is kept, what caBundle is
written and the guarded JSON patch. The API side runs against the real apiserver in
tests/e2e/test_helm_chart.py."""

from __future__ import annotations

import base64
import datetime as dt

from webhook.install.certs import (
    certificate_pem,
    create_ca,
    issue_serving_certificate,
    private_key_pem,
)
from webhook.install.cluster_cert_checks import (
    bundle_after,
    ca_bundle_patch,
    new_certificates,
    secret_verdict,
    trusts,
)

NAMES = ("gpushare", "gpushare.gpushare-system", "gpushare.gpushare-system.svc")
WINDOW = dt.timedelta(days=30)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def secret_data(valid_days: int = 365, names: tuple[str, ...] = NAMES) -> dict[str, bytes]:
    ca, serving = new_certificates(names, valid_days)
    return {
        "ca.crt": certificate_pem(ca.certificate),
        "tls.crt": certificate_pem(serving.certificate),
        "tls.key": private_key_pem(serving.key),
    }


def test_a_fitting_secret_is_kept() -> None:
    verdict = secret_verdict(secret_data(), NAMES, now(), WINDOW)
    assert verdict.keep and verdict.reason.startswith("valid until ")


def test_every_misfit_is_reissued_with_its_reason() -> None:
    data = secret_data()
    other = secret_data()
    cases = {
        "no Secret yet": None,
        "the Secret lacks tls.key": {**data, "tls.key": b""},
        "the Secret holds no usable PEM certificate and key": {**data, "tls.crt": b"junk"},
        "tls.key is not the key of tls.crt": {**data, "tls.key": other["tls.key"]},
        "tls.crt is not signed by ca.crt": {**data, "ca.crt": other["ca.crt"]},
        "tls.crt does not cover gpushare.gpushare-system.svc": secret_data(names=NAMES[:2]),
        "within the renewal window": secret_data(valid_days=10),
        "the Secret holds no usable PEM": {**data, "ca.crt": b"-" * (65 * 1024)},
    }
    for reason, case in cases.items():
        verdict = secret_verdict(case, NAMES, now(), WINDOW)
        assert not verdict.keep, reason
        assert reason in verdict.reason, (reason, verdict.reason)


def test_a_ca_near_its_end_is_renewed_too() -> None:
    ca = create_ca(valid_days=20)
    serving = issue_serving_certificate(ca, NAMES, (), 365)  # capped at the CA's end
    data = {
        "ca.crt": certificate_pem(ca.certificate),
        "tls.crt": certificate_pem(serving.certificate),
        "tls.key": private_key_pem(serving.key),
    }
    verdict = secret_verdict(data, NAMES, now(), dt.timedelta(days=5))
    assert verdict.keep
    verdict = secret_verdict(data, NAMES, now() + dt.timedelta(days=16), dt.timedelta(days=5))
    assert not verdict.keep and "within the renewal window" in verdict.reason


def test_after_a_renewal_the_bundle_carries_the_previous_ca_while_it_is_valid() -> None:
    old, new = create_ca().certificate, create_ca().certificate
    assert bundle_after(new, None, now()) == certificate_pem(new)
    assert bundle_after(new, old, now()) == certificate_pem(new) + certificate_pem(old)
    assert bundle_after(new, new, now()) == certificate_pem(new)
    assert bundle_after(new, old, now() + dt.timedelta(days=4000)) == certificate_pem(new)


def configuration(*bundles: bytes | None) -> dict[str, object]:
    webhooks = []
    for index, bundle in enumerate(bundles):
        client: dict[str, object] = {"service": {"name": "gpushare"}}
        if bundle is not None:
            client["caBundle"] = base64.b64encode(bundle).decode()
        webhooks.append({"name": f"w{index}.gpushare.io", "clientConfig": client})
    return {"metadata": {"name": "gpushare", "resourceVersion": "42"}, "webhooks": webhooks}


def test_the_patch_is_guarded_and_skipped_when_every_webhook_trusts_the_ca() -> None:
    ca = create_ca().certificate
    other = create_ca().certificate
    bundle = certificate_pem(ca)
    trusted = configuration(bundle, certificate_pem(other) + bundle)
    assert ca_bundle_patch(trusted, bundle, ca, force=False) == []
    patch = ca_bundle_patch(configuration(bundle, None), bundle, ca, force=False)
    encoded = base64.b64encode(bundle).decode()
    assert patch == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "test", "path": "/webhooks/0/name", "value": "w0.gpushare.io"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": encoded},
        {"op": "test", "path": "/webhooks/1/name", "value": "w1.gpushare.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": encoded},
    ]
    # After a renewal the previous CA must ride along, even where the new one is in already.
    assert len(ca_bundle_patch(trusted, bundle, ca, force=True)) == 5


def test_trusts_reads_hostile_bundles_as_untrusted() -> None:
    ca = create_ca().certificate
    assert not trusts(None, ca)
    assert not trusts("not base64!", ca)
    assert not trusts(base64.b64encode(b"-----BEGIN CERTIFICATE-----\nxx").decode(), ca)
    assert not trusts(base64.b64encode(b"A" * (70 * 1024)).decode(), ca)
    assert trusts(base64.b64encode(certificate_pem(ca)).decode(), ca)


def test_the_command_line_refuses_what_cannot_work() -> None:
    from harness.cli import gpushare

    base = ("certs", "--service", "gpushare", "--namespace", "gpushare-system")
    neither = gpushare(*base, check=False)
    assert neither.returncode == 2
    assert "pass --out DIR to write files, or --in-cluster --secret NAME." in neither.stderr
    no_secret = gpushare(*base, "--in-cluster", check=False)
    assert no_secret.returncode == 2
    assert "--in-cluster needs --secret NAME and takes neither --out nor --ip" in no_secret.stderr
    window = gpushare(
        *base, "--in-cluster", "--secret", "s", "--days", "30", "--renew-before-days", "30",
        check=False,
    )  # fmt: skip
    assert window.returncode == 2
    assert "--renew-before-days 30 must be below --days 30, or every run would renew" in (
        window.stderr
    )
    unreachable = gpushare(
        *base, "--in-cluster", "--secret", "s", "--kubeconfig", "/nonexistent/kubeconfig",
        check=False,
    )  # fmt: skip
    assert unreachable.returncode == 1
    assert "Cannot reach the Kubernetes API" in unreachable.stderr
