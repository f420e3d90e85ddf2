"""The MutatingAdmissionPolicy (admissionregistration.k8s.io/v1) of one gpushare policy, and
its binding.

One JSONPatch mutation builds, from ``plan.PlanCel``'s variables, the ops the webhook's
patch would make: the GPU resource in limits and requests, the nodeSelector (JSONPatch:
``pod.spec.nodeSelector`` is atomic, so ApplyConfiguration would replace it whole), the node
affinity of an ask sized by the nodes' GPU memory, env (appended when absent, enforced
values replaced in place), the MPS daemon's volume, mount and hostIPC, the policy's
injections and the ``gpushare.io/applied`` record. A pod with problems gets no op: the
validating policy denies it.

JSONPatch ``add`` needs the parent to exist, so each op adds the whole missing map or list
where the pod has none. Every op writes the planned value, and env or list items are added
only when absent, so running again on its own output changes nothing:
``reinvocationPolicy: IfNeeded`` is safe, as for the webhook (the default is Never, for its
cost: ``webhook.compile.REINVOCATION_POLICIES``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from webhook.cel_inlining import fold_variables, specialize
from webhook.compile import cel
from webhook.compile.device_cel import refused_devices, sets_devices, with_device_variables
from webhook.compile.jsonpatch_cel import add_items, add_to_map, escape, literal, op
from webhook.compile.plan import DENIAL_ANNOTATION, PlanCel, V, node_memory_expression, s
from webhook.compile.pod_cel import API_VERSION, DENIAL_LABEL, match_constraints, policy_labels
from webhook.compile.selection import governs
from webhook.compile.validating import (
    annotated,
    asks_by_hand,
    refused_by_hand,
    with_asks_by_hand,
)
from webhook.constants import (
    APPLIED_ANNOTATION,
    MPS_PIPE_DIRECTORY_VAR,
)
from webhook.core import (
    JAX_FRACTION,
    JAX_PREALLOCATE,
    PIPE_VOLUME,
    TF_GROWTH,
    Mode,
    Policy,
    PolicySet,
)

# The usual pod's copies of the plan's variables (``cel_inlining.specialize``).
USUAL_PREFIX = "u_"
_AFFINITY = "/spec/affinity"
_NODE_AFFINITY = f"{_AFFINITY}/nodeAffinity"
_REQUIRED = f"{_NODE_AFFINITY}/requiredDuringSchedulingIgnoredDuringExecution"


class MutatingPolicy:
    """The mutating admission policy of ``policy`` within ``policies``."""

    def __init__(self, policy: Policy, policies: PolicySet, name: str) -> None:
        self.policy = policy
        self.policies = policies
        self.name = name
        self.plan = PlanCel(policy, policies)
        # Variables only the patch uses (lists built once, not at each use).
        self.extra: list[tuple[str, str]] = []

    # -- the ops --------------------------------------------------------------------------

    def _resources(self, resource: str, count: str) -> str:
        """``resource: count`` in the GPU container's limits and requests."""
        container = f"{V}c"
        path = f"{V}cpath + '/resources'"
        both = f"{{{s(resource)}: {count}}}"
        whole_value = f"{{'limits': {both}, 'requests': {both}}}"
        ops = [f"(!has({container}.resources) ? [{op('add', path, whole_value)}] : [])"]
        for section in ("limits", "requests"):
            present = f"has({container}.resources.{section})"
            key_path = f"{path} + {s('/' + section + '/' + escape(resource))}"
            section_path = f"{path} + {s('/' + section)}"
            ops.append(
                f"(!has({container}.resources) ? [] : {present} ? "
                f"[{op('add', key_path, count)}] : [{op('add', section_path, both)}])"
            )
        return " + ".join(ops)

    def _node_selector(self, selector: str) -> str:
        """The pool's labels in ``pod.spec.nodeSelector``, key by key where it exists."""
        key_path = "'/spec/nodeSelector/' + jsonpatch.escapeKey(k)"
        return (
            f"(has(object.spec.nodeSelector) ? {selector}.map(k, "
            f"{op('add', key_path, selector + '[k]')}) : "
            f"[{op('add', s('/spec/nodeSelector'), selector)}])"
        )

    def _env_settings(self) -> list[tuple[str, str, bool, str]]:
        """(name, CEL value, enforced, CEL condition) in the webhook's order: the mode's
        env, the framework knobs, the policy's ``inject.env``."""
        policy = self.policy
        settings = [(name, value, True, when) for name, value, when in self.plan.limit_env()]
        if policy.mode is Mode.MPS_DAEMON:
            pipe = s(policy.mps_daemon.pipe_directory)
            settings.append((MPS_PIPE_DIRECTORY_VAR, pipe, True, "true"))
        knobs = f"!({V}jf && {V}sh <= 0)"
        settings.append((TF_GROWTH.name, "'true'", False, f"{knobs} && {V}tfin"))
        share = cel.format_ten_thousandths(f"({V}sh * 10)")
        settings.append((JAX_FRACTION.name, share, False, f"{knobs} && {V}jfin"))
        preallocate = policy.frameworks.jax.preallocate
        if preallocate is not None:
            settings.append(
                (JAX_PREALLOCATE.name, s(str(preallocate).lower()), False, f"{knobs} && {V}jpin")
            )
        return settings

    def _env(self, shared: bool, variable: str) -> str:
        settings = self._env_settings() if shared else []
        settings += [(name, s(value), False, "true") for name, value in self.policy.inject.env]
        if not settings:
            return "[]"
        env = f"{V}c.env"
        appended = " + ".join(
            f"({condition} && !({s(name)} in {V}envn) ? "
            f"[{{'name': {s(name)}, 'value': {value}}}] : [])"
            for name, value, _, condition in settings
        )
        self.extra.append((variable, appended))
        ops = [add_items(f"{V}cpath + '/env'", f"has({env})", f"{V}{variable}")]
        for name, value, enforced, condition in settings:
            if not enforced:
                continue
            wanted = f"{{'name': {s(name)}, 'value': {value}}}"
            stale = (
                f"{env}[j].name == {s(name)} && !(has({env}[j].value) && "
                f"{env}[j].value == {value} && !has({env}[j].valueFrom))"
            )
            item_path = f"{V}cpath + '/env/' + string(j)"
            ops.append(
                f"({condition} && has({env}) ? lists.range(size({env})).filter(j, {stale})"
                f".map(j, {op('replace', item_path, wanted)}) : [])"
            )
        return " + ".join(ops)

    def _affinity(self) -> str:
        """``mode_edits.require_gpu_memory``: the requirement in every node selector term."""
        self.extra.append(("nexp", node_memory_expression()))
        expression = f"{V}nexp"
        terms = "[{'matchExpressions': [" + expression + "]}]"
        spec = "object.spec"
        required = f"{spec}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        term = f"{required}.nodeSelectorTerms[i]"
        present = (
            f"has({term}.matchExpressions) && {term}.matchExpressions.exists(e, "
            f"e.key == 'nvidia.com/gpu.memory' && e.operator == 'Gt' && "
            f"e.values == [string({V}nm - 1)])"
        )
        expressions_path = (
            f"{s(_REQUIRED + '/nodeSelectorTerms/')} + string(i) + '/matchExpressions'"
        )
        append = " + '/-'"
        each_term = (
            f"lists.range(size({required}.nodeSelectorTerms)).filter(i, !({present}))"
            f".map(i, has({term}.matchExpressions) ? "
            f"{op('add', expressions_path + append, expression)} : "
            f"{op('add', expressions_path, '[' + expression + ']')})"
        )
        required_value = "{'nodeSelectorTerms': " + terms + "}"
        node_value = "{'requiredDuringSchedulingIgnoredDuringExecution': " + required_value + "}"
        return (
            f"(!{V}bn ? [] : !has({spec}.affinity) ? "
            f"[{op('add', s(_AFFINITY), '{' + s('nodeAffinity') + ': ' + node_value + '}')}] : "
            f"!has({spec}.affinity.nodeAffinity) ? [{op('add', s(_NODE_AFFINITY), node_value)}] : "
            f"!has({required}) ? [{op('add', s(_REQUIRED), required_value)}] : "
            f"size({required}.nodeSelectorTerms) == 0 ? "
            f"[{op('add', s(_REQUIRED + '/nodeSelectorTerms'), terms)}] : {each_term})"
        )

    def _mps_daemon(self) -> str:
        policy = self.policy
        if policy.mode is not Mode.MPS_DAEMON:
            return "[]"
        pipe = policy.mps_daemon.pipe_directory
        volume = literal({"name": PIPE_VOLUME, "hostPath": {"path": pipe, "type": "Directory"}})
        mount = literal({"name": PIPE_VOLUME, "mountPath": pipe})
        volumes = "object.spec.volumes"
        has_volume = f"has({volumes}) && {volumes}.exists(v, v.name == {s(PIPE_VOLUME)})"
        add_volume = add_items(s("/spec/volumes"), f"has({volumes})", f"[{volume}]")
        mounts_path = f"{V}cpath + '/volumeMounts'"
        add_mount = add_items(mounts_path, f"has({V}c.volumeMounts)", f"[{mount}]")
        ops = [
            f"({has_volume} ? [] : {add_volume})",
            f"({V}mount_same ? [] : {add_mount})",
        ]
        if policy.mps_daemon.host_ipc:
            ops.append(
                "(has(object.spec.hostIPC) && object.spec.hostIPC ? [] : "
                f"[{op('add', s('/spec/hostIPC'), 'true')}])"
            )
        return " + ".join(ops)

    def _injections(self) -> str:
        inject = self.policy.inject
        ops: list[str] = []
        if inject.labels:
            labels = literal(dict(inject.labels))
            key_path = "'/metadata/labels/' + jsonpatch.escapeKey(k)"
            ops.append(
                f"(has(object.metadata.labels) ? {labels}.map(k, "
                f"{op('add', key_path, labels + '[k]')}) : "
                f"[{op('add', s('/metadata/labels'), labels)}])"
            )
        for key, value in inject.annotations.items():
            ops.append(f"[{op('add', s('/metadata/annotations/' + escape(key)), s(value))}]")
        if inject.tolerations:
            missing = " + ".join(
                f"({self._has_toleration(t)} ? [] : [{literal(dict(t))}])"
                for t in inject.tolerations
            )
            self.extra.append(("tols", missing))
            ops.append(
                add_items(s("/spec/tolerations"), "has(object.spec.tolerations)", f"{V}tols")
            )
        return " + ".join(ops) if ops else "[]"

    @staticmethod
    def _has_toleration(toleration: Mapping[str, Any]) -> str:
        """The pod already holds exactly ``toleration`` (the webhook compares dicts)."""
        checks = []
        for field in ("key", "operator", "value", "effect", "tolerationSeconds"):
            if field in toleration:
                checks.append(f"has(t.{field}) && t.{field} == {literal(toleration[field])}")
            else:
                checks.append(f"!has(t.{field})")
        return (
            "has(object.spec.tolerations) && object.spec.tolerations.exists(t, "
            + " && ".join(checks)
            + ")"
        )

    def _record(self, whole: bool) -> str:
        """The ``gpushare.io/applied`` JSON, keys sorted and compact as orjson writes it."""
        policy = self.policy
        head = '\'{"container":"\' + ' + f"{V}c.name + "
        tail_fields = (
            f'"policy":{json.dumps(policy.name)},"policyVersion":{json.dumps(policy.version)},'
        )
        if whole:
            whole_gpus = policy.whole_gpus
            return (
                head
                + '\'","gpus":\' + string(int('
                + f"{V}f)) + "
                + s(',"mode":"whole-gpu",' + tail_fields)
                + " + "
                + s(f'"resource":{json.dumps(whole_gpus.resource_name)}}}')
            )
        pools = cel.strings(p.name for p in self.policy.pools)
        return (
            head
            + '\'","fraction":"\' + '
            + f"{V}ff + "
            + s(f'","mode":{json.dumps(policy.mode.value)},')
            + f" + ({V}bn ? '\"nodeGpuMemory\":\"' + string({V}nm) + 'Mi\",' : '') + "
            + s(tail_fields + '"pool":"')
            + f" + {pools}[{V}pi] + "
            + s(f'","resource":{json.dumps(policy.resource_name)},"slots":')
            + f" + string({V}slots) + '}}'"
        )

    def patch(self) -> str:
        """The JSONPatch expression: no op for a pod with problems."""
        policy = self.policy
        whole = policy.whole_gpus
        record = s("/metadata/annotations/" + escape(APPLIED_ANNOTATION))
        self.extra.clear()
        selectors = "[" + ", ".join(literal(m) for m in self.plan.pool_selectors()) + "]"
        self.extra.append(("sel", f"{selectors}[{V}pi]"))
        shared = " + ".join(
            [
                self._resources(policy.resource_name, f"string({V}slots)"),
                self._node_selector(f"{V}sel"),
                self._affinity(),
                self._env(shared=True, variable="envadd"),
                self._mps_daemon(),
                self._injections(),
                f"[{op('add', record, self._record(whole=False))}]",
            ]
        )
        whole_ops = [self._resources(whole.resource_name, f"string(int({V}f))")]
        if whole.node_selector:
            whole_ops.append(self._node_selector(literal(dict(whole.node_selector))))
        whole_env = self._env(shared=False, variable="envaddw")
        whole_ops += [
            whole_env,
            self._injections(),
            f"[{op('add', record, self._record(whole=True))}]",
        ]
        denial = s("/metadata/annotations/" + escape(DENIAL_ANNOTATION))
        reasons = f"{V}bad.size() > 0 ? '422 ' + {V}bad.join(' ') : '403 ' + {V}problems.join(' ')"
        stale = f"({s(DENIAL_ANNOTATION)} in {V}a ? [{op('remove', denial)}] : [])"
        marked = add_to_map(
            "/metadata/labels", "has(object.metadata.labels)", DENIAL_LABEL, "'true'"
        )
        general = (
            f"{V}bad.size() > 0 || {V}problems.size() > 0 ? "
            f"[{op('add', denial, reasons)}] + {marked} : "
            f"{stale} + ({V}whole ? {' + '.join(whole_ops)} : {shared})"
        )
        common = self.plan.common
        if common is not None:
            # The usual pod: its share decided at compile time, the plan's known values
            # read inline, only what the pod still decides evaluated as variables.
            (condition, ops), usual = specialize(
                [self.plan.fast_path, f"{stale} + {shared}"],
                [*self.plan.variables, *self.extra],
                common.facts,
                USUAL_PREFIX,
            )
            self.extra += usual
            general = f"{common.guard} && {condition} ? {ops} : ({general})"
        if asks_by_hand(policy) is not None:
            # Matched without the annotations: the pod asks for the shared resource by hand.
            general = f"!({annotated()}) ? {refused_by_hand(policy)} + {marked} : ({general})"
        devices = sets_devices(policy)
        if devices is None:
            return general
        # Device variables set by hand: refused first, annotated or not (as the webhook).
        return f"{devices} ? {refused_devices(policy)} + {marked} : ({general})"

    # -- the documents --------------------------------------------------------------------

    def documents(
        self,
        match_conditions: list[dict[str, str]],
        namespace_selector: dict[str, Any],
        reinvocation: str,
    ) -> list[dict[str, Any]]:
        policy = self.policy
        conditions = [
            *match_conditions,
            {"name": "governed-by-policy", "expression": governs(policy, self.policies)},
        ]
        conditions = with_device_variables(policy, with_asks_by_hand(policy, conditions))
        # Joined into one, named after the first: the apiserver evaluates every
        # matchCondition of a policy for every pod create, each a program of its own, also
        # after one has come out false; joined, most pods stop at the first.
        joined = {
            "name": conditions[0]["name"],
            "expression": " && ".join(f"({c['expression']})" for c in conditions),
        }
        spec: dict[str, Any] = {
            "paramKind": None,
            "matchConstraints": match_constraints(),
            "matchConditions": [joined],
            "failurePolicy": "Fail",
            "reinvocationPolicy": reinvocation,
        }
        patch = self.patch()
        variables, (patch,) = fold_variables(
            [*self.plan.variables, *dict(self.extra).items()], [patch]
        )
        spec["mutations"] = [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}]
        spec["variables"] = [{"name": n, "expression": e} for n, e in variables]
        del spec["paramKind"]
        return [
            {
                "apiVersion": API_VERSION,
                "kind": "MutatingAdmissionPolicy",
                "metadata": {"name": self.name, "labels": policy_labels(policy)},
                "spec": spec,
            },
            {
                "apiVersion": API_VERSION,
                "kind": "MutatingAdmissionPolicyBinding",
                "metadata": {"name": self.name, "labels": policy_labels(policy)},
                "spec": {
                    "policyName": self.name,
                    "matchResources": {"namespaceSelector": namespace_selector},
                },
            },
        ]
