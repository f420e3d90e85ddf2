"""One policy's plan as CEL variables: the request read strictly, the container, the pool, the
share, and the denial reasons, in the words and order of ``webhook.core.planning``.

Both compiled policies of a gpushare policy declare these variables: the mutating one builds
its patch from them when ``problems`` is empty, the validating one denies with them when it
is not. Planning a pod the mutating policy already changed finds no problem (the webhook's
idempotence), so the validating policy, which sees the final pod, denies exactly the pods
that were left alone for a reason.

Static parts (pools, bounds, names, messages) are folded in when compiling; per-pool values
are CEL lists indexed by the chosen pool ``variables.pi``. Kubernetes' CEL has no
floor/ceil: ``cel.int_floor``/``cel.ceil_int`` stand in, on the same IEEE doubles the
webhook computes with, so the numbers agree to the last digit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from webhook.compile import cel
from webhook.constants import (
    CONTAINER_ANNOTATION,
    DEVICES_ANNOTATION,
    FRACTION_ANNOTATION,
    GFD_MEMORY_LABEL,
    KNOWN_GPU_RESOURCES,
    MEMORY_ANNOTATION,
    MIG_RESOURCE_PREFIX,
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
from webhook.core.modes.mps_daemon import PIPE_VOLUME
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Allocation, FrameworkImages, Mode, Policy, PolicySet, Pool
from webhook.core.request import MAX_VALUE_LENGTH, MAX_WHOLE_GPUS

V = "variables."
# Where the mutating policy writes why it left a pod alone ("422 ..." or "403 ...", the
# webhook's status code and its reasons); the validating policy denies the pod with it. A
# user cannot get a pod past a policy with it: the mutating policy removes it from every pod
# it mutates and writes it on every pod it refuses; written by hand on a pod no policy
# governs, it only refuses that pod.
DENIAL_ANNOTATION = "gpushare.io/denied"
# Granted shares are at most 1: this marks a pool that cannot take the request.
NO_POOL = "9.0"
# webhook.core.placement._LARGEST_GPU_MEMORY_MIB and _AGREEMENT_TOLERANCE.
LARGEST_GPU_MEMORY_MIB = 2**30
AGREEMENT_TOLERANCE = 0.01
_UNITS = "Ki|Mi|Gi|Ti|k|K|M|G|T"
_ACCEPTED = (
    'use a decimal between 0 and 1 such as "0.5" for a share of one GPU, '
    'or a whole number such as "1" or "2" for whole GPUs.'
)
_MEMORY_FORMS = (
    'a size with a unit such as "10Gi", "512Mi" or "16G", or a whole number of MiB such as "8000"'
)


def s(text: str) -> str:
    return cel.string(text)


def gpu_resource_test(policies: PolicySet, key: str) -> str:
    """``container_resources.is_gpu_resource`` of the CEL string ``key``."""
    names = sorted(KNOWN_GPU_RESOURCES | policies.gpu_resource_names)
    return f"({key} in {cel.strings(names)} || {key}.startsWith({s(MIG_RESOURCE_PREFIX)}))"


class PlanCel:
    """The CEL variables of one policy's plan (``variables``), and the facts mutations use."""

    def __init__(self, policy: Policy, policies: PolicySet) -> None:
        self.policy = policy
        self.policies = policies
        self.pools = policy.pools
        # Pools sized by the nodes' GPU memory label take memory-only asks when no pool with
        # declared memory can (placement._place_by_node_memory).
        unsized = [p for p in self.pools if p.gpu_memory_mib is None]
        self.node_pool: Pool | None = (
            max(unsized, key=lambda p: p.slice_fraction) if unsized else None
        )
        self.node_share = (
            min(self.node_pool.slice_fraction, policy.max_fraction) if self.node_pool else 0.0
        )
        self.variables: list[tuple[str, str]] = []
        self._build()

    def add(self, name: str, expression: str) -> None:
        self.variables.append((name, expression))

    # -- the request ------------------------------------------------------------------

    def _build(self) -> None:
        self._request()
        self._container()
        self._placement()
        self._problems()

    def _request(self) -> None:
        add = self.add
        add("a", "object.metadata.annotations")
        add("hf", f"{s(FRACTION_ANNOTATION)} in {V}a")
        add("ft", f"{V}hf ? {V}a[{s(FRACTION_ANNOTATION)}] : ''")
        add("hm", f"{s(MEMORY_ANNOTATION)} in {V}a")
        add("mt", f"{V}hm ? {V}a[{s(MEMORY_ANNOTATION)}] : ''")
        add("hc", f"{s(CONTAINER_ANNOTATION)} in {V}a")
        add("cn", f"{V}hc ? {V}a[{s(CONTAINER_ANNOTATION)}] : ''")
        decimal = r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)$"
        integral = r"^[0-9]*(\.0+)?$"
        ft = f"{V}ft"
        quoted = f"'\"' + {ft} + '\"'"
        named = f"{s(FRACTION_ANNOTATION + ' ')} + {quoted}"
        too_many = (
            f" asks for more GPUs than any node has: ask for at most {MAX_WHOLE_GPUS} "
            "(and what your policy allows)."
        )
        fraction_problem = (
            f"!{V}hf ? '' : size({ft}) > {MAX_VALUE_LENGTH} ? "
            f"{s(FRACTION_ANNOTATION + ' ')} + {cel.shown(ft)} + "
            f"{s(f' is longer than {MAX_VALUE_LENGTH} characters: {_ACCEPTED}')} : "
            f"!{ft}.matches({s(decimal)}) ? "
            f"{named} + {s(f' is not a plain decimal: {_ACCEPTED}')} : "
            f"double({ft}) == 0.0 ? {named} + {s(f' asks for no GPU: {_ACCEPTED}')} : "
            f"{ft}.matches({s(integral)}) ? "
            f"(double({ft}) > {MAX_WHOLE_GPUS}.0 ? {named} + {s(too_many)} : '') : "
            f"(double({ft}) > 1.0 ? {named} + "
            f"{s(f' is more than one GPU but not a whole number: {_ACCEPTED}')} : '')"
        )
        add("fp", fraction_problem)
        add("fok", f"{V}hf && {V}fp == ''")
        add("whole", f"{V}fok && {ft}.matches({s(integral)})")
        add("f", f"{V}fok ? double({ft}) : 0.0")
        mt = f"{V}mt"
        bare = r"^[0-9]+(\.[0-9]+)?$"
        quantity = rf"^[0-9]+(\.[0-9]+)?({_UNITS})?$"
        # A Kubernetes quantity, read by the apiserver's own quantity library; "16K" is a
        # size to the webhook (webhook.core.quantity) and "16k" to Kubernetes.
        as_quantity = (
            f"quantity({mt}.endsWith('K') ? {mt}.substring(0, size({mt}) - 1) + 'k' : {mt})"
        )
        add(
            "mib",
            f"!{V}hm || size({mt}) > {MAX_VALUE_LENGTH} ? 0.0 : "
            f"{mt}.matches({s(bare)}) ? ({mt}.matches('^[0-9]+$') ? double({mt}) : 0.0) : "
            f"{mt}.matches({s(quantity)}) ? {as_quantity}.asApproximateFloat() / 1048576.0 : 0.0",
        )
        add("mok", f"{V}hm && {V}mib > 0.0")
        mquoted = f"'\"' + {mt} + '\"'"
        memory_problem = (
            f"!{V}hm || {V}mok ? '' : "
            f"size({mt}) <= {MAX_VALUE_LENGTH} && {mt}.matches({s(bare)}) ? "
            f"({mt}.matches('^[0.]*$') ? {s(MEMORY_ANNOTATION + ' ')} + {mquoted} + "
            f"{s(f' asks for no GPU memory: use {_MEMORY_FORMS}.')} : "
            f"{s(MEMORY_ANNOTATION + ' ')} + {mquoted} + "
            + s(
                " has no unit: a number without a unit is MiB and must be whole, such as "
                '"8000" (8000 MiB); for GiB write "'
            )
            + f" + {mt} + "
            + s('Gi".')
            + f") : {s(MEMORY_ANNOTATION + ' ')} + {cel.shown(mt)} + "
            + s(f" is not a memory size: use {_MEMORY_FORMS}.")
        )
        add("mp", memory_problem)
        whole_and_memory = (
            f"{V}whole && {V}hm ? [{s(FRACTION_ANNOTATION + ' ')} + {quoted} + "
            + s(" asks for whole GPUs, which cannot be combined with " + MEMORY_ANNOTATION + " ")
            + f" + {cel.shown(mt)} + {s(': remove one of the two.')}] : []"
        )
        empty_name = (
            f"{V}hc && {V}cn.trim() == '' ? ["
            + s(
                f"{CONTAINER_ANNOTATION} is empty: name one of the pod's containers, or remove "
                "the annotation to use the first container."
            )
            + "] : []"
        )
        add(
            "rp",
            f"[{V}fp, {V}mp].filter(m, m != '') + ({whole_and_memory}) + ({empty_name})",
        )

    def _container(self) -> None:
        add = self.add
        add("names", "object.spec.containers.map(c, c.name)")
        add("ci", f"{V}hc ? {V}names.indexOf({V}cn) : 0")
        names = f"{V}names.join(', ')"
        quoted = f"'\"' + {V}cn + '\"'"
        in_init = (
            f"has(object.spec.initContainers) && "
            f"object.spec.initContainers.exists(c, c.name == {V}cn)"
        )
        add(
            "cp",
            f"{V}ci >= 0 ? [] : {in_init} ? ["
            f"{s(CONTAINER_ANNOTATION + ' ')} + {quoted} + "
            f"{s(' names an init container; GPUs go to app containers: name one of ')} + "
            f"{names} + '.'] : [{s(CONTAINER_ANNOTATION + ' ')} + {quoted} + "
            f"{s(' is not a container of this pod: name one of ')} + {names} + '.']",
        )
        add("c", f"object.spec.containers[{V}ci < 0 ? 0 : {V}ci]")
        add("cpath", f"'/spec/containers/' + string({V}ci)")

    # -- the pool -----------------------------------------------------------------------

    def _pool_fraction(self, pool: Pool) -> str:
        if pool.gpu_memory_mib is None:
            by_memory = "-1.0"
        else:
            by_memory = f"({V}mok ? {V}mib / {cel.double(pool.gpu_memory_mib)} : -1.0)"
        return f"({V}hf ? {V}f : {by_memory})"

    def _slots(self, index: int, pool: Pool) -> str:
        fraction = f"{V}fr[{index}]"
        if self.policy.allocation is Allocation.COUNT:
            raw = cel.ceil_int(f"{fraction} * {cel.double(pool.replicas)} - {cel.EPSILON}")
            return f"({fraction} < 0.0 ? 0 : {raw} <= 1 ? 1 : {raw} <= {pool.replicas} ? {raw} : 0)"
        return (
            f"({fraction} >= 0.0 && {cel.double(pool.slice_fraction)} + {cel.EPSILON} >= "
            f"{fraction} ? 1 : 0)"
        )

    def _placement(self) -> None:
        add, policy = self.add, self.policy
        add("fr", "[" + ", ".join(self._pool_fraction(p) for p in self.pools) + "]")
        add("sl", "[" + ", ".join(self._slots(i, p) for i, p in enumerate(self.pools)) + "]")
        add(
            "gr",
            "["
            + ", ".join(
                f"({V}sl[{i}] > 0 ? double({V}sl[{i}]) / {cel.double(p.replicas)} : {NO_POOL})"
                for i, p in enumerate(self.pools)
            )
            + "]",
        )
        low, high = cel.double(policy.min_fraction), cel.double(policy.max_fraction)
        add(
            "gw",
            "["
            + ", ".join(
                f"({V}sl[{i}] > 0 && {V}fr[{i}] + {cel.EPSILON} >= {low} && "
                f"{V}fr[{i}] <= {high} + {cel.EPSILON} ? {V}gr[{i}] : {NO_POOL})"
                for i in range(len(self.pools))
            )
            + "]",
        )
        within = f"{V}gw.exists(g, g < {NO_POOL})"
        if self.node_pool is not None:
            add("bn", f"!{V}hf && {V}mok && !{within}")
        else:
            add("bn", "false")
        node_index = self.pools.index(self.node_pool) if self.node_pool else 0
        add(
            "pi",
            f"{V}bn ? {node_index} : {within} ? {V}gw.indexOf({V}gw.min()) : "
            f"{V}gr.indexOf({V}gr.min())",
        )
        add("none", f"!{V}bn && !{V}gr.exists(g, g < {NO_POOL})")
        share = cel.double(self.node_share)
        add("fx", f"{V}bn ? {share} : {V}none ? 0.0 : {V}fr[{V}pi]")
        add(
            "nm",
            f"{V}bn ? {cel.ceil_int(f'{V}mib / {share} - {cel.EPSILON}')} : 0",
        )
        add("slots", f"{V}bn ? 1 : {V}none ? 0 : {V}sl[{V}pi]")
        add("ff", cel.format_fraction(f"{V}fx"))

    def _asked(self) -> str:
        """``placement._asked``: which annotation asked, and the share it came to."""
        names = cel.strings(p.name for p in self.pools)
        return (
            f"({V}hf ? {s(FRACTION_ANNOTATION + ' ')} + '\"' + {V}ft + '\"' : "
            f"{s(MEMORY_ANNOTATION + ' ')} + '\"' + {V}mt + '\" (' + {V}ff + "
            f"' of a GPU in pool ' + {cel.python_repr(names + f'[{V}pi]')} + ')')"
        )

    def _placement_problems(self) -> str:
        policy = self.policy
        largest = max(policy.pools, key=lambda p: p.slice_fraction)
        offer = (
            f"the largest slice policy {policy.name!r} offers is 1/{largest.replicas} of a GPU "
            f"(pool {largest.name!r})"
        )
        if policy.allocation is Allocation.COUNT:
            offer = f"no pool of policy {policy.name!r} has that much of one GPU"
        asked_plain = (
            f"({V}hf ? {s(FRACTION_ANNOTATION + ' ')} + '\"' + {V}ft + '\"' : "
            f"{s(MEMORY_ANNOTATION + ' ')} + '\"' + {V}mt + '\"')"
        )
        nothing = (
            f"[{asked_plain} + "
            + s(
                f" does not fit any GPU pool: {offer}. Ask for less, or for a whole GPU "
                f'with {FRACTION_ANNOTATION}: "1".'
            )
            + "]"
        )
        too_big = (
            f"[{s(MEMORY_ANNOTATION + ' ')} + '\"' + {V}mt + '\"' + "
            + s(
                " is more than any GPU has: ask for less, or for whole GPUs with "
                f'{FRACTION_ANNOTATION}: "1".'
            )
            + "]"
        )
        low, high = policy.min_fraction, policy.max_fraction
        bounds = (
            f"({V}fx + {cel.EPSILON} < {cel.double(low)} ? [{self._asked()} + "
            + s(
                f" is below the smallest share policy {policy.name!r} "
                f"allows ({format_fraction(low)}): ask for at least that much."
            )
            + f"] : {V}fx > {cel.double(high)} + {cel.EPSILON} ? [{self._asked()} + "
            + s(
                f" is above the largest share policy {policy.name!r} "
                f"allows ({format_fraction(high)}): ask for less, or for whole GPUs."
            )
            + "] : [])"
        )
        return (
            f"{V}none ? {nothing} : {V}bn ? ({V}nm > {LARGEST_GPU_MEMORY_MIB} ? {too_big} : []) : "
            f"{bounds} + {self._agreement()}"
        )

    def _agreement(self) -> str:
        """``placement._agreement_problems``, pool by pool (their memory is static)."""
        branches = []
        for index, pool in enumerate(self.pools):
            both = f"'\"' + {V}ft + '\"' + ' and {MEMORY_ANNOTATION} \"' + {V}mt + '\"'"
            if pool.gpu_memory_mib is None:
                text = (
                    f"[{s(FRACTION_ANNOTATION + ' ')} + {both} + "
                    + s(
                        f" cannot be checked against each other: pool {pool.name!r} "
                        "declares no GPU memory. Keep only one of the two annotations."
                    )
                    + "]"
                )
            else:
                memory = cel.double(pool.gpu_memory_mib)
                implied = f"({V}f * {memory})"
                gap = f"({implied} > {V}mib ? {implied} - {V}mib : {V}mib - {implied})"
                text = (
                    f"({gap} > {cel.double(AGREEMENT_TOLERANCE)} * {V}mib ? ["
                    f"{s(FRACTION_ANNOTATION + ' ')} + '\"' + {V}ft + '\" means ' + "
                    f"string(int({implied})) + "
                    + s(
                        f"Mi on pool {pool.name!r} ({pool.gpu_memory_mib}Mi per GPU), but "
                        f"{MEMORY_ANNOTATION} says "
                    )
                    + f" + '\"' + {V}mt + '\"' + "
                    + f"{s(': keep only one of the two annotations.')}] : [])"
                )
            branches.append((index, text))
        chain = "[]"
        for index, text in reversed(branches):
            chain = f"({V}pi == {index} ? {text} : {chain})"
        return f"({V}hf && {V}mok ? {chain} : [])"

    # -- what else is wrong -----------------------------------------------------------

    def _other_asks(self) -> str:
        """``container_resources.refuse_other_gpu_asks``."""
        annotation = f"({V}hf ? {s(FRACTION_ANNOTATION)} : {s(MEMORY_ANNOTATION)})"
        lists = (
            ("containers", "container"),
            ("initContainers", "init container"),
            ("ephemeralContainers", "ephemeral container"),
        )
        parts = []
        for field, kind in lists:
            kind_text = s(kind)
            if field == "initContainers":
                kind_text = (
                    "(has(x.restartPolicy) && x.restartPolicy == 'Always' ? "
                    "'sidecar container (init container with restartPolicy Always)' : "
                    f"{s(kind)})"
                )
            if field == "containers":
                fix = (
                    "'remove it there; if ' + "
                    + cel.python_repr("x.name")
                    + " + ' is the container that needs the GPU, name it in "
                    + CONTAINER_ANNOTATION
                    + " instead (one container per pod gets the GPU)'"
                )
            else:
                fix = (
                    "'remove it there: the pod would need ' + k + ' besides the GPU the "
                    "annotation gives, and no node of a sharing pool offers both'"
                )

            def message(asks: str, section: str, kind_text: str = kind_text, fix: str = fix) -> str:
                return (
                    f"{kind_text} + ' ' + {cel.python_repr('x.name')} + ' asks for ' + k + ': ' + "
                    f"string({asks}[k]) + ' in resources.{section} next to the ' + "
                    f"{annotation} + ' annotation, which gives container ' + "
                    f"{cel.python_repr(f'{V}c.name')} + ' the GPU: ' + {fix} + "
                    "'; or remove the annotation and ask for whole GPUs by hand.'"
                )

            per_container = self._asks_in("x", message, lambda section, asks: "true")
            entries = f"object.spec.{field}"
            if field == "containers":
                selected = (
                    f"lists.range(size({entries})).filter(i, i != {V}ci).map(i, {entries}[i])"
                )
            else:
                selected = f"(has({entries}) ? {entries} : [])"
            parts.append(f"{selected}.map(x, {per_container}).filter(t, t != '')")
        return " + ".join(parts)

    def _asks_in(
        self,
        container: str,
        message: Callable[[str, str], str],
        keep: Callable[[str, str], str],
    ) -> str:
        """The messages (joined by spaces) of each GPU resource ``container`` asks for in
        limits then requests, keys sorted as the apiserver serializes them; a request the
        apiserver copied from the same limit is the same ask, said once."""
        sections = []
        for section in ("limits", "requests"):
            asks = f"{container}.resources.{section}"
            condition = f"{gpu_resource_test(self.policies, 'k')} && {keep(section, asks)}"
            if section == "requests":
                limits = f"{container}.resources.limits"
                condition += (
                    f" && !(has({limits}) && k in {limits} && "
                    f"string({limits}[k]) == string({asks}[k]))"
                )
            sections.append(
                f"(has({container}.resources) && has({asks}) ? "
                f"{asks}.map(k, k).sort().filter(k, {condition})"
                f".map(k, {message(asks, section)}).join(' ') : '')"
            )
        return f"[{', '.join(sections)}].filter(t, t != '').join(' ')"

    def _own_asks(self, resource: str, count: str) -> str:
        """``container_resources.set_gpu_resource``'s problems for ``resource``: ``count``."""

        def message(asks: str, section: str) -> str:
            return (
                f"'container ' + {cel.python_repr(f'{V}c.name')} + ' already asks for ' + k + "
                f"': ' + string({asks}[k]) + ' in resources.{section}; remove it and let the "
                f"{FRACTION_ANNOTATION} annotation decide, or remove the annotation.'"
            )

        def keep(section: str, asks: str) -> str:
            return f"(k != {s(resource)} || string({asks}[k]) != {count})"

        text = self._asks_in(f"{V}c", message, keep)
        return f"[{text}].filter(t, t != '')"

    def _node_conflicts(self, selector: Mapping[str, str]) -> str:
        ns = "object.spec.nodeSelector"
        parts = [
            f"(has({ns}) && {s(k)} in {ns} && {ns}[{s(k)}] != {s(v)} ? ["
            f"'nodeSelector {k}=' + {ns}[{s(k)}] + "
            + s(
                f" conflicts with {k}={v} that the GPU pool chosen by policy "
                f"{self.policy.name!r} needs: remove it from the pod."
            )
            + "] : [])"
            for k, v in selector.items()
        ]
        return " + ".join(parts) if parts else "[]"

    def pool_selectors(self) -> list[dict[str, str]]:
        """What the mode selects for each pool (static)."""
        from webhook.core.modes import mode_changes

        selectors = []
        for pool in self.pools:
            placement = Placement(pool, 1, pool.slice_fraction)
            selectors.append(dict(mode_changes(self.policy, placement).node_selector))
        return selectors

    def _shared_node_conflicts(self) -> str:
        chain = "[]"
        for index, selector in reversed(list(enumerate(self.pool_selectors()))):
            chain = f"({V}pi == {index} ? {self._node_conflicts(selector)} : {chain})"
        return chain

    def _volume_problems(self) -> str:
        policy = self.policy
        if policy.mode is not Mode.MPS_DAEMON:
            return "[]"
        pipe = policy.mps_daemon.pipe_directory
        volumes = "object.spec.volumes"
        same = (
            f"v.name == {s(PIPE_VOLUME)} && has(v.hostPath) && v.hostPath.path == {s(pipe)} "
            "&& has(v.hostPath.type) && v.hostPath.type == 'Directory'"
        )
        volume = (
            f"(has({volumes}) && {volumes}.exists(v, v.name == {s(PIPE_VOLUME)}) && "
            f"!{volumes}.exists(v, {same}) ? ["
            + s(
                f"the pod already has a volume named {PIPE_VOLUME!r} that differs from "
                "the one the MPS daemon needs: rename it."
            )
            + "] : [])"
        )
        mount = (
            f"(!{V}mount_same && has({V}c.volumeMounts) && "
            f"{V}c.volumeMounts.exists(m, m.mountPath == {s(pipe)}) ? ["
            f"'container ' + {cel.python_repr(f'{V}c.name')} + "
            + s(
                f" already mounts something at {pipe}, where the MPS pipe directory must go: "
                "move it."
            )
            + "] : [])"
        )
        return f"{volume} + {mount}"

    def _problems(self) -> None:
        add, policy = self.add, self.policy
        if policy.mode is Mode.MPS_DAEMON:
            pipe = policy.mps_daemon.pipe_directory
            add(
                "mount_same",
                f"has({V}c.volumeMounts) && {V}c.volumeMounts.exists(m, m.name == "
                f"{s(PIPE_VOLUME)} && m.mountPath == {s(pipe)} && !has(m.readOnly) && "
                "!has(m.subPath) && !has(m.subPathExpr) && !has(m.mountPropagation) && "
                "!has(m.recursiveReadOnly))",
            )
        # Request problems and a bad container name are 422s, alone (planning.plan_pod).
        add(
            "bad",
            f"{s(DEVICES_ANNOTATION)} in {V}a ? [{s(DEVICES_REFUSAL)}] : "
            f"{V}rp.size() > 0 ? {V}rp : {V}cp",
        )
        add("other", self._other_asks())
        whole = policy.whole_gpus
        limit = "no whole GPUs" if whole.max == 0 else f"at most {whole.max} whole GPUs"
        whole_problems = (
            f"{V}other + (int({V}f) > {whole.max} ? [{s(FRACTION_ANNOTATION + ' ')} + "
            f"'\"' + {V}ft + '\" asks for ' + string(int({V}f)) + "
            + s(
                f" whole GPUs, but policy {policy.name!r} allows {limit}: ask for fewer, "
                "or for a share below 1."
            )
            + f"] : []) + {self._own_asks(whole.resource_name, f'string(int({V}f))')} + "
            f"{self._node_conflicts(whole.node_selector)}"
        )
        self.framework_problem = (
            f"({V}jf && {V}sh <= 0 ? ['A share of ' + {V}ff + "
            + s(
                f" leaves no memory once policy {policy.name!r} keeps its headroom for the "
                "CUDA context: ask for more."
            )
            + "] : [])"
        )
        self._frameworks()
        shared_problems = (
            f"{V}other + {self._own_asks(policy.resource_name, f'string({V}slots)')} + "
            f"{self.framework_problem} + {self._shared_node_conflicts()} + "
            f"{self._volume_problems()}"
        )
        add("pp", f"{V}whole ? [] : {self._placement_problems()}")
        add(
            "problems",
            f"{V}bad.size() > 0 ? [] : {V}whole ? {whole_problems} : "
            f"{V}pp.size() > 0 ? {V}pp : {shared_problems}",
        )

    # -- framework knobs ----------------------------------------------------------------

    def _frameworks(self) -> None:
        """Image facts, which knobs go in (``frameworks._goes_in``), and the share."""
        add, policy = self.add, self.policy
        add("img", f"has({V}c.image) ? {V}c.image : ''")
        registry = r"^(docker\.io|index\.docker\.io|registry-1\.docker\.io)/"
        add(
            "norm0",
            f"{V}img.matches({s(registry)}) ? {V}img.substring({V}img.indexOf('/') + 1) : {V}img",
        )
        add(
            "norm",
            f"{V}norm0.startsWith('library/') ? {V}norm0.substring(8) : {V}norm0",
        )
        add("ref", f"{V}norm.split('@')[0]")
        add(
            "tag0",
            f"{V}ref.lastIndexOf(':') < 0 ? '' : {V}ref.substring({V}ref.lastIndexOf(':') + 1)",
        )
        add("tag", f"{V}tag0.contains('/') ? '' : {V}tag0")
        add(
            "repo",
            f"{V}tag == '' ? {V}ref : {V}ref.substring(0, {V}ref.lastIndexOf(':'))",
        )
        add("pinned", f"{V}repo + ':' + {V}tag")
        add("envn", f"has({V}c.env) ? {V}c.env.map(e, e.name) : []")
        frameworks = policy.frameworks
        tf, jax = frameworks.tensorflow, frameworks.jax
        add("tfin", self._goes_in(TF_GROWTH, tf) if tf.allow_growth else "false")
        jax_in = self._goes_in(JAX_FRACTION, jax) if jax.memory_fraction else "false"
        add("jf", jax_in)
        add(
            "jfin",
            f"{V}jf && !({s(JAX_NEW_FRACTION_VAR)} in {V}envn)",
        )
        add(
            "jpin",
            self._goes_in(JAX_PREALLOCATE, jax) if jax.preallocate is not None else "false",
        )
        headrooms = []
        for pool in self.pools:
            headroom = policy.headroom.as_fraction(pool.gpu_memory_mib)
            headrooms.append(cel.double(headroom or 0.0))
        add(
            "sh",
            f"int(({V}fx - [{', '.join(headrooms)}][{V}pi]) * 1000.0 + {cel.EPSILON})",
        )

    def _goes_in(self, knob: Knob, section: FrameworkImages) -> str:
        framework = knob.framework
        globs = DEFAULT_IMAGES[framework] if section.images is None else section.images
        regex = s(cel.globs_regex(globs))
        matched = (
            f"({V}img.matches({regex}) || {V}norm.matches({regex}) || {V}pinned.matches({regex}))"
        )
        if self.policy.frameworks.all_containers:
            matched = "true"
        # Declared versions come first (framework_images.image_version): static answers.
        decision = self._tag_decision(knob)
        for glob, text in reversed(section.versions):
            version = parse_version(text)
            verdict = "true" if version is None or version >= knob.since else "false"
            if version is None and knob.breaks_older:
                verdict = "false"
            pattern = s(cel.glob_regex(glob))
            declared = (
                f"({V}img.matches({pattern}) || {V}norm.matches({pattern}) || "
                f"{V}pinned.matches({pattern}))"
            )
            decision = f"({declared} ? {verdict} : {decision})"
        return f"{matched} && {decision}"

    def _tag_decision(self, knob: Knob) -> str:
        """Whether a version read from the tag lets the knob in; only TensorFlow's official
        image carries one among the knobs compiled (JAX images do not, and the PyTorch key is
        refused)."""
        if knob.framework == TENSORFLOW:
            sample = image_version(TENSORFLOW, "tensorflow/tensorflow:1.0.0")
            assert sample.version is not None  # the official repository reads tags
            below = s(cel.version_below_regex(knob.since))
            return f"!({V}repo == 'tensorflow/tensorflow' && {V}tag.matches({below}))"
        assert knob.framework == JAX
        return "true"


# The gpu-fraction-num-devices annotation (a share on several GPUs) is not compiled; pods
# carrying it are refused with this sentence.
DEVICES_REFUSAL = (
    f"{DEVICES_ANNOTATION} is not supported by gpushare's compiled admission policies: "
    "remove it, or ask the cluster admin for the gpushare webhook."
)


def node_memory_expression() -> str:
    """The node affinity requirement of a memory ask sized by the nodes' GPU memory."""
    return (
        f"{{'key': dyn({s(GFD_MEMORY_LABEL)}), 'operator': dyn('Gt'), "
        f"'values': dyn([string({V}nm - 1)])}}"
    )
