"""Building CEL text: literals, globs as RE2 patterns, and the few numeric idioms the compiled
policies need that Kubernetes' CEL lacks (no ``math.floor``/``ceil`` in the admission
environment of kube-apiserver 1.37: checked on the harness's apiserver).

Every function returns CEL source as a Python string; nothing here knows about pods or
policies. The output must stay byte-for-byte what the webhook would say, so numbers are
formatted the way ``webhook.core.placement.format_fraction`` formats them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

# The same float slack as webhook.core.placement._EPSILON.
EPSILON = "1e-9"


def string(value: str) -> str:
    """A CEL string literal (JSON escapes are valid CEL escapes for these characters)."""
    return json.dumps(value, ensure_ascii=False)


def strings(values: Iterable[str]) -> str:
    return "[" + ", ".join(string(v) for v in values) + "]"


def double(value: float) -> str:
    """A CEL double literal that round-trips ``value``."""
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


def join(parts: Sequence[str]) -> str:
    """``a + b + c`` of CEL string expressions."""
    return " + ".join(parts) if parts else '""'


def any_of(conditions: Sequence[str]) -> str:
    return "(" + " || ".join(conditions) + ")" if conditions else "false"


def all_of(conditions: Sequence[str]) -> str:
    return "(" + " && ".join(conditions) + ")" if conditions else "true"


def _class_body(body: str) -> str:
    """An fnmatch class body as RE2 and Python read it alike: ranges ``a-b`` kept, every
    other character literal (brackets, backslashes, carets and hyphens escaped, so that no
    ``--`` reads as a set operation)."""
    parts = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            parts.append(f"{_class_char(body[k])}-{_class_char(body[k + 2])}")
            k += 3
        else:
            parts.append(_class_char(body[k]))
            k += 1
    return "".join(parts)


def _class_char(char: str) -> str:
    return "\\" + char if char in "\\[]^-" else char


def glob_regex(pattern: str) -> str:
    """``fnmatch.fnmatchcase`` semantics as an anchored RE2 pattern: ``*`` any run of
    characters (``/`` included), ``?`` one character, ``[...]``/``[!...]`` a class."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: fnmatch reads "[" literally
                out.append(r"\[")
                continue
            body = pattern[i:j]
            i = j + 1
            ranges = re.findall(r"(.)-(.)", body.lstrip("!"))
            if any(low > high for low, high in ranges):
                raise ValueError(f"glob {pattern!r} holds a reversed range in [{body}]")
            negated = body.startswith("!")
            if negated:
                body = body[1:]
            out.append(f"[{'^' if negated else ''}{_class_body(body)}]")
        else:
            out.append(_escape(c))
    return "^(?s:" + "".join(out) + ")$"


def globs_regex(patterns: Iterable[str]) -> str:
    """One anchored pattern matching what any of ``patterns`` matches."""
    return "^(" + "|".join(glob_regex(p)[1:-1] for p in patterns) + ")$"


def glob_piece(pattern: str) -> str:
    """The longest run of literal characters without ``:`` that every string ``pattern``
    matches contains ("" if there is none). Only the text before the first ``[`` is read, so
    a bracket class, closed or not, never counts as literal."""
    head = pattern.split("[", 1)[0]
    pieces = re.split(r"[*?:]", head)
    return max(pieces, key=len)


def official_repository_regex(repository: str, tag_regex: str) -> str:
    """An RE2 pattern for an image reference as written whose repository, normalised the
    way ``framework_images.split_reference`` does (Docker Hub's registry names and
    ``library/`` dropped, a digest cut off), is ``repository`` and whose tag starts with a
    match of ``tag_regex`` (anchored at its start only, as ``version_below_regex``)."""
    if not tag_regex.startswith("^") or tag_regex.endswith("$"):
        raise ValueError(f"tag pattern {tag_regex!r} must be anchored at its start only")
    return (
        r"^((docker\.io|index\.docker\.io|registry-1\.docker\.io)/)?(library/)?"
        + "".join(_escape(c) for c in repository)
        + ":"
        + tag_regex[1:]
    )


def official_tagged_regex(repository: str) -> str:
    """An RE2 pattern for an image reference as written that ``split_reference`` reads as
    ``repository`` with a tag: one run without ``:``, ``/`` or ``@``, then at most a digest."""
    return official_repository_regex(repository, "^[^:/@]+(@(?s:.*))?") + "$"


def _escape(character: str) -> str:
    return "\\" + character if character in r".^$*+?()[]{}|\/" else character


def int_floor(expression: str) -> str:
    """floor() of a non-negative double as an int: CEL's int() truncates toward zero."""
    return f"int({expression})"


def ceil_int(expression: str) -> str:
    """ceil() of a double, as an int (for values from -1 up; callers clamp at 1)."""
    return f"(int({expression}) + (double(int({expression})) < ({expression}) ? 1 : 0))"


def format_fraction(expression: str) -> str:
    """``webhook.core.placement.format_fraction`` of a non-negative double expression:
    floored to 1/10000, up to four decimals, no trailing zeros."""
    return format_ten_thousandths(ten_thousandths(expression))


def ten_thousandths(expression: str) -> str:
    """A non-negative double expression as an int count of 1/10000, floored."""
    return f"int(({expression}) * 10000.0 + {EPSILON})"


def format_ten_thousandths(n: str) -> str:
    """An int count of 1/10000 as ``format_fraction`` writes it ("0.5", "0.3333", "1")."""
    digits = f"string({n} % 10000 + 10000)"
    decimals = (
        f"({n} % 1000 == 0 ? {digits}.substring(1, 2) : "
        f"{n} % 100 == 0 ? {digits}.substring(1, 3) : "
        f"{n} % 10 == 0 ? {digits}.substring(1, 4) : {digits}.substring(1, 5))"
    )
    return f"({n} % 10000 == 0 ? string({n} / 10000) : string({n} / 10000) + '.' + {decimals})"


def shown(expression: str) -> str:
    """``webhook.core.request.shown``: the text quoted, cut to 40 characters when longer."""
    return (
        f"(size({expression}) <= 40 ? '\"' + {expression} + '\"' : "
        f"'\"' + {expression}.substring(0, 40) + '...\" (' + string(size({expression})) "
        "+ ' characters)')"
    )


def python_repr(expression: str) -> str:
    """Python's ``repr`` of a string as messages print names: single quotes unless the text
    holds one and no double quote (Kubernetes names hold neither)."""
    return (
        f"({expression}.contains(\"'\") && !{expression}.contains('\"') ? "
        f"'\"' + {expression} + '\"' : \"'\" + {expression} + \"'\")"
    )


def python_repr_text(expression: str) -> str:
    """Python's ``repr`` of any text a user wrote (an env value): backslashes, newlines,
    carriage returns and tabs escaped as Python escapes them, then quoted as ``python_repr``
    quotes, a single quote escaped where the text holds both kinds. Other control
    characters (Python writes them as ``\\xNN``) are left as they are."""
    escaped = expression
    for raw, written in (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        escaped = f"{escaped}.replace({string(raw)}, {string(written)})"
    return (
        f"({escaped}.contains(\"'\") && !{escaped}.contains('\"') ? "
        f'\'"\' + {escaped} + \'"\' : "\'" + {escaped}.replace("\'", "\\\\\'") + "\'")'
    )


def version_below_regex(since: tuple[int, int, int, int]) -> str:
    """An RE2 pattern matching the image tags whose version, as
    ``webhook.core.framework_images.parse_version`` reads it, is below ``since``.

    Only releases (``since[3] == 0``) with patch 0 are needed (TensorFlow 1.12.0); anything
    else is the caller's to refuse.
    """
    major, minor, patch, pre = since
    if pre != 0 or patch != 0:
        raise ValueError(f"version_below_regex handles X.Y.0 releases, not {since}")
    end = "([^0-9]|$)"
    alternatives = []
    if major > 0:
        alternatives.append(rf"0*{_below(major)}\.[0-9]+")
    if minor > 0:
        alternatives.append(rf"0*{major}\.0*{_below(minor)}{end}")
    # X.Y.0 pre-releases (X.Y.0a0, X.Yrc1) sort below X.Y.0.
    alternatives.append(rf"0*{major}\.0*{minor}(\.0+)?(a|b|rc|\.dev)")
    return "^v?(" + "|".join(alternatives) + ")"


def _below(limit: int) -> str:
    """A group matching the decimal numbers 0 .. limit - 1 (no leading zeros; callers add
    ``0*``)."""
    return "(" + "|".join(str(n) for n in range(limit)) + ")" if limit > 1 else "(0)"
