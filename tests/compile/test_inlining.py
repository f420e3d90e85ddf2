"""Folding CEL variables into their users (webhook.compile.inlining)."""

from __future__ import annotations

import celpy
import pytest

from webhook.cel_inlining import bind_all, fold_variables


def test_a_single_use_is_folded_and_an_unused_variable_dropped() -> None:
    variables = [
        ("long", "object.spec.containers.map(c, c.name).join(', ') + " + "'x' + " * 60 + "''"),
        ("a", "variables.long + '!'"),
        ("unused", "1"),
    ]
    kept, (patch,) = fold_variables(variables, ["[variables.a]"])
    # 'a' is used once and moves into the patch, then 'long' (used once, in it) too.
    assert kept == []
    assert patch.startswith("[((object.spec.containers.map(c, c.name).join(', ')")
    assert patch.endswith("'') + '!')]")
    # Used twice and long: kept as a variable, its user folded.
    kept, (patch,) = fold_variables(variables, ["[variables.a, variables.a]"])
    assert [name for name, _ in kept] == ["long"]
    assert patch == "[(variables.long + '!'), (variables.long + '!')]"


def test_a_use_inside_a_comprehension_is_not_folded() -> None:
    kept, (patch,) = fold_variables(
        [("big", "object.spec.containers.size() * 2")],
        ["object.spec.containers.filter(c, c.name.size() < variables.big)"],
    )
    assert kept == [("big", "object.spec.containers.size() * 2")]
    assert "variables.big" in patch


def test_short_variables_are_folded_where_used_and_strings_are_left_alone() -> None:
    kept, (patch,) = fold_variables(
        [("hf", "'gpu-fraction' in object.metadata.annotations"), ("hfx", "variables.hf")],
        ["variables.hf ? 'variables.hf' : variables.hfx ? 'b' : ''"],
    )
    assert kept == []
    folded = "('gpu-fraction' in object.metadata.annotations)"
    assert patch == f"{folded} ? 'variables.hf' : ({folded}) ? 'b' : ''"


def _evaluate(expression: str, activation: dict[str, object]) -> object:
    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    return program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


@pytest.mark.parametrize("x", [0, 1, 2, 5])
def test_bind_all_binds_what_the_expression_needs_and_keeps_its_value(x: int) -> None:
    variables = [
        ("a", "x + 1"),
        ("b", "variables.a * 2"),
        ("unused", "x / 0"),  # an error if it were evaluated
        ("c", "variables.b + variables.a"),
    ]
    expression = "variables.c > 6 && 'variables.a' != ''"
    bound = bind_all(variables, expression)
    assert "unused" not in bound and "variables." not in bound.replace("'variables.a'", "")
    assert bound.count("x + 1") == 1  # each needed body once
    with_variables = {"variables": {"a": x + 1, "b": (x + 1) * 2, "c": (x + 1) * 3}, "x": x}
    assert _evaluate(bound, {"x": x}) == _evaluate(expression, with_variables)
