"""The request part of a policy's plan in CEL: the annotations read as strictly as
``webhook.core.request`` reads them (same messages, same order), and the container that gets
the GPU (``planning._container_index``, ``container_choice.choose_container``; the guess's
warning is the webhook's alone: ``refusals.notes``)."""

from __future__ import annotations

from webhook.compile import cel
from webhook.compile.pod_cel import V, s
from webhook.constants import (
    CONTAINER_ANNOTATION,
    DEVICES_ANNOTATION,
    FRACTION_ANNOTATION,
    GPU_CONTAINER_NAMES,
    HELPER_CONTAINER_NAMES,
    MEMORY_ANNOTATION,
)
from webhook.core import MAX_VALUE_LENGTH, MAX_WHOLE_GPUS, Policy, PolicySet, Pool

_UNITS = "Ki|Mi|Gi|Ti|k|K|M|G|T"
_ACCEPTED = (
    'use a decimal between 0 and 1 such as "0.5" for a share of one GPU, '
    'or a whole number such as "1" or "2" for whole GPUs.'
)
_MEMORY_FORMS = (
    'a size with a unit such as "10Gi", "512Mi" or "16G", or a whole number of MiB such as "8000"'
)
# The gpu-fraction-num-devices annotation (a share on several GPUs) is not compiled; pods
# carrying it are refused with this sentence.
DEVICES_REFUSAL = (
    f"{DEVICES_ANNOTATION} is not supported by gpushare's compiled admission policies: "
    "remove it, or ask the cluster admin for the gpushare webhook."
)


def gpu_named(name: str) -> str:
    """The CEL string ``name`` is a known GPU container name (``GPU_CONTAINER_NAMES``)."""
    return f"{name} in {cel.strings(GPU_CONTAINER_NAMES)}"


def helper_named(name: str) -> str:
    """The CEL string ``name`` is a known helper's name (``HELPER_CONTAINER_NAMES``)."""
    return f"({name} in {cel.strings(HELPER_CONTAINER_NAMES)})"


def first_is_chosen(containers: str) -> str:
    """Without the container annotation, container 0 of the CEL list ``containers`` is the
    one ``ci`` chooses: it is the only one, or it has a known GPU name, or it is no helper
    and no container has a known GPU name. Reads no variable."""
    first = f"{containers}[0].name"
    return (
        f"(size({containers}) == 1 || {gpu_named(first)} || "
        f"(!{helper_named(first)} && !{containers}.exists(c, {gpu_named('c.name')})))"
    )


class RequestCel:
    """Variables a, hf, ft, hm, mt, hc, cn, fp, fok, whole, f, mib, mok, mp, rp (the request)
    and names, ci, cp, c, cpath (the container)."""

    policy: Policy
    policies: PolicySet
    pools: tuple[Pool, ...]

    def add(self, name: str, expression: str) -> None:
        raise NotImplementedError

    def _request(self) -> None:
        add = self.add
        add("a", "object.metadata.annotations")
        add("hf", f"{s(FRACTION_ANNOTATION)} in {V}a")
        add("ft", f"{V}hf ? {V}a[{s(FRACTION_ANNOTATION)}] : ''")
        add("hm", f"{s(MEMORY_ANNOTATION)} in {V}a")
        add("mt", f"{V}hm ? {V}a[{s(MEMORY_ANNOTATION)}] : ''")
        add("hc", f"{s(CONTAINER_ANNOTATION)} in {V}a")
        add("cn", f"{V}hc ? {V}a[{s(CONTAINER_ANNOTATION)}] : ''")
        self._fraction()
        self._memory()
        self._request_problems()

    def _fraction(self) -> None:
        """gpu-fraction: ``request._parse_fraction``'s checks in its order, one problem."""
        add = self.add
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

    def _memory(self) -> None:
        """gpu-memory: ``request._parse_memory`` (MiB, or a quantity with a unit)."""
        add = self.add
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

    def _request_problems(self) -> None:
        """Every request problem in ``read_request``'s order."""
        mt, quoted = f"{V}mt", f"'\"' + {V}ft + '\"'"
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
        self.add(
            "rp",
            f"[{V}fp, {V}mp].filter(m, m != '') + ({whole_and_memory}) + ({empty_name})",
        )

    def _container(self) -> None:
        add = self.add
        add("names", "object.spec.containers.map(c, c.name)")
        # container_choice.choose_container, inline (a variable more costs every pod): the
        # first known GPU name, else the first container that is no helper, else the first.
        names = f"{V}names"
        gpu, other = gpu_named("n"), f"!{helper_named('n')}"
        add(
            "ci",
            f"{V}hc ? {names}.indexOf({V}cn) : size({names}) == 1 ? 0 : "
            f"{names}.exists(n, {gpu}) ? {names}.indexOf({names}.filter(n, {gpu})[0]) : "
            f"{names}.exists(n, {other}) ? {names}.indexOf({names}.filter(n, {other})[0]) : 0",
        )
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
