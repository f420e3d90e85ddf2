"""A policy's ``enforcement`` section in CEL, in the webhook's numbers and words: the limits
the mode writes into the GPU container (MPS client limits, the driver's
``NVIDIA_GPU_MEMORY_REQUEST``/``LIMIT`` in whole MiB), why a placement cannot have the driver
limit it must have (``modes.driver_limits.unenforceable``), and the limit variables set by
hand under ``handSetLimits: deny`` (``hand_set_env.refuse_hand_set_limits``).

The driver limit is ``modes.driver_limits.driver_limit_mib``: a ``gpu-memory`` ask in whole
MiB rounded up, never above its slots' share of what a GPU leaves to pods (its memory less
``reservedMemory`` of its model, the pool's ``nvidia.com/gpu.product`` selector); a fraction
is that fraction of the usable memory, rounded down; none on a pool that declares no
memory. The per-pool numbers are static (CEL lists indexed by the chosen pool), the
arithmetic is the webhook's on the same IEEE doubles.
"""

from __future__ import annotations

from webhook.compile import cel
from webhook.compile.core_words import (
    CONTAINER,
    PLANNED,
    POLICY,
    VALUE,
    as_cel,
    hand_set_sentence,
)
from webhook.compile.pod_cel import V, s
from webhook.constants import (
    DRIVER_LIMIT_VARS,
    DRIVER_MEMORY_LIMIT_VAR,
    FRACTION_ANNOTATION,
    GFD_PRODUCT_LABEL,
    LIMIT_VARS,
    MEMORY_ANNOTATION,
    MPS_MEMORY_LIMIT_VAR,
    MPS_THREAD_PERCENTAGE_VAR,
)
from webhook.core import HandSetLimits, Mode, Policy, Pool

# (name, CEL value, CEL condition): a limit the mode writes, and when.
LimitSetting = tuple[str, str, str]


def usable_mib(policy: Policy, pool: Pool) -> int | None:
    """``driver_limits.usable_memory_mib``: a GPU's memory less its model's reservation."""
    if pool.gpu_memory_mib is None:
        return None
    product = pool.node_selector.get(GFD_PRODUCT_LABEL)
    return pool.gpu_memory_mib - policy.enforcement.reserved_mib(product)


def asked_memory_of(policy: Policy, pool: Pool) -> int | None:
    """The GPU memory a ``gpu-memory`` ask alone is a share of on ``pool``: what a GPU leaves
    to pods where the driver limit keeps a reservation on some pool of the policy
    (``driver_limits.EnforcedSlots.place``), else its memory; None where it declares none."""
    if pool.gpu_memory_mib is None:
        return None
    reserving = policy.enforcement.writes_driver_limit and any(
        usable_mib(policy, p) != p.gpu_memory_mib for p in policy.pools if p.gpu_memory_mib
    )
    return max(1, usable_mib(policy, pool) or 0) if reserving else pool.gpu_memory_mib


