"""The rules of a policy's ``enforcement`` section against its mode and pools: each refused
where it is written (file, YAML path under spec, line), saying what to change.
"""

from __future__ import annotations

import textwrap

import pytest

from webhook.core.policy.loader import load_policies, load_policy_text
from webhook.errors import PolicyError

from .support import MPS_DAEMON_EXAMPLE, MPS_EXAMPLE

HEADER = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: team
spec:
  default: true
"""

POOLS = """\
mode: time-slicing
pools:
  - name: h100
    replicas: 4
    gpuMemory: 80Gi
    nodeSelector:
      nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
  - name: any
    replicas: 2
    gpuMemory: 24Gi
"""


def _text(spec: str) -> str:
    """A policy document whose spec body starts on line 7 (POOLS: lines 7 to 16)."""
    return HEADER + textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ") + "\n"


def _problems(spec: str) -> list[str]:
    with pytest.raises(PolicyError) as error:
        load_policy_text(_text(spec), "team.yaml")
    return error.value.problems


def test_a_valid_section_loads_with_its_values() -> None:
    spec = POOLS + textwrap.dedent("""\
        enforcement:
          driverMemoryLimit: require
          reservedMemory:
            default: 512Mi
            products: {NVIDIA-H100-80GB-HBM3: 1.5Gi}
          handSetLimits: deny
          deviceVariables: allow
    """)
    (policy,) = load_policy_text(_text(spec), "team.yaml").policies
    enforcement = policy.enforcement
    assert enforcement.driver_memory_limit.value == "require"
    assert enforcement.reserved_mib("NVIDIA-H100-80GB-HBM3") == 1536
    assert enforcement.reserved_mib(None) == 512
    assert (enforcement.hand_set_limits.value, enforcement.device_variables.value) == (
        "deny",
        "allow",
    )


@pytest.mark.parametrize("setting", ["inject", "require"])
def test_the_driver_limit_outside_the_pool_modes_is_refused(setting: str) -> None:
    spec = f"""\
        mode: hami
        enforcement:
          driverMemoryLimit: {setting}
          reservedMemory: {{default: 1Gi}}
    """
    assert _problems(spec) == [
        f"team.yaml: spec.enforcement.driverMemoryLimit: driverMemoryLimit: {setting} is "
        "written by the pool modes (time-slicing, mps, mps-daemon); mode hami enforces limits "
        "its own way (docs/schemes.md): remove it (line 9)",
        "team.yaml: spec.enforcement.reservedMemory: reservedMemory sizes the driver limit of "
        "the pool modes (time-slicing, mps, mps-daemon), which mode hami does not write: "
        "remove it (line 10)",
    ]


@pytest.mark.parametrize("setting", ["auto", "off"])
def test_auto_and_off_are_accepted_by_every_mode(setting: str) -> None:
    spec = f'mode: hami\nenforcement: {{driverMemoryLimit: "{setting}", handSetLimits: deny}}\n'
    assert load_policy_text(_text(spec), "team.yaml").policies


def test_a_bare_off_read_as_false_by_yaml_is_refused_saying_to_quote_it() -> None:
    spec = "mode: time-slicing\npools: [{name: a, replicas: 2}]\n"
    assert _problems(spec + "enforcement: {driverMemoryLimit: off}\n") == [
        "team.yaml: spec.enforcement.driverMemoryLimit: False is not one of off, auto, inject, "
        'require (YAML reads a bare off as false: write "off" in quotes) (line 9)'
    ]


@pytest.mark.parametrize("setting", ["inject", "require"])
def test_a_pool_of_unknown_memory_is_refused_where_the_limit_must_be_written(
    setting: str,
) -> None:
    spec = f"""\
        mode: time-slicing
        pools:
          - name: sized
            replicas: 2
            gpuMemory: 40Gi
          - name: by-labels
            replicas: 4
        enforcement: {{driverMemoryLimit: {setting}}}
    """
    assert _problems(spec) == [
        f"team.yaml: spec.pools[1]: driverMemoryLimit: {setting} needs each share's size in "
        "MiB, but pool 'by-labels' declares no gpuMemory, so every gpu-fraction ask on it "
        "would be refused: declare gpuMemory on this pool (or spec.gpuMemory), or use "
        "driverMemoryLimit: auto (line 12)",
    ]
    auto = spec.replace(setting, "auto")
    assert load_policy_text(_text(auto), "team.yaml").policies


def test_a_reservation_that_leaves_a_pool_nothing_is_refused_once() -> None:
    spec = POOLS + textwrap.dedent("""\
        enforcement:
          reservedMemory:
            default: 24Gi
            products: {NVIDIA-H100-80GB-HBM3: 80Gi}
    """)
    assert _problems(spec) == [
        "team.yaml: spec.enforcement.reservedMemory.products.NVIDIA-H100-80GB-HBM3: "
        "reservedMemory '80Gi' (81920Mi) is not less than the 81920Mi of GPU memory of pool "
        "'h100', which would leave its pods nothing: reserve what the driver and the CUDA "
        "context keep (some hundreds of MiB) (line 20)",
        "team.yaml: spec.enforcement.reservedMemory.default: reservedMemory '24Gi' (24576Mi) "
        "is not less than the 24576Mi of GPU memory of pool 'any', which would leave its pods "
        "nothing: reserve what the driver and the CUDA context keep (some hundreds of MiB) "
        "(line 19)",
    ]


def test_a_reservation_for_a_model_no_pool_selects_is_refused_naming_what_pools_select() -> None:
    spec = POOLS + textwrap.dedent("""\
        enforcement:
          reservedMemory:
            products:
              NVIDIA-H100-80GB-HBM3: 1Gi
              NVIDIA-A100-SXM4-80GB: 1Gi
    """)
    assert _problems(spec) == [
        "team.yaml: spec.enforcement.reservedMemory.products.NVIDIA-A100-SXM4-80GB: no pool of "
        "this policy selects nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB (pool 'h100' "
        "selects 'NVIDIA-H100-80GB-HBM3'; pool 'any' selects no model), so this reservation "
        "is never used: name a product a pool selects in its nodeSelector, or remove it "
        "(reservedMemory.default covers pools that name no model) (line 21)",
    ]


def test_the_examples_declare_their_enforcement() -> None:
    (daemon,) = load_policies(MPS_DAEMON_EXAMPLE).policies
    assert daemon.enforcement.reserved_mib("NVIDIA-L4") == 2048
    (mps,) = load_policies(MPS_EXAMPLE).policies
    assert mps.enforcement.driver_memory_limit.value == "auto"
