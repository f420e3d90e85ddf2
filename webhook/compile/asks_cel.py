"""What a plan refuses besides the request, in CEL and in the webhook's words: GPU resources
asked by hand (``container_resources``), node selectors that conflict with the pool
(``mode_edits.select_nodes``), and the MPS daemon's volume and mount (``add_volumes``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from webhook.compile import cel
from webhook.compile.pod_cel import V, gpu_resource_test, s
from webhook.constants import CONTAINER_ANNOTATION, FRACTION_ANNOTATION, MEMORY_ANNOTATION
from webhook.core import PIPE_VOLUME, Mode, Placement, Policy, PolicySet, Pool, mode_changes


class AsksCel:
    """The other problems of a plan, as CEL lists of sentences."""

    policy: Policy
    policies: PolicySet
    pools: tuple[Pool, ...]

    def add(self, name: str, expression: str) -> None:
        raise NotImplementedError

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
            # exists() first: the common pod asks for no GPU resource, and the sorted
            # list and the messages are then never built.
            sections.append(
                f"(has({container}.resources) && has({asks}) && {asks}.exists(k, {condition}) ? "
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

    def _clean(self) -> str:
        """True for the usual pod, which asks for no GPU resource by hand, selects none of
        the node labels the policy's pools and whole GPUs select, and has no MPS pipe
        volume: then none of the problems below can arise."""
        selectors = [self.policy.whole_gpus.node_selector, *self.pool_selectors()]
        return (
            f"{self._asks_nothing_by_hand()} && {self._selects_nothing_of(selectors)} && "
            f"{self._no_volume_clash()}"
        )

    def _asks_nothing_by_hand(self) -> str:
        """True when no container of any kind names a GPU resource in limits or requests:
        then ``_other_asks`` and ``_own_asks`` are empty (a cheap test; it builds nothing)."""
        test = gpu_resource_test(self.policies, "k")
        asks = (
            "has(x.resources) && ((has(x.resources.limits) && "
            f"x.resources.limits.exists(k, {test})) || (has(x.resources.requests) && "
            f"x.resources.requests.exists(k, {test})))"
        )
        return " && ".join(
            f"!(has(object.spec.{field}) && object.spec.{field}.exists(x, {asks}))"
            if field != "containers"
            else f"!object.spec.{field}.exists(x, {asks})"
            for field in ("containers", "initContainers", "ephemeralContainers")
        )

    def _selects_nothing_of(self, selectors: list[Mapping[str, str]]) -> str:
        """True when the pod's nodeSelector has none of the keys ``selectors`` set: then no
        ``_node_conflicts`` of any of them."""
        keys = sorted({k for selector in selectors for k in selector})
        if not keys:
            return "true"
        ns = "object.spec.nodeSelector"
        return f"(!has({ns}) || !{ns}.exists(k, k in {cel.strings(keys)}))"

    def _no_volume_clash(self) -> str:
        """True when ``_volume_problems`` is certainly empty: no volume named as the MPS
        pipe volume and nothing mounted at the pipe directory."""
        policy = self.policy
        if policy.mode is not Mode.MPS_DAEMON:
            return "true"
        pipe = policy.mps_daemon.pipe_directory
        return (
            f"!(has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == "
            f"{s(PIPE_VOLUME)})) && !(has({V}c.volumeMounts) && "
            f"{V}c.volumeMounts.exists(m, m.mountPath == {s(pipe)}))"
        )

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