class EnforcementCel:
    """Variables us, dl, ep (the driver limit and why there is none), and the limit env."""

    policy: Policy
    pools: tuple[Pool, ...]

    def add(self, name: str, expression: str) -> None:
        raise NotImplementedError

    # -- the driver limit ---------------------------------------------------------------

    def _driver_limit(self) -> None:
        """``dl``: the limit in MiB for the chosen pool and slots, -1 for none."""
        add, policy = self.add, self.policy
        if not policy.enforcement.writes_driver_limit:
            add("dl", "-1")
            return
        usable = [usable_mib(policy, pool) for pool in self.pools]
        add("us", "[" + ", ".join(str(-1 if u is None else u) for u in usable) + "]")
        replicas = "[" + ", ".join(cel.double(p.replicas) for p in self.pools) + "]"
        # slot_limit_mib: floor(slots / replicas * usable), the most the slots may hold.
        add("bd", f"int(double({V}slots) / {replicas}[{V}pi] * double({V}us[{V}pi]))")
        asked = cel.ceil_int(f"{V}mib - {cel.EPSILON}")
        add("ask", f"{asked} < 1 ? 1 : {asked}")
        share = f"int({V}fx * double({V}us[{V}pi]) + {cel.EPSILON})"
        add(
            "dl",
            f"{V}mok ? ({V}us[{V}pi] < 0 || {V}ask <= {V}bd ? {V}ask : {V}bd) : "
            f"{V}us[{V}pi] < 0 ? -1 : {share} < 1 ? 1 : {share}",
        )

    def _enforcement_problems(self) -> str:
        """``driver_limits.unenforceable`` after a placement without problems."""
        policy = self.policy
        enforcement = policy.enforcement
        if not enforcement.writes_driver_limit:
            return "[]"
        names = cel.strings(p.name for p in self.pools)
        pool = cel.python_repr(f"{names}[{V}pi]")
        too_big = (
            f"[{s(MEMORY_ANNOTATION + ' ')} + '\"' + {V}mt + '\" is more than ' + "
            f"string({V}slots) + ' slot(s) of pool ' + {pool} + "
            f"{s(' hold once the driver and CUDA context keep their share (')} + "
            f"string({V}bd) + "
            + s(f"Mi, enforcement.reservedMemory of policy {policy.name!r}): ask for at most ")
            + f" + string({V}bd) + 'Mi.']"
        )
        over = f"{V}us[{V}pi] >= 0 && {cel.ceil_int(f'{V}mib - {cel.EPSILON}')} > {V}bd"
        if not enforcement.needs_known_memory:
            return f"({V}mok && {over} ? {too_big} : [])"
        unknown = (
            f"[{s(FRACTION_ANNOTATION + ' ')} + '\"' + {V}ft + '\"' + "
            + s(
                f" needs a driver memory limit in MiB (policy {policy.name!r}: "
                "enforcement.driverMemoryLimit: "
                f"{enforcement.driver_memory_limit.value}), but pool "
            )
            + f" + {pool} + "
            + s(
                " declares no gpuMemory, so that share's size is unknown: declare the pool's "
                "gpuMemory (or spec.gpuMemory), or ask with gpu-memory instead."
            )
            + "]"
        )
        return f"({V}mok ? ({over} ? {too_big} : []) : {V}us[{V}pi] < 0 ? {unknown} : [])"

    # -- the limits in the env -----------------------------------------------------------

    def limit_env(self) -> list[LimitSetting]:
        """The mode's limits in the webhook's order: MPS client limits, then the driver's."""
        policy = self.policy
        settings: list[LimitSetting] = []
        if policy.mode in (Mode.MPS, Mode.MPS_DAEMON):
            mps = policy.mps
            if mps.enforce_thread_percentage:
                raw = f"int({V}fx * 100.0 * {cel.double(mps.thread_overprovision)} + {cel.EPSILON})"
                percent = f"string({raw} < 1 ? 1 : {raw} > 100 ? 100 : {raw})"
                settings.append((MPS_THREAD_PERCENTAGE_VAR, percent, "true"))
            memories = [p.gpu_memory_mib for p in self.pools]
            if mps.enforce_memory_limit and any(m is not None for m in memories):
                known = "[" + ", ".join("true" if m else "false" for m in memories) + "]"
                sizes = "[" + ", ".join(cel.double(m or 0) for m in memories) + "]"
                raw = f"int({V}fx * {sizes}[{V}pi])"
                value = f"'0=' + string({raw} < 1 ? 1 : {raw}) + 'M'"
                settings.append((MPS_MEMORY_LIMIT_VAR, value, f"{known}[{V}pi]"))
        if policy.enforcement.writes_driver_limit:
            settings += [(name, f"string({V}dl)", f"{V}dl > 0") for name in DRIVER_LIMIT_VARS]
        return settings

    def hand_set_limits(self, whole: bool) -> str:
        """``refuse_hand_set_limits``: a sentence per limit variable of the GPU container
        whose entry is not exactly the planned one (whole GPUs: none is planned); "[]"
        where the policy overrides them."""
        policy = self.policy
        if policy.enforcement.hand_set_limits is not HandSetLimits.DENY:
            return "[]"
        planned = [] if whole else self.limit_env()
        held = " || ".join(
            f"(e.name == {s(name)} && {when} && has(e.value) && e.value == {value})"
            for name, value, when in planned
        )
        # What gpushare plans for entry ``e`` ('' for nothing): a sentence of its own.
        chain = "''"
        for name, value, when in reversed(planned):
            chain = f"(e.name == {s(name)} && {when} ? {value} : {chain})"
        values = {
            repr(CONTAINER): cel.python_repr(f"{V}c.name"),
            repr(VALUE): cel.python_repr_text("(has(e.value) ? e.value : '')"),
            DRIVER_MEMORY_LIMIT_VAR: "e.name",
            PLANNED: chain,
        }

        def sentence(from_elsewhere: bool, planned: bool) -> str:
            text = hand_set_sentence(from_elsewhere, planned)
            return as_cel(text.replace(repr(POLICY), repr(policy.name)), values)

        if planned:
            sentences = [
                f"({chain} != '' ? {sentence(from_elsewhere, True)} : "
                f"{sentence(from_elsewhere, False)})"
                for from_elsewhere in (True, False)
            ]
        else:
            sentences = [sentence(from_elsewhere, False) for from_elsewhere in (True, False)]
        each = f"(has(e.valueFrom) ? {sentences[0]} : {sentences[1]})"
        refused = f"e.name in {cel.strings(LIMIT_VARS)}" + (f" && !({held})" if held else "")
        return f"(has({V}c.env) ? {V}c.env.filter(e, {refused}).map(e, {each}) : [])"

    def no_hand_set_limits(self) -> str:
        """True when the GPU container sets no limit variable (``_clean``): then
        ``hand_set_limits`` is empty."""
        if self.policy.enforcement.hand_set_limits is not HandSetLimits.DENY:
            return "true"
        return f"!(has({V}c.env) && {V}c.env.exists(e, e.name in {cel.strings(LIMIT_VARS)}))"
