"""A control plane with every GPU operator's CRDs installed, for the e2e modules that create
the operators' objects (the `operator_plane` fixture of conftest.py).

The CRDs are the ones harness/tools/operator-crds/build.sh took from the projects' Go
modules (harness/operator_crds.py), applied server-side (the full Argo and KServe CRDs are
megabytes: client-side apply's last-applied annotation could not hold them) and waited on
until Established. A control plane of its own (etcd and kube-apiserver, no scheduler), so
the session's apiserver never carries these schemas (tens of megabytes of OpenAPI).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.controlplane import ControlPlane
from harness.operator_crds import OperatorCrds

FIELD_MANAGER = "gpushare-e2e"
# Applying the full CRDs (about 25 MB of YAML) and waiting for them: seconds, but leave room.
INSTALL_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class OperatorPlane:
    """The plane and the CRDs installed in it: `installed[project]` lists CRD names
    (`<plural>.<group>`) in modules.txt order."""

    plane: ControlPlane
    crds: OperatorCrds
    installed: dict[str, list[str]]

    @property
    def crd_names(self) -> set[str]:
        return {name for names in self.installed.values() for name in names}


def kubectl(plane: ControlPlane, *args: str, input: str | None = None) -> str:
    """`kubectl ARGS` on the plane; a failure raises with kubectl's message."""
    result = plane.kubectl(*args, input=input, check=False, timeout=INSTALL_TIMEOUT_S)
    if result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}\n{result.stderr}")
    return result.stdout


def install_operator_crds(plane: ControlPlane, crds: OperatorCrds) -> dict[str, list[str]]:
    """Every project's CRDs applied server-side and Established: CRD names by project."""
    names: dict[str, list[str]] = {}
    for project, files in crds.crds_by_project().items():
        args = [arg for path in files for arg in ("-f", str(path))]
        applied = kubectl(
            plane, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-o", "name", *args
        )
        # customresourcedefinition.apiextensions.k8s.io/<plural>.<group>
        names[project] = [line.split("/", 1)[1] for line in applied.split()]
        if len(names[project]) != len(files):
            raise AssertionError(f"{project}: applied {applied!r} from {len(files)} files")
    every = [f"crd/{name}" for project_names in names.values() for name in project_names]
    kubectl(plane, "wait", "--for=condition=Established", "--timeout=120s", *every)
    return names
