"""Faults under load: each fault while pods keep being created through the real apiserver.

A `load.PodStream` keeps three threads creating pods (every other one annotated with
gpu-fraction 0.5) through the harness's kube-apiserver while a fault is injected; afterwards
every outcome and every stored pod is counted: sent, succeeded, failed, and wrong allows (an
annotated pod stored without gpushare's mutation while the failurePolicy is Fail). Each test
prints one line of figures (`pytest -s` shows it) and asserts what the design promises:

a. the serving certificate replaced on disk (plain rewrite, atomic rename, a Secret's
   `..data` symlink swap; a new key pair from the same CA): no failed create;
b. a CA rotation as the README describes it (caBundle with both CAs, then the server on a
   certificate of the new CA, then the old CA dropped): no failed create;
c. a policy reload storm (valid and invalid versions alternating, rewritten in place):
   the last good version keeps serving, every stored pod is mutated per a valid version;
   no failed create (a pod records its policy's version, so validation under another
   version is told from tampering);
d. two replicas behind one registration: one call's connection reset (the apiserver does
   not retry it: one failed create), one replica restarted gracefully (SIGTERM: no failed
   create), then killed (SIGKILL: a bounded count of failed creates);
e. the webhook down entirely: ordinary pods unaffected; annotated pods rejected under
   Fail, admitted unmutated under Ignore.

The webhook is registered with what `gpushare webhook-config` prints, pointed at a
`load.Relay` in front of the server(s): it stands where a Service would, and counts the
connections (so the TLS handshakes) the apiserver opens. The apiserver keeps its webhook
connections alive, so a rotated certificate is only ever shown to a new connection: where
a test needs new ones it re-applies the registration with a changed caBundle (the same CA
written differently where the trust must not change), which gives the apiserver a new
client, and the relay's count shows the connections it opened.

Each stream is bounded (STREAM_LIMIT creates, STREAM_BOUND_S seconds); the file takes about
2.5 to 4 minutes on two shared cores. GPUSHARE_LONG_TESTS=1 runs every scenario longer
(more rounds, longer phases).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from load import (
    SECRET_FILES,
    Create,
    Figures,
    PodStream,
    Relay,
    SecretMount,
    annotated,
    between,
    kill,
    mutated,
    new_serving_pair,
    rename_into_place,
    rewrite_in_place,
    start_server,
    stored_pods,
    tally,
    wait_ready,
    wait_served,
    with_bundle,
)
from pods import annotated_pod
from prediction import as_admitted, predict, webhook_input

from harness.cli import REPO, webhook_configuration, write_certificates
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import MUTATING_WEBHOOK, SHARED_RESOURCE, GpushareWebhook
from harness.webhookserver import WebhookServer
from tests.long_runs import scaled

pytestmark = pytest.mark.timeout(scaled(300, 1800), func_only=True)

# The bound of every stream of creates, whatever a test does.
STREAM_LIMIT = scaled(20_000, 100_000)
STREAM_BOUND_S = float(scaled(150, 1500))
# Phases of steady load, in seconds, and rounds of each fault.
WARM_S = 2.0
STEADY_S = float(scaled(1, 20))
ROTATIONS = scaled(1, 10)
CA_ROTATIONS = scaled(1, 5)
STORM_REWRITES = scaled(24, 400)
STORM_INTERVAL_S = 0.25
RESTARTS = scaled(1, 5)
DOWN_S = float(scaled(3, 30))
# What validate.gpushare.io says about a pod mutated under another policy version.
# Concurrent creates that make the apiserver open connections beyond the steady stream's.
BURST = 12
# Creates a killed replica may fail: per load thread (three), the call it had in flight and
# one on a dead kept-alive connection taken before the apiserver noticed it died.
KILL_FAILURE_BOUND = 2 * 3


@contextlib.contextmanager
def registered(
    server: WebhookServer,
    url: str,
    control_plane: ControlPlane,
    probe_namespace: str,
    *extra_args: str,
) -> Iterator[GpushareWebhook]:
    """`gpushare webhook-config --url <url>` for `server`, in force until the block ends."""
    documents = webhook_configuration(
        server.ca_file, url, "--policies", str(server.policies), *extra_args
    )
    webhook = GpushareWebhook(server, control_plane.api, probe_namespace, documents)
    webhook.register()
    try:
        yield webhook
    finally:
        webhook.unregister()


@contextlib.contextmanager
def serving(*args: Any, **kwargs: Any) -> Iterator[WebhookServer]:
    server = start_server(*args, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def pod_stream(control_plane: ControlPlane, namespace: str) -> PodStream:
    return PodStream(control_plane, namespace, limit=STREAM_LIMIT, seconds=STREAM_BOUND_S)


def new_connections(relay: Relay, action: Callable[[], object]) -> int:
    """How many connections the apiserver opened while `action()` ran."""
    before = relay.accepted
    action()
    return relay.accepted - before


def apply_in_force(webhook: GpushareWebhook, relay: Relay, documents: list[dict[str, Any]]) -> int:
    """Apply changed configurations, wait until the apiserver calls with them; the count of
    connections it opened meanwhile.

    A changed caBundle gives the apiserver a new webhook client (its client cache is keyed
    by the whole client config), so the first call under it opens a new connection.
    """
    before = relay.accepted
    webhook.registration.apply(documents)
    wait_for(
        "the changed registration to open a new connection",
        lambda: True if (webhook.probe() and relay.accepted > before) else None,
        timeout=30,
    )
    time.sleep(0.5)  # the other webhook's client, a moment later at most
    return relay.accepted - before


def assert_no_failure(figures: Figures) -> None:
    assert figures.failed == 0, figures.failure_summary()
    assert figures.wrong_allows == 0, figures.unmutated_names[:10]


# -- a. the serving certificate replaced on disk ----------------------------------------------


@pytest.mark.parametrize("way", ["rewrite", "rename", "symlink-swap"])
def test_serving_certificate_replaced_under_load_fails_no_create(
    way: str,
    control_plane: ControlPlane,
    probe_namespace: str,
    namespace: str,
    webhook_policies: Path,
    tmp_path: Path,
) -> None:
    """A new key pair from the same CA, by each way a file gets replaced: no create fails.

    The server reloads the pair on the next connection (a pair that does not load, such as
    the new key beside the old certificate halfway through a rewrite, keeps the old one
    serving); the apiserver, trusting the same CA, accepts the new certificate. Its kept-alive
    connections would carry on with the old one for minutes, so after each replacement the
    registration is re-applied with the same CA written differently (a trailing newline more):
    a new client config, so a new client and new connections, whose count the relay gives.
    """
    ca_dir = write_certificates(tmp_path / "ca")
    files = {name: (ca_dir / name).read_bytes() for name in SECRET_FILES}
    mount = tmp_path / "tls"
    secret: SecretMount | None = None
    if way == "symlink-swap":
        secret = SecretMount(mount, files)
    else:
        mount.mkdir()
        for name, content in files.items():
            (mount / name).write_bytes(content)
    handshakes: list[int] = []

    with (
        serving(tmp_path / "server", webhook_policies, mount) as server,
        Relay([server.port]) as relay,
        registered(server, relay.url, control_plane, probe_namespace) as webhook,
        pod_stream(control_plane, namespace) as stream,
    ):
        stream.run_for(WARM_S)
        for round_ in range(1, ROTATIONS + 1):
            pair = new_serving_pair(ca_dir)
            if secret is not None:
                secret.update(
                    {"ca.crt": files["ca.crt"], "tls.crt": pair.cert, "tls.key": pair.key}
                )
            elif way == "rewrite":
                rewrite_in_place(mount, pair)
            else:
                rename_into_place(mount, pair)
            # Connections the apiserver opens beyond the steady stream's meet the reload ...
            stream.burst(BURST)
            # ... and then a new client's: every call after this is on a new connection.
            documents = with_bundle(webhook.documents, files["ca.crt"] + b"\n" * round_)
            handshakes.append(apply_in_force(webhook, relay, documents))
            wait_served(server.port, pair.serial, "the new serving certificate")
            stream.run_for(STEADY_S)
        stream.stop()
        figures = tally(f"a. certificate {way}", stream, control_plane.api)

    print(
        figures.line(f"{ROTATIONS} rotations, new apiserver connections after each: {handshakes}")
    )
    assert_no_failure(figures)
    assert all(handshakes), f"the apiserver never met the new certificate: {handshakes}"


# -- b. a new CA -------------------------------------------------------------------------------


def test_ca_rotation_under_load_fails_no_create(
    control_plane: ControlPlane,
    probe_namespace: str,
    namespace: str,
    webhook_policies: Path,
    tmp_path: Path,
) -> None:
    """caBundle old+new, then the server on a certificate of the new CA, then new only.

    Each caBundle change is waited for until the apiserver calls with it (a new client, so
    new connections: those after the switch to the new CA's certificate shake hands with
    it); each certificate change until every worker serves it, then a burst of creates.
    No create fails.
    """
    old_ca = write_certificates(tmp_path / "ca-0")
    mount = tmp_path / "tls"
    mount.mkdir()
    for name in SECRET_FILES:
        shutil.copy(old_ca / name, mount / name)
    handshakes: list[str] = []

    with (
        serving(tmp_path / "server", webhook_policies, mount) as server,
        Relay([server.port]) as relay,
        registered(server, relay.url, control_plane, probe_namespace) as webhook,
        pod_stream(control_plane, namespace) as stream,
    ):

        def trusting(*cas: Path) -> list[dict[str, Any]]:
            extra = [arg for ca in cas[1:] for arg in ("--ca", str(ca / "ca.crt"))]
            return webhook_configuration(
                cas[0] / "ca.crt", relay.url, "--policies", str(webhook_policies), *extra
            )

        stream.run_for(WARM_S)
        current = old_ca
        for round_ in range(1, CA_ROTATIONS + 1):
            new_ca = write_certificates(tmp_path / f"ca-{round_}")
            both = apply_in_force(webhook, relay, trusting(current, new_ca))
            stream.run_for(STEADY_S)
            pair = new_serving_pair(new_ca)
            rename_into_place(mount, pair)
            wait_served(server.port, pair.serial, "the certificate of the new CA")
            burst = new_connections(relay, lambda: stream.burst(BURST))
            stream.run_for(STEADY_S)
            new_only = apply_in_force(webhook, relay, trusting(new_ca))
            handshakes.append(f"both CAs {both}, burst {burst}, new CA only {new_only}")
            stream.run_for(STEADY_S)
            current = new_ca
        stream.stop()
        figures = tally("b. CA rotation", stream, control_plane.api)

    print(figures.line(f"{CA_ROTATIONS} CA rotations, new apiserver connections: {handshakes}"))
    assert_no_failure(figures)


# -- c. a policy reload storm ------------------------------------------------------------------


def policy_version(name: str) -> dict[str, str]:
    """The bundled default policy, renamed `name`, its pools named after it too."""
    settings, policy = yaml.safe_load_all((REPO / "policies/default.yaml").read_text())
    policy["metadata"]["name"] = name
    for pool in policy["spec"]["pools"]:
        pool["name"] = f"{name}-{pool['name']}"
    return {"default.yaml": yaml.safe_dump_all([settings, policy], sort_keys=False)}


def invalid_versions(valid: Mapping[str, str]) -> list[dict[str, str]]:
    """Versions the server must refuse, each a different kind of mistake."""
    text = valid["default.yaml"]
    return [
        {"default.yaml": text + "\n  broken: [unclosed\n"},  # YAML syntax
        {"default.yaml": text.replace("max: 0.5", "max: 0.01")},  # min > max
        {**valid, "extra.yaml": "apiVersion: gpushare.io/v1alpha1\napiVersion: twice\n"},
        {"default.yaml": ""},  # no policy at all
    ]


def write_version(directory: Path, files: Mapping[str, str]) -> None:
    """Rewrite the files in place (truncate, write) and delete those the version lacks."""
    for path in directory.glob("*.yaml"):
        if path.name not in files:
            path.unlink()
    for name, text in files.items():
        (directory / name).write_text(text)


def mutation(pod: Mapping[str, Any]) -> str:
    """What gpushare decides about a pod, independent of its name, as comparable text."""
    spec = pod["spec"]
    return yaml.safe_dump(
        {
            "annotations": pod["metadata"].get("annotations"),
            "nodeSelector": spec.get("nodeSelector"),
            "tolerations": sorted(map(repr, spec.get("tolerations") or [])),
            "containers": [
                (c["name"], c.get("resources"), c.get("env")) for c in spec["containers"]
            ],
        }
    )


def test_policy_reload_storm_under_load_serves_only_valid_versions(
    control_plane: ControlPlane,
    probe_namespace: str,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Valid versions A and B alternate with four kinds of invalid ones, rewritten in place.

    Every stored annotated pod is exactly what `gpushare mutate` predicts with A or with B,
    both occur, and once the storm ends on an invalid version the pods created after it get
    the last valid version: the last good set keeps serving.

    And no create fails. Found here: /validate planned the pod again with the version its
    worker held at that moment, so a pod mutated under A and validated under B (the same
    worker reloaded in between, or its sibling had not yet) was denied as "changed
    afterwards" (2-14 creates per storm). Pods now record their policy's version, and a
    replica serving another version admits them with a note instead.
    """
    names = ("storm-a", "storm-b")
    valid = {name: policy_version(name) for name in names}
    expected: dict[str, str] = {}
    for name, files in valid.items():
        version_dir = tmp_path / name
        version_dir.mkdir()
        write_version(version_dir, files)
        template = annotated_pod("template")
        prediction = predict(webhook_input(control_plane.api, template), version_dir, namespace)
        assert prediction.pod is not None, prediction.denied
        expected[mutation(as_admitted(control_plane.api, prediction.pod))] = name
    assert len(expected) == 2, "the two valid versions must mutate differently"
    policies = tmp_path / "policies"
    policies.mkdir()
    write_version(policies, valid["storm-a"])
    sequence = [
        version
        for index in range(STORM_REWRITES // 2)
        for version in (
            invalid_versions(valid[names[index % 2]])[index % 4],
            valid[names[(index + 1) % 2]],
        )
    ]
    sequence.append(invalid_versions(sequence[-1])[0])  # end on a refused version
    last_valid = names[STORM_REWRITES // 2 % 2]

    with (
        serving(
            tmp_path / "server",
            policies,
            write_certificates(tmp_path / "certs"),
            extra_args=("--policy-poll-seconds", "0.1"),
        ) as server,
        Relay([server.port]) as relay,
        registered(server, relay.url, control_plane, probe_namespace),
        pod_stream(control_plane, namespace) as stream,
    ):
        stream.run_for(WARM_S)
        for version in sequence:
            write_version(policies, version)
            stream.run_for(STORM_INTERVAL_S)
        settled = time.monotonic() + 1.0  # every worker has polled the last version
        stream.run_for(1.0 + max(STEADY_S, WARM_S))
        stream.stop()
        figures = tally("c. policy reload storm", stream, control_plane.api)
        status = server.get("/readyz")

    stored = stored_pods(control_plane.api, namespace)
    versions = Counter(
        expected.get(mutation(pod), "none") for pod in stored.values() if annotated(pod)
    )
    after = {c.name for c in stream.results() if c.annotated and c.started >= settled}
    late_versions = Counter(expected.get(mutation(stored[n]), "none") for n in after if n in stored)
    print(
        figures.line(
            f"{len(sequence)} rewrites, stored pods by version {dict(versions)}, "
            f"after the last (refused) rewrite {dict(late_versions)}"
        )
    )
    assert figures.wrong_allows == 0, figures.unmutated_names[:10]
    assert set(versions) == set(names), versions
    assert set(late_versions) == {last_valid}, late_versions
    assert status[0] == 200, status
    readiness = json.loads(status[1])["policies"]
    assert readiness["loaded"] and readiness["last_reload_failed_at"], readiness
    assert readiness["reloads_ok"] and readiness["reloads_failed"], readiness
    assert figures.failed == 0, figures.failure_summary()


# -- d. two replicas, one restarted and one killed ---------------------------------------------


def test_replica_restart_and_kill_under_load(
    control_plane: ControlPlane,
    probe_namespace: str,
    namespace: str,
    webhook_policies: Path,
    tmp_path: Path,
) -> None:
    """Two replicas behind one registration: one call reset; one replica restarted with
    SIGTERM; then killed with SIGKILL and started again.

    The reset shows what kube-apiserver does with a webhook call whose connection is reset:
    it does not retry it (Go's HTTP transport resends only a request it never wrote, and
    client-go retries connection errors of GETs only; the admission dispatcher has no retry
    of its own), so under Fail the create fails, with the transport's error in the message.
    Exactly one create fails.

    The graceful restart is a Deployment's rolling update: the replica leaves the rotation
    (its endpoint is removed), then gets SIGTERM; its workers finish the calls in flight and
    close the kept-alive connections (gunicorn's ThreadWorker shutdown). No create fails.

    The kill is a crash: the replica stays in the rotation until a connection to it is
    refused; calls it had in flight, and calls racing the apiserver's notice that its
    kept-alive connections died, fail: at most KILL_FAILURE_BOUND creates.
    Never a wrong allow. Before each fault the registration is re-applied with the CA bytes
    written differently (a new client, new connections spread over both replicas) and the
    replica is seen taking calls, so every fault hits a replica in use.
    """
    certs = write_certificates(tmp_path / "certs")
    windows: list[tuple[str, float, float]] = []

    def replica(name: str, port: int | None = None, *, wait: bool = True) -> WebhookServer:
        return start_server(
            tmp_path / name, webhook_policies, certs, port=port, name=name, wait=wait
        )

    first = replica("replica-0", wait=False)
    second = replica("replica-1", wait=False)
    servers = [first, second]
    spreads = itertools.count(1)
    try:
        for server in servers:
            wait_ready(server)
        with (
            Relay([first.port, second.port]) as relay,
            registered(first, relay.url, control_plane, probe_namespace) as webhook,
            pod_stream(control_plane, namespace) as stream,
        ):

            def spread(*replicas: WebhookServer) -> list[float]:
                """New apiserver connections, until each of `replicas` takes calls."""
                before = [r.admission_counts().total() for r in replicas]
                bundle = certs.joinpath("ca.crt").read_bytes() + b"\n" * next(spreads)
                apply_in_force(webhook, relay, with_bundle(webhook.documents, bundle))
                stream.burst(BURST)  # more connections than the steady stream needs

                def taken() -> list[float] | None:
                    after = [r.admission_counts().total() for r in replicas]
                    return after if all(map(float.__gt__, after, before)) else None

                return wait_for("every replica to take calls", taken, timeout=20)

            stream.run_for(WARM_S)
            calls_before = spread(first, second)
            # One call reset mid-way.
            start = time.monotonic()
            relay.reset_next_call()
            wait_for("a call to be reset", lambda: relay.resets or None, timeout=10)
            stream.run_for(1.0)
            windows.append(("reset", start, time.monotonic()))
            for round_ in range(RESTARTS):
                # Graceful: out of the rotation, SIGTERM, wait for the exit, start again.
                if round_:  # the first round's replica was seen taking calls above
                    spread(first)
                start = time.monotonic()
                relay.remove(first.port)
                first.stop(grace=60)
                first = replica(f"replica-0-{round_}-restarted", first.port)
                servers.append(first)
                relay.add(first.port)
                stream.run_for(1.0)
                windows.append(("graceful", start, time.monotonic()))
                # A crash: SIGKILL the whole process group, still in the rotation.
                spread(first)
                start = time.monotonic()
                kill(first)
                stream.run_for(1.0)
                first = replica(f"replica-0-{round_}-after-kill", first.port)
                servers.append(first)
                relay.add(first.port)
                stream.run_for(1.0)
                windows.append(("kill", start, time.monotonic()))
            stream.run_for(STEADY_S)
            stream.stop()
            figures = tally("d. replicas: reset, restart, kill", stream, control_plane.api)
            outcomes = stream.results()
    finally:
        for server in servers:
            server.stop()

    failed: dict[str, list[Create]] = {"reset": [], "graceful": [], "kill": []}
    for kind, start, end in windows:
        failed[kind] += [c for c in outcomes if not c.ok and start <= c.finished <= end]
    print(
        figures.line(
            f"calls per replica before {calls_before}, connections refused {dict(relay.refused_by)}"
            f", failed on the reset {len(failed['reset'])}, on {RESTARTS} graceful restarts "
            f"{len(failed['graceful'])}, on {RESTARTS} kills {len(failed['kill'])}"
        )
    )
    for create in figures.failures:
        print(f"    failed {create.name}: {create.status} {create.error}")
    assert figures.wrong_allows == 0, figures.unmutated_names[:10]
    assert figures.ordinary_failed == 0, figures.failure_summary()
    assert sum(map(len, failed.values())) == figures.failed, (
        "a create failed outside a fault: " + figures.failure_summary()
    )
    assert len(failed["reset"]) == 1, figures.failure_summary()
    assert failed["graceful"] == [], figures.failure_summary()
    assert len(failed["kill"]) <= KILL_FAILURE_BOUND * RESTARTS, figures.failure_summary()
    for create in figures.failures:
        assert "failed calling webhook" in (create.error or ""), create
        assert create.status == 500, create


# -- e. the webhook down entirely ---------------------------------------------------------------


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_webhook_down_under_load(
    failure_policy: str,
    control_plane: ControlPlane,
    probe_namespace: str,
    namespace: str,
    webhook_server: WebhookServer,
) -> None:
    """Up, then down entirely (connections refused, open ones reset), then up again.

    Ordinary pods never reach the webhook (matchConditions), so none fails. Annotated pods
    created while it is down are rejected under Fail; under Ignore the apiserver goes on
    without the mutation and the safety-net policy printed with Ignore lets them through:
    each is stored as written (no GPU resource, so none holds a share without its limits).
    Before and after the outage every one is mutated.
    """
    fail = failure_policy == "Fail"
    with (
        Relay([webhook_server.port]) as relay,
        registered(
            webhook_server,
            relay.url,
            control_plane,
            probe_namespace,
            "--failure-policy",
            failure_policy,
        ),
        pod_stream(control_plane, namespace) as stream,
    ):
        stream.run_for(WARM_S)
        going_down = time.monotonic()
        relay.down()
        down_at = time.monotonic()
        stream.run_for(DOWN_S)
        coming_up = time.monotonic()
        relay.up()
        up_at = time.monotonic()
        stream.run_for(STEADY_S)
        stream.stop()
        figures = tally(
            f"e. webhook down ({failure_policy})", stream, control_plane.api, fail_policy=fail
        )

    outcomes = stream.results()
    stored = stored_pods(control_plane.api, namespace)
    during = [c for c in between(outcomes, down_at, coming_up) if c.annotated]
    outside = [
        c for c in outcomes if c.annotated and (c.finished < going_down or c.started > up_at)
    ]
    print(
        figures.line(
            f"down {coming_up - down_at:.1f} s: {len(during)} annotated creates, "
            f"{sum(not c.ok for c in during)} rejected, "
            f"{sum(c.ok and not mutated(stored[c.name]) for c in during)} stored unmutated"
        )
    )
    assert figures.ordinary_failed == 0, figures.failure_summary()
    assert figures.wrong_allows == 0, figures.unmutated_names[:10]
    assert during, "no annotated create while the webhook was down"
    if fail:
        rejected = [c for c in during if not c.ok]
        assert rejected == during, [c for c in during if c.ok][:3]
        assert all(
            f'failed calling webhook "{MUTATING_WEBHOOK}"' in (c.error or "")
            and "connection refused" in (c.error or "")
            for c in rejected
        ), figures.failure_summary()
        assert not any(c.name in stored for c in during)
    else:
        assert all(c.ok for c in during), figures.failure_summary()
        assert not any(mutated(stored[c.name]) for c in during)
        assert not any(SHARED_RESOURCE in json.dumps(stored[c.name]) for c in during)
    unmutated_outside = [c for c in outside if not (c.ok and mutated(stored[c.name]))]
    assert not unmutated_outside, unmutated_outside[:3]
