"""Policy files → ``PolicySet``, or a ``PolicyError`` whose lines read ``file: yaml.path: problem``.

Structure is checked against ``schema`` (one source of truth, shared with editors), values
come from ``build``, rules across the fields of a policy from ``rules``; rules across
policies are checked here. Nothing is half-loaded: either every document is valid and a new
``PolicySet`` comes back, or nothing does.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from webhook.constants import ALWAYS_EXCLUDED_NAMESPACES, DEFAULT_EXCLUDED_NAMESPACES
from webhook.core.policy.build import build_policy
from webhook.core.policy.model import API_VERSION, POLICY_KIND, SETTINGS_KIND, Policy, PolicySet
from webhook.core.policy.quota import quotas_declared_twice
from webhook.core.policy.rules import check
from webhook.core.policy.schema import POLICY_SCHEMA, SETTINGS_SCHEMA
from webhook.core.policy.yaml_reader import compose_documents, load_documents
from webhook.core.workload_kinds import WorkloadKind, builtin_kinds, kind_from_data
from webhook.errors import PolicyError

_POLICY_VALIDATOR = Draft202012Validator(POLICY_SCHEMA)
_SETTINGS_VALIDATOR = Draft202012Validator(SETTINGS_SCHEMA)
POLICY_SUFFIXES = (".yaml", ".yml")
# Real policy files are a few KiB; the bound keeps a mistaken or hostile file from costing
# every worker its memory.
MAX_POLICY_FILE_BYTES = 1024 * 1024


# A problem line quotes at most this much of a value: enough to recognise it, never a wall.
MAX_QUOTED_CHARACTERS = 200


def _one_line(text: object, limit: int = MAX_QUOTED_CHARACTERS * 4) -> str:
    """``text`` on one line (control characters escaped) and at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    flat = "".join(c if c.isprintable() else repr(c)[1:-1] for c in flat)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class _Problems:
    """Collects ``file: path: message (line N)`` lines for one load, each one short line."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, source: str, path: str, message: str, line: int | None = None) -> None:
        where = f" (line {line})" if line is not None else ""
        path = _one_line(path or "<document>", MAX_QUOTED_CHARACTERS)
        self.lines.append(f"{source}: {path}: {_one_line(message)}{where}")


def load_policies(path: str | Path) -> PolicySet:
    """Load a policy file, or every ``*.yaml``/``*.yml`` file of a directory (not recursive)."""
    return load_policy_texts(read_policy_files(path))


def read_policy_files(path: str | Path) -> list[tuple[str, str]]:
    """(file name, text) of every file ``load_policies(path)`` reads, or a ``PolicyError``.

    The one place that decides which files a policy path means; the server's policy store
    hashes exactly these texts to notice changes.
    """
    root = Path(path)
    if root.is_dir():
        # Sub-folders are not read; anything else with a policy suffix is, and one that is
        # not a regular file is refused rather than skipped unseen.
        files = sorted(p for p in root.iterdir() if p.suffix in POLICY_SUFFIXES and not p.is_dir())
        if not files:
            raise PolicyError(
                [
                    f"{root}: <directory>: holds no .yaml or .yml policy files; add one or point "
                    "--policies at a policy file."
                ]
            )
    elif root.exists():
        files = [root]
    else:
        raise PolicyError([f"{root}: <path>: no such file or directory."])
    return [(str(file), _read_policy_file(file)) for file in files]


def _read_policy_file(file: Path) -> str:
    """The text of one policy file: a regular file of at most ``MAX_POLICY_FILE_BYTES``."""
    # is_file() follows links: a dangling or looping link, a FIFO (whose read would block),
    # a socket or a device all fail it.
    if not file.is_file():
        raise PolicyError(
            [
                f"{file}: <file>: is not a regular file (a dangling or looping link, a FIFO, "
                "a socket or a device): replace it with a policy file or remove it."
            ]
        )
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_POLICY_FILE_BYTES + 1)
        if len(data) > MAX_POLICY_FILE_BYTES:
            raise PolicyError(
                [
                    f"{file}: <file>: is larger than {MAX_POLICY_FILE_BYTES} bytes; policies "
                    "are a few KiB: split the file or remove what is not a policy."
                ]
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise PolicyError([f"{file}: <file>: cannot be read: {error}."]) from error


def load_policy_text(text: str, source: str = "<string>") -> PolicySet:
    return load_policy_texts([(source, text)])


def load_policy_texts(texts: Iterable[tuple[str, str]]) -> PolicySet:
    """Parse (source name, YAML text) pairs into one ``PolicySet``."""
    problems = _Problems()
    policies: list[Policy] = []
    # Where each policy was written, for problems found across policies.
    origins: dict[int, tuple[str, yaml.Node]] = {}
    excluded: set[str] | None = None
    kinds: list[WorkloadKind] = []
    sources: list[str] = []
    for source, text in texts:
        sources.append(source)
        for document, node, prefix in _documents(source, text, problems):
            kind = document.get("kind")
            if kind == SETTINGS_KIND:
                if _validate(_SETTINGS_VALIDATOR, document, node, source, prefix, problems):
                    excluded = (excluded or set()) | set(
                        document["spec"].get("excludeNamespaces", [])
                    )
                    kinds += _workload_kinds(document, node, source, prefix, problems, kinds)
            elif _validate(_POLICY_VALIDATOR, document, node, source, prefix, problems):
                policy = _build_policy(document, node, source, prefix, problems)
                if policy is not None:
                    policies.append(policy)
                    origins[id(policy)] = (prefix, node)
    _check_across_policies(policies, origins, problems)
    if not policies and not problems.lines:
        problems.add(", ".join(sources) or "<none>", "<files>", "no GpuSharingPolicy found.")
    if problems.lines:
        raise PolicyError(problems.lines)
    namespaces = set(DEFAULT_EXCLUDED_NAMESPACES) if excluded is None else excluded
    return PolicySet(
        policies=tuple(policies),
        excluded_namespaces=frozenset((*namespaces, *ALWAYS_EXCLUDED_NAMESPACES)),
        sources=tuple(sources),
        workload_kinds=tuple(kinds),
    )


def _workload_kinds(
    document: dict[str, Any],
    node: yaml.Node,
    source: str,
    prefix: str,
    problems: _Problems,
    known: list[WorkloadKind],
) -> list[WorkloadKind]:
    """The settings' own workload kinds; a problem for each that cannot be read or that
    names a kind gpushare already reads."""
    taken = {(k.group, k.kind) for k in (*builtin_kinds(), *known)}
    kinds = []
    for index, entry in enumerate(document["spec"].get("workloadKinds", [])):
        path = ("spec", "workloadKinds", index)
        line = _line_of(node, path)
        try:
            kind = kind_from_data(entry, custom=True)
        except ValueError as error:
            problems.add(source, _join(prefix, path), str(error), line)
            continue
        if (kind.group, kind.kind) in taken:
            problems.add(
                source,
                _join(prefix, path),
                f"{kind.kind} of group {kind.group} is already read (built in, or listed "
                "before): remove this entry",
                line,
            )
            continue
        taken.add((kind.group, kind.kind))
        kinds.append(kind)
    return kinds


def _documents(
    source: str, text: str, problems: _Problems
) -> list[tuple[dict[str, Any], yaml.Node, str]]:
    """Each non-empty YAML document with its node (for line numbers) and path prefix."""
    try:
        nodes = compose_documents(text)
        values = load_documents(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        problem = getattr(error, "problem", None) or str(error)
        problems.add(source, "<yaml>", f"is not valid YAML: {_one_line(problem)}", line)
        return []
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as error:
        # PyYAML's SafeLoader builds tagged scalars (``!!timestamp``, ``!!int``, ``!!set``,
        # dates like 2001-02-30) with Python calls that raise their own errors.
        problems.add(source, "<yaml>", f"holds a value YAML cannot build: {_one_line(error)}")
        return []
    documents = [(v, n) for v, n in zip(values, nodes, strict=True) if v is not None]
    result: list[tuple[dict[str, Any], yaml.Node, str]] = []
    for index, (value, node) in enumerate(documents):
        prefix = f"[document {index + 1}]" if len(documents) > 1 else ""
        if not isinstance(value, dict):
            problems.add(
                source,
                prefix,
                f"is a {type(value).__name__}, expected a mapping with apiVersion "
                f"{API_VERSION} and kind {POLICY_KIND} or {SETTINGS_KIND}",
                node.start_mark.line + 1,
            )
            continue
        result.append((value, node, prefix))
    return result


def _join(prefix: str, path: Iterable[str | int]) -> str:
    text = prefix
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _line_of(node: yaml.Node, path: Iterable[str | int]) -> int | None:
    """The 1-based line of the YAML node at ``path``, or of its nearest existing parent."""
    current = node
    for part in path:
        child: yaml.Node | None = None
        if isinstance(current, yaml.MappingNode) and isinstance(part, str):
            child = next((v for k, v in current.value if k.value == part), None)
        elif isinstance(current, yaml.SequenceNode) and isinstance(part, int):
            child = current.value[part] if part < len(current.value) else None
        if child is None:
            break
        current = child
    return int(current.start_mark.line) + 1


def _describe(error: ValidationError) -> str:
    """A sentence for one schema violation, with what was expected."""
    validator = error.validator
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if validator == "additionalProperties":
        allowed = ", ".join(sorted(schema.get("properties", {})))
        return f"{error.message}; allowed fields: {allowed}"
    if validator == "enum":
        return f"{error.instance!r} is not one of {', '.join(map(str, schema['enum']))}" + (
            _quote_hint(error.instance, schema["enum"])
        )
    if validator == "const":
        return f"{error.instance!r} must be {schema['const']!r}"
    if validator == "pattern":
        hint = schema.get("description", "")
        return f"{error.instance!r} does not have the expected form{': ' + hint if hint else ''}"
    return str(error.message)


# The words YAML 1.1 (PyYAML, and sigs.k8s.io/yaml for Kubernetes manifests) reads as booleans.
_BOOLEAN_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def _quote_hint(instance: object, allowed: Iterable[object]) -> str:
    """Where a bare word such as ``off`` was read as a boolean, how to write it."""
    if not isinstance(instance, bool):
        return ""
    words = [word for word in _BOOLEAN_WORDS[instance] if word in allowed]
    if not words:
        return ""
    word = words[0]
    return f' (YAML reads a bare {word} as {str(instance).lower()}: write "{word}" in quotes)'


def _unknown_field(key: object, known: Iterable[str]) -> str:
    """An unknown key, the closest allowed field (a typo's likely fix) and the allowed ones."""
    allowed = sorted(known)
    by_lower = {field.lower(): field for field in allowed}  # NodeSelector, resource_name
    lowered = str(key).lower().replace("_", "").replace("-", "")
    close = difflib.get_close_matches(lowered, list(by_lower), n=1, cutoff=0.6)
    hint = f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
    return f"unknown field {key!r}{hint}; allowed fields: {', '.join(allowed)}"


def _validate(
    validator: Draft202012Validator,
    document: dict[str, Any],
    node: yaml.Node,
    source: str,
    prefix: str,
    problems: _Problems,
) -> bool:
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path)))
    for error in errors:
        path = list(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            # Point at each unexpected key, not at the mapping that holds it.
            known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
            for key in sorted((k for k in error.instance if k not in known), key=str):
                where = [*path, key]
                message = _unknown_field(key, known)
                problems.add(source, _join(prefix, where), message, _line_of(node, where))
            continue
        problems.add(source, _join(prefix, path), _describe(error), _line_of(node, path))
    return not errors


def _build_policy(
    document: dict[str, Any], node: yaml.Node, source: str, prefix: str, problems: _Problems
) -> Policy | None:
    """The policy of a schema-valid document, or None after adding what breaks its rules."""
    spec: dict[str, Any] = document["spec"]
    policy = build_policy(document["metadata"]["name"], source, spec)
    findings = check(policy, spec)
    for finding in findings:
        path = ["spec", *finding.at]
        problems.add(source, _join(prefix, path), finding.message, _line_of(node, path))
    return None if findings else policy


def _check_across_policies(
    policies: list[Policy], origins: Mapping[int, tuple[str, yaml.Node]], problems: _Problems
) -> None:
    def at(policy: Policy, *keys: str) -> tuple[str, int | None]:
        prefix, node = origins[id(policy)]
        return _join(prefix, keys), _line_of(node, keys)

    names: dict[str, Policy] = {}
    for policy in policies:
        if policy.name in names:
            path, line = at(policy, "metadata", "name")
            problems.add(
                policy.source,
                path,
                f"policy {policy.name!r} is also defined in {names[policy.name].source}; "
                "policy names must be unique",
                line,
            )
        names[policy.name] = policy
    defaults: dict[int, Policy] = {}
    for policy in (p for p in policies if p.default):
        other = defaults.get(policy.priority)
        if other is not None:
            path, line = at(policy, "spec", "default")
            problems.add(
                policy.source,
                path,
                f"policies {other.name!r} and {policy.name!r} are both default with priority "
                f"{policy.priority}, so neither wins: keep one default or give them different "
                "priorities",
                line,
            )
        defaults[policy.priority] = policy
    _quotas_declared_once(policies, at, problems)


def _quotas_declared_once(
    policies: list[Policy], at: Callable[..., tuple[str, int | None]], problems: _Problems
) -> None:
    named = [(policy.name, policy.quota) for policy in policies]
    for index, keys, message in quotas_declared_twice(named):
        path, line = at(policies[index], "spec", "quota", *keys)
        problems.add(policies[index].source, path, message, line)


def default_policies_path() -> Path:
    """Where policies come from when no path is given.

    In order: $GPUSHARE_POLICIES; ./policies; the policies/ folder of the checkout this
    package lives in; /etc/gpushare/policies (the container image's copy).
    """
    configured = os.environ.get("GPUSHARE_POLICIES")
    if configured:
        return Path(configured)
    for candidate in (
        Path.cwd() / "policies",
        Path(__file__).resolve().parents[3] / "policies",
    ):
        if candidate.is_dir():
            return candidate
    return Path("/etc/gpushare/policies")
