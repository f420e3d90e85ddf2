"""Fewer CEL variables: a variable used once, or a short one used a few times, outside any
comprehension, is folded into the expressions that use it; one used nowhere is dropped. And
fewer evaluated: ``specialize`` rewrites a branch where some variables' values are known
(the usual pod's share, pool and container) to read those inline.

Why: the apiserver evaluates each variable of an admission policy as a program of its own
(lazily, memoized per request: kubernetes/kubernetes
staging/src/k8s.io/apiserver/pkg/admission/plugin/cel/composition.go), which costs a fixed
amount per variable on every create: measured through the harness's kube-apiserver, fifty
one-line variables added about 1.1 ms to a create that the same expression written inline
did not. Folding keeps the meaning (CEL expressions have no side effects, and the one use
stays in the same branch, so laziness is kept) and the evaluation count (a use inside a
``map``/``filter``/``exists``/``all`` body would be evaluated once per element, so those
are never folded).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence

PREFIX = "variables."
_COMPREHENSIONS = ("map", "filter", "exists", "all", "exists_one")
# A variable used more than once is folded too when its text, times its uses, stays under
# this: a short expression evaluated a few times costs less than one more variable.
SHORT_BUDGET = 240
# ...unless it builds a list: short text, but each evaluation allocates and walks one.
_BUILDS_LIST = (".map(", ".filter(", ".split(", ".sort(")
_PARENS = re.compile(r"[()]")


def _references(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(PREFIX + name) + r"(?![A-Za-z0-9_])")


def _code_spans(text: str) -> list[tuple[int, int]]:
    """The parts of ``text`` outside string literals (CEL's '...' and "..." with escapes)."""
    spans, start, index, quote = [], 0, 0, ""
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote, start = "", index + 1
        elif char in "'\"":
            spans.append((start, index))
            quote = char
        index += 1
    if not quote:
        spans.append((start, len(text)))
    return spans


def _in_code(position: int, spans: list[tuple[int, int]]) -> bool:
    # The spans are in order and apart: the last one starting at or before ``position``.
    index = bisect.bisect_right(spans, (position, math.inf)) - 1
    return index >= 0 and position < spans[index][1]


def _inside_comprehension(text: str, position: int, spans: list[tuple[int, int]]) -> bool:
    """Whether ``position`` lies within the arguments of a comprehension macro call."""
    opened: list[int] = []
    for start, end in spans:
        if start >= position:
            break
        for paren in _PARENS.finditer(text, start, min(end, position)):
            if paren.group() == "(":
                opened.append(paren.start())
            elif opened:
                opened.pop()
    for index in opened:
        head = text[:index].rstrip()
        if any(head.endswith("." + macro) for macro in _COMPREHENSIONS):
            return True
    return False


def _replaced(text: str, name: str, positions: Sequence[int], replacement: str) -> str:
    """``text`` with the uses of ``variables.<name>`` at ``positions`` (from ``_uses``)
    replaced by ``replacement``."""
    for position in reversed(positions):
        end = position + len(PREFIX + name)
        text = text[:position] + replacement + text[end:]
    return text


def _uses(name: str, text: str) -> list[int]:
    spans = _code_spans(text)
    return [m.start() for m in _references(name).finditer(text) if _in_code(m.start(), spans)]


def fold_variables(
    variables: Sequence[tuple[str, str]],
    users: Sequence[str],
    short_budget: int = SHORT_BUDGET,
) -> tuple[list[tuple[str, str]], list[str]]:
    """``variables`` (name, expression; each may use the earlier ones) and the expressions
    that use them (``users``), with every single-use variable folded into its user, and
    every short one (its text times its uses under ``short_budget``) into all of them."""
    names = [name for name, _ in variables]
    expressions = dict(variables)
    outside = list(users)
    # Last first: a variable folded into a later one moves with it.
    for name in reversed(names):
        holders = [(key, text) for key, text in expressions.items() if key != name]
        places: list[tuple[str | int, list[int]]] = [
            (key, _uses(name, text)) for key, text in holders
        ]
        places += [(index, _uses(name, text)) for index, text in enumerate(outside)]
        used = [(key, positions) for key, positions in places if positions]
        count = sum(len(positions) for _, positions in used)
        body = expressions[name]
        if count == 0:
            del expressions[name]
            continue
        if count > 1 and (
            count * len(body) > short_budget or any(call in body for call in _BUILDS_LIST)
        ):
            continue
        texts = {key: expressions[key] if isinstance(key, str) else outside[key] for key, _ in used}
        if any(
            _inside_comprehension(texts[key], position, _code_spans(texts[key]))
            for key, positions in used
            for position in positions
        ):
            continue
        del expressions[name]
        for key, positions in used:
            folded = _replaced(texts[key], name, positions, f"({body})")
            if isinstance(key, str):
                expressions[key] = folded
            else:
                outside[key] = folded
    kept = [(name, expressions[name]) for name in names if name in expressions]
    return kept, outside


BOUND_PREFIX = "bound_"


def bind_all(variables: Sequence[tuple[str, str]], expression: str, boolean: bool = True) -> str:
    """``expression`` with the variables it needs (directly or through others) each
    evaluated once and bound by a one-element comprehension, ``[body].all(bound_x, ...)``:
    kube-apiserver's CEL has no ``cel.bind``, and a policy's matchConditions see no
    variables. Unlike a variable, a bound value is evaluated whether or not it is used,
    so bodies should be cheap where they are not needed (guarded by a condition).
    ``all`` takes a boolean body only; an expression of another type (``boolean`` False:
    a message) is bound by ``[body].map(bound_x, ...)[0]``, which builds one more list.
    A value used once is folded into its use instead: a bound one costs a one-element list
    and a comprehension, a folded one nothing, and folding keeps it lazy. A short one used
    more than once stays bound: its text would be evaluated at each use."""
    variables, (expression,) = fold_variables(variables, [expression], short_budget=0)
    bodies = dict(variables)
    needed: set[str] = set()
    pending = [expression]
    while pending:
        text = pending.pop()
        for name, body in bodies.items():
            if name not in needed and _uses(name, text):
                needed.add(name)
                pending.append(body)

    def renamed(text: str) -> str:
        for name in needed:
            text = _replaced(text, name, _uses(name, text), BOUND_PREFIX + name)
        return text

    text = renamed(expression)
    for name, body in reversed(variables):
        if name in needed:
            binder = "all" if boolean else "map"
            text = f"[dyn({renamed(body)})].{binder}({BOUND_PREFIX}{name}, {text})"
            if not boolean:
                text += "[0]"
    return text


def specialize(
    texts: Sequence[str],
    variables: Sequence[tuple[str, str]],
    facts: dict[str, str],
    prefix: str,
) -> tuple[list[str], list[tuple[str, str]]]:
    """``texts`` rewritten for a branch where ``facts`` hold (name: an expression of the
    variable's value there, using no variables): each fact's variable replaced by its
    expression, every other variable they use (directly or through others) by a copy named
    ``prefix + name`` whose own uses are rewritten the same way. Returns the texts and the
    copies, in the order of ``variables`` (a copy uses only earlier copies).

    Why: inside the branch most of the plan is known (a common share's pool, slots and
    container), and each variable the apiserver evaluates is a program run of its own
    (a few microseconds per create), so the branch reads the known values inline and
    evaluates only what the pod still decides."""
    bodies = dict(variables)
    copies: dict[str, str] = {}

    def rewrite(text: str) -> str:
        for name, body in bodies.items():
            positions = _uses(name, text)
            if not positions:
                continue
            if name in facts:
                replacement = f"({facts[name]})"
            else:
                replacement = PREFIX + prefix + name
                if name not in copies:
                    copies[name] = ""  # placeholder: a variable cannot use itself
                    copies[name] = rewrite(body)
            text = _replaced(text, name, positions, replacement)
        return text

    rewritten = [rewrite(text) for text in texts]
    ordered = [(prefix + name, copies[name]) for name, _ in variables if name in copies]
    return rewritten, ordered
