"""The JSON Schema of policy documents: the single source of their structure.

The loader validates every document against it before building values, so editors that use
``gpushare policy schema`` see exactly the rules gpushare applies. Cross-field rules that a
schema cannot say (min below max, MPS pools need GPU memory, ...) live in ``loader``.
"""

from __future__ import annotations

from typing import Any

from webhook.core.policy.enforcement import ENFORCEMENT_SCHEMA
from webhook.core.policy.model import API_VERSION, POLICY_KIND, SETTINGS_KIND
from webhook.core.policy.quota import QUOTA_SCHEMA
from webhook.core.policy.schemes import SCHEME_SCHEMA

_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 63}
_LABEL_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_QUANTITY = {"type": "string", "pattern": r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|K|M|G|T)?$"}
_RESOURCE_NAME = {"type": "string", "pattern": r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$"}
_GLOBS = {"type": "array", "items": {"type": "string", "minLength": 1}}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        schema["required"] = required
    return schema


_VERSION_TEXT = {"type": "string", "pattern": r"^v?\d+\.\d+(\.\d+)?$"}


def _framework(knobs: dict[str, Any]) -> dict[str, Any]:
    """A framework's section: its knobs, the images that run it, versions declared."""
    return _object(
        {
            **knobs,
            "images": {
                **_GLOBS,
                "description": "Image globs of this framework (default: its official images).",
            },
            "versions": {
                "type": "object",
                "additionalProperties": _VERSION_TEXT,
                "description": "Framework version of images (glob: version) whose tag "
                "does not tell it.",
            },
        }
    )


_POOL = _object(
    {
        "name": {**_NAME, "description": "Pool name; also the device-plugin config name."},
        "replicas": {
            "type": "integer",
            "minimum": 2,
            "maximum": 48,
            "description": "Slots per GPU (device plugin replicas); a slot is 1/replicas.",
        },
        "gpuMemory": {**_QUANTITY, "description": "Memory of one GPU in this pool, e.g. 80Gi."},
        "gpusPerNode": {"type": "integer", "minimum": 1},
        "nodeSelector": {**_LABEL_MAP, "description": "Extra node labels for this pool."},
        "devicePluginConfig": {
            **_NAME,
            "description": "Config name for nvidia.com/device-plugin.config (default: name).",
        },
    },
    required=["name", "replicas"],
)

_TOLERATION = _object(
    {
        "key": {"type": "string"},
        "operator": {"enum": ["Exists", "Equal"]},
        "value": {"type": "string"},
        "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
        "tolerationSeconds": {"type": "integer"},
    }
)

# A DNS subdomain: DeviceClass and driver names (k8s.io/api resource/v1).
_SUBDOMAIN = {
    "type": "string",
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    "maxLength": 253,
}
_ATTRIBUTE_VALUES = {
    "type": "array",
    "minItems": 1,
    "maxItems": 32,
    "items": {"type": "string", "pattern": "^[ -~]+$", "maxLength": 256},
}
_DRA = _object(
    {
        "deviceClassName": {**_SUBDOMAIN, "description": "DeviceClass of the GPUs."},
        "driver": {**_SUBDOMAIN, "description": "DRA driver: attribute domain, config."},
        "capacity": {
            "type": "string",
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "maxLength": 63,
            "description": "Consumable capacity a share asks for (NVIDIA: memory).",
        },
        "granularity": {**_QUANTITY, "description": "Shares round up to this (1Gi)."},
        "selectors": _object(
            {
                "productNames": {**_ATTRIBUTE_VALUES, "description": "productName values."},
                "architectures": {**_ATTRIBUTE_VALUES, "description": "architecture values."},
                "minGpuMemory": {**_QUANTITY, "description": "Least memory of a GPU."},
            }
        ),
        "sharing": _object(
            {
                "strategy": {"enum": ["None", "TimeSlicing", "MPS"]},
                "timeSlicingInterval": {"enum": ["Default", "Short", "Medium", "Long"]},
            }
        ),
    }
)

# The other device plugins' schemes (webhook.core.policy.schemes).
_SCHEME_MODES = ["aws-vgpu", "tencent-vcuda", "aliyun-gpushare", "hami", "kai"]

_POLICY_SPEC = _object(
    {
        "default": {
            "type": "boolean",
            "description": "Govern namespaces that no other policy matches.",
        },
        "priority": {
            "type": "integer",
            "description": "Among matching policies the highest priority wins.",
        },
        "match": _object(
            {
                "namespaces": {**_GLOBS, "description": "Namespace names or globs ('team-*')."},
                "excludeNamespaces": _GLOBS,
                "podLabels": {**_LABEL_MAP, "description": "Labels the pod must carry."},
            }
        ),
        "mode": {"enum": ["time-slicing", "mps", "mps-daemon", "dra", *_SCHEME_MODES]},
        "resourceName": _RESOURCE_NAME,
        "allocation": {"enum": ["replica-class", "count"]},
        "fraction": _object(
            {
                "min": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "max": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            }
        ),
        "wholeGpus": _object(
            {
                "resourceName": _RESOURCE_NAME,
                "max": {"type": "integer", "minimum": 0},
                "nodeSelector": _LABEL_MAP,
            }
        ),
        "gpuMemory": {**_QUANTITY, "description": "Default GPU memory of every pool."},
        "headroom": {
            "type": "string",
            "pattern": r"^(\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|K|M|G|T)?|\d+(\.\d+)?%)$",
            "description": "Memory kept free for the CUDA context: '1Gi' or '5%'.",
        },
        "pools": {"type": "array", "minItems": 1, "items": _POOL},
        "tolerations": {"type": "array", "items": _TOLERATION},
        "frameworks": _object(
            {
                "allContainers": {
                    "type": "boolean",
                    "description": "Framework env into the GPU container whatever its image "
                    "(default: only images of that framework).",
                },
                "tensorflow": _framework({"allowGrowth": {"type": "boolean"}}),
                "jax": _framework(
                    {
                        "memoryFraction": {"type": "boolean"},
                        "preallocate": {"type": "boolean"},
                    }
                ),
                "pytorch": _framework({"memoryFraction": {"type": "boolean"}}),
            }
        ),
        "inferenceServers": _object(
            {
                "memory": {
                    "enum": ["warn", "set", "ignore"],
                    "description": "vLLM --gpu-memory-utilization / SGLang "
                    "--mem-fraction-static above the share: warn (default), set it to the "
                    "share, or ignore.",
                },
                "vllmImages": {**_GLOBS, "description": "Images whose entrypoint is vLLM."},
                "sglangImages": {**_GLOBS, "description": "Images whose entrypoint is SGLang."},
            }
        ),
        "mps": _object(
            {
                "enforceThreadPercentage": {"type": "boolean"},
                "enforceMemoryLimit": {"type": "boolean"},
                "threadOverprovision": {"type": "number", "minimum": 1, "maximum": 4},
            }
        ),
        "mpsDaemon": _object(
            {
                "pipeDirectory": {"type": "string", "pattern": "^/"},
                "logDirectory": {"type": "string", "pattern": "^/"},
                "readyLabel": {"type": "string", "minLength": 1},
                "hostIPC": {"type": "boolean"},
                "setExclusiveProcess": {"type": "boolean"},
            }
        ),
        "dra": _DRA,
        **SCHEME_SCHEMA,
        "inject": _object(
            {
                "env": {
                    "type": "array",
                    "items": _object(
                        {
                            "name": {"type": "string", "pattern": r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"},
                            "value": {"type": "string"},
                        },
                        required=["name", "value"],
                    ),
                },
                "labels": _LABEL_MAP,
                "annotations": _LABEL_MAP,
            }
        ),
        "quota": QUOTA_SCHEMA,
        "enforcement": ENFORCEMENT_SCHEMA,
        "directResourceRequests": {
            "enum": ["allow", "deny"],
            "description": "Whether pods may ask for the shared resource without the annotation.",
        },
    },
    required=["mode"],
)
# The device plugin's modes share GPUs through pools; the dra mode has none.
_POLICY_SPEC["allOf"] = [
    {
        "if": {"properties": {"mode": {"enum": ["time-slicing", "mps", "mps-daemon"]}}},
        "then": {"required": ["pools"]},
    }
]

_METADATA = _object({"name": _NAME}, required=["name"])

POLICY_SCHEMA: dict[str, Any] = _object(
    {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": POLICY_KIND},
        "metadata": _METADATA,
        "spec": _POLICY_SPEC,
    },
    required=["apiVersion", "kind", "metadata", "spec"],
)

_PATH = {"type": "string", "pattern": r"^[A-Za-z0-9_$-]+((\.[A-Za-z0-9_$-]+)|\[\*\]|\.\*)*$"}
_TEMPLATE_SITE = _object(
    {
        "path": {**_PATH, "description": "Where the template sits: spec.groups[*].template"},
        "shape": {"enum": ["PodTemplateSpec", "PodSpec"]},
        "role": {"type": "string", "maxLength": 63},
        "itemName": {"type": "string", "maxLength": 63},
        "pods": {"type": "string", "maxLength": 256},
        "atLeast": _PATH,
        "atMost": _PATH,
        "when": _PATH,
        "unless": _PATH,
        "ownerMetadata": {"type": "boolean"},
        "metadataFrom": _PATH,
        "note": {"type": "string", "maxLength": 256},
        "pod": _object(
            {
                "generateName": {"type": "string", "maxLength": 253},
                "labels": _LABEL_MAP,
                "annotations": _LABEL_MAP,
            }
        ),
    },
    required=["path"],
)
_WORKLOAD_KIND = _object(
    {
        "apiVersion": {"type": "string", "pattern": r"^[a-z0-9.-]+\.[a-z0-9.-]+/v[a-z0-9]+$"},
        "otherVersions": {"type": "array", "items": {"type": "string", "pattern": "^v[a-z0-9]+$"}},
        "kind": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$", "maxLength": 63},
        "resource": {"type": "string", "pattern": "^[a-z][a-z0-9]*$", "maxLength": 63},
        "scope": {"enum": ["Namespaced", "Cluster"]},
        "gpusAcrossTemplates": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 256},
        "templates": {"type": "array", "items": _TEMPLATE_SITE, "minItems": 1, "maxItems": 16},
    },
    required=["apiVersion", "kind", "resource", "templates"],
)

SETTINGS_SCHEMA: dict[str, Any] = _object(
    {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": SETTINGS_KIND},
        "metadata": _METADATA,
        "spec": _object(
            {
                "excludeNamespaces": _GLOBS,
                "workloadKinds": {
                    "type": "array",
                    "items": _WORKLOAD_KIND,
                    "maxItems": 64,
                    "description": "Your own kinds that carry pod templates (docs/workloads.md).",
                },
            }
        ),
    },
    required=["apiVersion", "kind", "metadata", "spec"],
)


def document_schema() -> dict[str, Any]:
    """The schema editors use for one YAML document (a policy or the settings)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://gpushare.io/schemas/v1alpha1/policy.json",
        "title": "gpushare policy document",
        "oneOf": [POLICY_SCHEMA, SETTINGS_SCHEMA],
    }
