"""The answers for a workload: each template's verdict (its pods'), and the workload's.

``check_workload`` (``workloads``) builds them; the CLI, ``plan`` and the validating webhook
read them: the reasons after a prefix naming the workload and the template's role, the
warnings saying what each pod will get, and (for the offline CLI) the workload as its pods
will be admitted with the JSON Patch that turns it into that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.core.draft import as_mapping
from webhook.core.patch import JsonPatch
from webhook.core.planning import Decision, Denied, Planned, Untouched
from webhook.core.verdict import Verdict
from webhook.core.workload_kinds import TemplateAt, WorkloadKind


@dataclass(frozen=True)
class TemplateVerdict:
    """The answer for one pod template: its pods' verdict, told about the template.

    ``summary`` says what each pod will get; ``planned`` is the template as the pods will be
    admitted (exact templates only; None when denied) and ``patch`` turns the workload's
    template into it.
    """

    kind: WorkloadKind
    name: str
    at: TemplateAt
    pod: Verdict
    summary: tuple[str, ...] = ()
    planned: Any = None
    patch: JsonPatch = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return self.pod.allowed

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.pod.reasons

    @property
    def code(self) -> int:
        return self.pod.code

    @property
    def policy(self) -> str | None:
        return self.pod.policy

    @property
    def decision(self) -> Decision | None:
        return self.pod.decision

    @property
    def role(self) -> str:
        return self.at.role

    @property
    def lead(self) -> str:
        """What this template's lines start with where the kind has several roles."""
        return f"{self.role}: " if self.role else ""

    @property
    def warnings(self) -> tuple[str, ...]:
        """What each pod will get, then what the pod itself would be warned about."""
        own = tuple(self.lead + line for line in self.pod.warnings)
        return tuple(dict.fromkeys((*self.summary, *own)))

    @property
    def denial_prefix(self) -> str:
        role = f" ({self.role})" if self.role else ""
        return f"pod template of {self.kind.kind} {self.name!r}{role}:"

    @property
    def admission_reasons(self) -> tuple[str, ...]:
        """The pod's reasons after a prefix saying they are about this template."""
        return (self.denial_prefix, *self.reasons)


@dataclass(frozen=True)
class WorkloadVerdict:
    """The answer for a workload: each of its templates' verdicts, and what gpushare has to
    say about the workload itself (the annotation in the wrong place, what it cannot model)."""

    kind: WorkloadKind
    name: str
    document: Mapping[str, Any]
    templates: tuple[TemplateVerdict, ...]
    notes: tuple[str, ...] = ()
    problem: Verdict | None = None  # the workload itself refused (too many templates)

    @property
    def denied(self) -> tuple[TemplateVerdict, ...]:
        return tuple(t for t in self.templates if not t.allowed)

    @property
    def allowed(self) -> bool:
        return self.problem is None and not self.denied

    @property
    def code(self) -> int:
        if self.problem is not None:
            return self.problem.code
        return self.denied[0].code if self.denied else 200

    @property
    def policy(self) -> str | None:
        chosen = self.denied or self.templates
        return next((t.policy for t in chosen if t.policy), None)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every denied template's reasons, each led by its role where the kind has roles."""
        if self.problem is not None:
            return self.problem.reasons
        return tuple(t.lead + reason for t in self.denied for reason in t.reasons)

    @property
    def admission_reasons(self) -> tuple[str, ...]:
        if self.problem is not None:
            return (f"{self.kind.kind} {self.name!r}:", *self.problem.reasons)
        return tuple(line for t in self.denied for line in t.admission_reasons)

    @property
    def summary(self) -> tuple[str, ...]:
        """What each pod of each template will get."""
        return tuple(line for t in self.templates for line in t.summary)

    @property
    def warnings(self) -> tuple[str, ...]:
        lines = [line for t in self.templates for line in t.warnings]
        return tuple(dict.fromkeys((*lines, *self.notes)))

    @property
    def decision(self) -> Decision | None:
        """One decision for the whole workload: the only template's, else denied when any
        template is, untouched when all are, else the first planned one."""
        if self.problem is not None:
            return self.problem.decision
        if len(self.templates) == 1:
            return self.templates[0].decision
        if self.denied:
            return Denied(self.reasons, self.denied[0].policy or "", self.code)
        planned = [t.decision for t in self.templates if isinstance(t.decision, Planned)]
        if planned:
            return planned[0]
        reasons = [
            t.lead + t.decision.reason for t in self.templates if isinstance(t.decision, Untouched)
        ]
        return Untouched("; ".join(reasons) or "no pod template")

    @property
    def patch(self) -> JsonPatch:
        return [op for t in self.templates for op in t.patch] if self.allowed else []

    @property
    def result(self) -> dict[str, Any] | None:
        """The workload with every exact template as its pods will be admitted; None when
        denied."""
        if not self.allowed:
            return None
        result: Any = dict(self.document)
        for template in self.templates:
            if template.at.site.exact and template.planned is not template.at.value:
                result = _replaced(result, template.at.path, template.planned)
        return dict(result)


def _replaced(document: Any, path: Sequence[str | int], value: Any) -> Any:
    """A copy of ``document`` with ``value`` at ``path``, copying only the objects on it."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(document, list) and isinstance(head, int):
        items = list(document)
        items[head] = _replaced(items[head], rest, value)
        return items
    result = dict(as_mapping(document))
    result[str(head)] = _replaced(result.get(str(head)), rest, value)
    return result
