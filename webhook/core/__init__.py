"""The decision: annotation + policy + pod in, a verdict (a JSON Patch or a denial) out.

Pure: plain dicts and frozen values in, new values out; no I/O but reading policy files,
no environment, no web framework. This is the package's face: the server, the CLI, the node
side and the install tools use only the names below; the modules behind them are free to
change. Layout: docs/architecture.md.
"""

from webhook.core.enforcing_nodes import (
    PoolCoverage,
    enforcing_node_findings,
    pool_coverage,
    writes_driver_limit,
)
from webhook.core.framework_images import (
    DEFAULT_IMAGES,
    JAX,
    JAX_FRACTION,
    JAX_PREALLOCATE,
    TENSORFLOW,
    TF_GROWTH,
    Knob,
    image_version,
    parse_version,
)
from webhook.core.frameworks import JAX_NEW_FRACTION_VAR
from webhook.core.modes import (
    PIPE_VOLUME,
    ModeProfile,
    mode_changes,
    mode_profile,
    namespace_templates,
    place_request,
    whole_gpu_changes,
)
from webhook.core.object_paths import written_path
from webhook.core.placement import Placement, format_fraction
from webhook.core.planning import Decision, Denied, Planned, Untouched
from webhook.core.pod_bounds import pod_size_problem
from webhook.core.pod_shape import pod_shape_problem
from webhook.core.policy.enforcement import (
    DeviceVariables,
    DriverMemoryLimit,
    EnforcementSettings,
    HandSetLimits,
)
from webhook.core.policy.loader import (
    default_policies_path,
    load_policies,
    load_policy_text,
    load_policy_texts,
    read_policy_files,
)
from webhook.core.policy.model import (
    Allocation,
    DirectRequests,
    FrameworkImages,
    Match,
    Mode,
    Policy,
    PolicySet,
    Pool,
    ServerMemory,
)
from webhook.core.policy.schema import document_schema
from webhook.core.policy.schemes import KAI_SCHEDULER
from webhook.core.policy.set_checks import SetFinding, Severity, check_policy_set, finding_lines
from webhook.core.request import MAX_VALUE_LENGTH, MAX_WHOLE_GPUS, read_request
from webhook.core.server_parallelism import ServerGpus, check_server_gpus, lws_group_size
from webhook.core.verdict import Verdict, mutate, mutated_pod, validate
from webhook.core.verdict_memo import remembered_mutate
from webhook.core.workload_kinds import (
    Shape,
    TemplateAt,
    TemplateSite,
    TooManyTemplatesError,
    WorkloadKind,
    builtin_kinds,
    pod_count,
    templates_at,
)
from webhook.core.workload_pods import template_pod
from webhook.core.workload_quota import KueueCharge, kueue_charge, kueue_queue
from webhook.core.workload_verdicts import TemplateVerdict, WorkloadVerdict
from webhook.core.workloads import (
    api_group,
    check_template,
    check_workload,
    kinds_read,
    template_changed,
    workload_kind,
)

__all__ = [
    "DEFAULT_IMAGES",
    "JAX",
    "JAX_FRACTION",
    "JAX_NEW_FRACTION_VAR",
    "JAX_PREALLOCATE",
    "KAI_SCHEDULER",
    "MAX_VALUE_LENGTH",
    "MAX_WHOLE_GPUS",
    "PIPE_VOLUME",
    "TENSORFLOW",
    "TF_GROWTH",
    "Allocation",
    "Decision",
    "Denied",
    "DeviceVariables",
    "DirectRequests",
    "DriverMemoryLimit",
    "EnforcementSettings",
    "FrameworkImages",
    "HandSetLimits",
    "Knob",
    "KueueCharge",
    "Match",
    "Mode",
    "ModeProfile",
    "Placement",
    "Planned",
    "Policy",
    "PolicySet",
    "Pool",
    "PoolCoverage",
    "ServerGpus",
    "ServerMemory",
    "SetFinding",
    "Severity",
    "Shape",
    "TemplateAt",
    "TemplateSite",
    "TemplateVerdict",
    "TooManyTemplatesError",
    "Untouched",
    "Verdict",
    "WorkloadKind",
    "WorkloadVerdict",
    "api_group",
    "builtin_kinds",
    "check_policy_set",
    "check_server_gpus",
    "check_template",
    "check_workload",
    "default_policies_path",
    "document_schema",
    "enforcing_node_findings",
    "finding_lines",
    "format_fraction",
    "image_version",
    "kinds_read",
    "kueue_charge",
    "kueue_queue",
    "load_policies",
    "load_policy_text",
    "load_policy_texts",
    "lws_group_size",
    "mode_changes",
    "mode_profile",
    "mutate",
    "mutated_pod",
    "namespace_templates",
    "parse_version",
    "place_request",
    "pod_count",
    "pod_shape_problem",
    "pod_size_problem",
    "pool_coverage",
    "read_policy_files",
    "read_request",
    "remembered_mutate",
    "template_changed",
    "template_pod",
    "templates_at",
    "validate",
    "whole_gpu_changes",
    "workload_kind",
    "writes_driver_limit",
    "written_path",
]
