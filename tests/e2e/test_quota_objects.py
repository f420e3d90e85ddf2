"""The quota objects the policies declare (webhook/install/declared_quotas.py, `gpushare
webhook-config --quotas`, the chart's quotas.yaml) are what the apiserver and Kueue take as
written:

- the ResourceQuotas on the session's plane: applied server-side with strict field
  validation, and read back with the same hard limit, labels and annotation;
- the Kueue objects against Kueue's own CRDs (sigs.k8s.io/kueue, built by
  harness/tools/kueue: the version the e2e Kueue runs): kueue.x-k8s.io/v1beta2 is the
  version those CRDs serve and store; each object is valid under its CRD's
  openAPIV3Schema with unknown fields refused (jsonschema; the CRDs themselves allow
  unknown fields, which the apiserver would prune unseen); a server-side dry-run apply
  with strict field validation passes the apiserver's structural schema and CEL rules; and
  applied for real on a plane with Kueue running, the ClusterQueue and every LocalQueue
  become Active (Kueue found the flavor and the queue), keeping every field as written.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest
import yaml
from kueue_plane import KueueTestPlane

from harness.controlplane import ControlPlane
from harness.kueue import API, FIELD_MANAGER, KueueBuild
from webhook.core import load_policy_text
from webhook.install import quota_objects, render_yaml

LABELS = {"app.kubernetes.io/name": "gpushare", "app.kubernetes.io/part-of": "gpushare"}
KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue")
POLICY = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: teams}}
spec:
  default: true
  mode: time-slicing
  pools: [{{name: half, replicas: 2}}]
  quota:
    shareResource: true
    namespaces: {namespaces}
    {kueue}
"""


def declared(namespaces: Mapping[str, str], kueue: str = "") -> list[dict[str, Any]]:
    text = POLICY.format(namespaces=dict(namespaces), kueue=kueue)
    return quota_objects(load_policy_text(text, "policies/teams.yaml"), LABELS)


APPLY = ("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--validate=strict")


def test_the_resource_quota_is_created_as_written(
    control_plane: ControlPlane, namespace: str
) -> None:
    (quota,) = declared({namespace: "1.5"})
    applied = control_plane.kubectl(*APPLY, "-f", "-", input=render_yaml([quota]), check=False)
    assert applied.returncode == 0, applied.stderr
    name = quota["metadata"]["name"]
    read = json.loads(
        control_plane.kubectl("get", "resourcequota", name, "-n", namespace, "-o", "json").stdout
    )
    assert read["spec"] == {"hard": {"requests.gpushare.io/milligpu": "1500"}}
    assert read["metadata"]["labels"] == LABELS
    assert read["metadata"]["annotations"] == {
        "gpushare.io/declared-by": "policy teams in teams.yaml"
    }


# -- Kueue --------------------------------------------------------------------------------------


def crds(build: KueueBuild) -> dict[str, dict[str, Any]]:
    """Kueue's CRDs of the build, by kind."""
    found = {}
    for path in build.crd_files:
        crd = yaml.safe_load(path.read_text())
        found[crd["spec"]["names"]["kind"]] = crd
    return found


def strict(schema: Any) -> Any:
    """`schema` with unknown fields refused wherever it lists the properties of an object and
    says nothing of the others (what the apiserver would prune without a word)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in result
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


def version_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any]:
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert entry["served"] and entry["storage"], (crd["spec"]["names"]["kind"], version)
    return dict(entry["schema"]["openAPIV3Schema"])


def contains(actual: Any, expected: Any) -> bool:
    """Whether `actual` holds everything of `expected` (the apiserver adds defaults)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and contains(actual[key], value) for key, value in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(contains(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected)


def test_the_kueue_objects_are_valid_under_kueues_crds(kueue_build: KueueBuild) -> None:
    kueue = '{clusterQueue: gpu-shares, gpus: "2.5", namespaces: [team-b, team-a], '
    kueue += 'resources: {memory: 64Gi, cpu: "16"}}'
    objects = [d for d in declared({}, "kueue: " + kueue) if d["kind"] in KUEUE_KINDS]
    assert [d["kind"] for d in objects] == [
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "LocalQueue",
    ]
    by_kind = crds(kueue_build)
    for document in objects:
        group, version = document["apiVersion"].split("/")
        crd = by_kind[document["kind"]]
        assert crd["spec"]["group"] == group
        schema = strict(version_schema(crd, version))
        jsonschema.Draft7Validator(schema).validate(document)
    # The check refuses what the apiserver would prune: a misspelt field.
    wrong = copy.deepcopy(objects[2])
    wrong["spec"]["clusterqueue"] = wrong["spec"].pop("clusterQueue")
    schema = strict(version_schema(by_kind["LocalQueue"], "v1beta2"))
    with pytest.raises(jsonschema.ValidationError, match="'clusterqueue' was unexpected"):
        jsonschema.Draft7Validator(schema).validate(wrong)


def test_kueue_takes_the_objects_and_activates_the_queues(kueue_plane: KueueTestPlane) -> None:
    plane = kueue_plane.plane
    first, second = kueue_plane.namespace("quota"), kueue_plane.namespace("quota")
    kueue = f'{{clusterQueue: gpu-shares, gpus: "1.5", namespaces: [{first}, {second}], '
    kueue += 'resources: {cpu: "8"}}'
    objects = declared({first: "1"}, "kueue: " + kueue)
    assert [d["kind"] for d in objects] == [
        "ResourceQuota",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "LocalQueue",
    ]
    text = render_yaml(objects)
    dry = plane.kubectl(*APPLY, "--dry-run=server", "-f", "-", input=text, check=False)
    assert dry.returncode == 0, dry.stderr
    applied = plane.kubectl(*APPLY, "-f", "-", input=text, check=False)
    assert applied.returncode == 0, applied.stderr
    paths = {
        "ClusterQueue": f"{API}/clusterqueues/gpu-shares",
        "ResourceFlavor": f"{API}/resourceflavors/gpushare",
    }
    for document in objects:
        kind, metadata = document["kind"], document["metadata"]
        if kind == "LocalQueue":
            path = f"{API}/namespaces/{metadata['namespace']}/localqueues/{metadata['name']}"
        elif kind == "ResourceQuota":
            continue  # the session-plane test reads it back
        else:
            path = paths[kind]
        read = (
            kueue_plane.kueue.wait_active(path)
            if kind != "ResourceFlavor"
            else kueue_plane.kueue.request("GET", path)
        )
        assert contains(read["metadata"], metadata), (path, read["metadata"])
        assert contains(read["spec"], document["spec"]), (path, read["spec"])
