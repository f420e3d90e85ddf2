"""One policy's plan as CEL variables: the request read strictly, the container, the pool, the
share, and the denial reasons, in the words and order of ``webhook.core.planning``.

The mutating policy declares these variables and builds its patch from them when ``bad``
and ``problems`` are empty, or writes them into ``gpushare.io/denied`` for the validating
policy. Planning a pod the mutating policy already changed finds no problem (the webhook's
idempotence), so reinvocation changes nothing. The parts live beside this module:
``request_cel`` (annotations, container), ``asks_cel`` (other problems), ``frameworks_cel``
(image and knobs); this one holds the pool, the share and the assembly.

Static parts (pools, bounds, names, messages) are folded in when compiling; per-pool values
are CEL lists indexed by the chosen pool ``variables.pi``. Kubernetes' CEL has no
floor/ceil: ``cel.int_floor``/``cel.ceil_int`` stand in, on the same IEEE doubles the
webhook computes with, so the numbers agree to the last digit.
"""

from __future__ import annotations

from webhook.compile import cel
from webhook.compile.asks_cel import AsksCel
from webhook.compile.common_shares import decide_common_shares
from webhook.compile.enforcement_cel import EnforcementCel, asked_memory_of
from webhook.compile.frameworks_cel import FrameworksCel
from webhook.compile.pod_cel import DENIAL_ANNOTATION, V, s
from webhook.compile.request_cel import DEVICES_REFUSAL, RequestCel
from webhook.constants import (
    DEVICES_ANNOTATION,
    FRACTION_ANNOTATION,
    GFD_MEMORY_LABEL,
    MEMORY_ANNOTATION,
)
from webhook.core import PIPE_VOLUME, Allocation, Mode, Policy, PolicySet, Pool, format_fraction

__all__ = ["DENIAL_ANNOTATION", "PlanCel", "V", "node_memory_expression", "s"]

# Granted shares are at most 1: this marks a pool that cannot take the request.
NO_POOL = "9.0"
# webhook.core.placement._LARGEST_GPU_MEMORY_MIB and _AGREEMENT_TOLERANCE.
LARGEST_GPU_MEMORY_MIB = 2**30
AGREEMENT_TOLERANCE = 0.01


class PlanCel(RequestCel, AsksCel, FrameworksCel, EnforcementCel):
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
        self._driver_limit()
        self._problems()
        # Without common shares (``common`` None) every pod takes the general path.
        self.common = decide_common_shares(self.policy, self.variables)
        if self.common is not None:
            self.variables = self.common.variables
        # A common share on a clean pod has no problem but the framework's: the patch can
        # skip the problem lists (``bad``, ``problems``) and go straight to its ops.
        self.fast_path = f"{V}clean && !({self.framework_refused})"

    def _pool_fraction(self, pool: Pool) -> str:
        memory = asked_memory_of(self.policy, pool)
        if memory is None:
            return f"({V}hf ? {V}f : -1.0)"
        return f"({V}hf ? {V}f : ({V}mok ? {V}mib / {cel.double(memory)} : -1.0))"

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
        # The count of 1/10000 once, as a variable: format_ten_thousandths reads it eight
        # times and CEL does not share common subexpressions.
        add("fn", cel.ten_thousandths(f"{V}fx"))
        add("ff", cel.format_ten_thousandths(f"{V}fn"))

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
        whole_limit = self._whole_limit()
        whole_problems = (
            f"{V}other + {whole_limit} + "
            f"{self._own_asks(whole.resource_name, f'string(int({V}f))')} + "
            f"{self._node_conflicts(whole.node_selector)} + {self.hand_set_limits(whole=True)}"
        )
        self.framework_refused = f"{V}jf && {V}sh <= 0"
        self.framework_problem = (
            f"({self.framework_refused} ? ['A share of ' + {V}ff + "
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
            f"{self.hand_set_limits(whole=False)} + {self._volume_problems()}"
        )
        enforcement = self._enforcement_problems()
        if enforcement == "[]":
            add("pp", f"{V}whole ? [] : {self._placement_problems()}")
        else:
            # The driver limit's problems only for a placement without problems of its own
            # (modes.driver_limits.EnforcedSlots.place).
            add("pq", self._placement_problems())
            add("pp", f"{V}whole ? [] : {V}pq.size() > 0 ? {V}pq : {enforcement}")
        # The usual pod: only the share's own problems remain, and the lists of sentences
        # for the rest are never built (CEL evaluates the branch taken).
        add("clean", f"{self._clean()} && {self.no_hand_set_limits()}")
        add(
            "problems",
            f"{V}bad.size() > 0 ? [] : {V}whole ? ({V}clean ? {whole_limit} : "
            f"{whole_problems}) : {V}pp.size() > 0 ? {V}pp : {V}clean ? "
            f"{self.framework_problem} : {shared_problems}",
        )

    def _whole_limit(self) -> str:
        policy = self.policy
        whole = policy.whole_gpus
        limit = "no whole GPUs" if whole.max == 0 else f"at most {whole.max} whole GPUs"
        return (
            f"(int({V}f) > {whole.max} ? [{s(FRACTION_ANNOTATION + ' ')} + "
            f"'\"' + {V}ft + '\" asks for ' + string(int({V}f)) + "
            + s(
                f" whole GPUs, but policy {policy.name!r} allows {limit}: ask for fewer, "
                "or for a share below 1."
            )
            + "] : [])"
        )

    # -- framework knobs ----------------------------------------------------------------


def node_memory_expression() -> str:
    """The node affinity requirement of a memory ask sized by the nodes' GPU memory."""
    return (
        f"{{'key': dyn({s(GFD_MEMORY_LABEL)}), 'operator': dyn('Gt'), "
        f"'values': dyn([string({V}nm - 1)])}}"
    )
