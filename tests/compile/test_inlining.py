"""Folding CEL variables into their users (webhook.compile.inlining)."""

from __future__ import annotations

import celpy
import pytest

from webhook.cel_inlining import bind_all, fold_variables, specialize


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


@pytest.mark.parametrize("x", [0, 3])
def test_bind_all_binds_a_message_with_map_since_all_takes_a_boolean_body(x: int) -> None:
    variables = [("a", "x + 1"), ("b", "string(variables.a) + '!'")]
    message = "variables.b + ' and ' + string(variables.a)"
    bound = bind_all(variables, message, boolean=False)
    assert ".all(" not in bound and bound.endswith("[0]")
    assert bound.count("x + 1") == 1
    assert _evaluate(bound, {"x": x}) == f"{x + 1}! and {x + 1}"


def test_with_no_short_budget_only_single_use_variables_are_folded() -> None:
    variables = [("hf", "'gpu-fraction' in object.metadata.annotations"), ("one", "x + 1")]
    kept, (text,) = fold_variables(
        variables, ["variables.hf && !variables.hf || variables.one > 2"], short_budget=0
    )
    assert kept == variables[:1]
    assert text == "variables.hf && !variables.hf || (x + 1) > 2"


@pytest.mark.parametrize("x", [1, 4])
def test_specialize_reads_facts_inline_and_copies_what_the_branch_still_decides(x: int) -> None:
    variables = [
        ("known", "x > 0 ? 7 : 8"),
        ("k2", "variables.known * 10"),
        ("left", "x * 3"),
        ("both", "variables.left + variables.k2"),
        ("other", "x / 0"),  # never used by the branch: no copy
    ]
    facts = {"known": "7", "k2": "70"}
    (text,), copies = specialize(["variables.both + variables.known"], variables, facts, "u_")
    # Facts inline; each other variable the text needs once as a copy, in the original order.
    assert text == "variables.u_both + (7)"
    assert copies == [("u_left", "x * 3"), ("u_both", "variables.u_left + (70)")]
    original = {"known": 7, "k2": 70, "left": x * 3, "both": x * 3 + 70}
    copied = {"u_" + name: value for name, value in original.items()}
    assert _evaluate(text, {"variables": copied, "x": x}) == _evaluate(
        "variables.both + variables.known", {"variables": original, "x": x}
    )


def test_specialize_leaves_strings_and_longer_names_alone() -> None:
    variables = [("c", "object.spec.containers[0]"), ("cpath", "'/spec/containers/0'")]
    (text,), copies = specialize(
        ["variables.c.name + 'variables.c' + variables.cpath"], variables, {"c": "x"}, "u_"
    )
    assert text == "(x).name + 'variables.c' + variables.u_cpath"
    assert copies == [("u_cpath", "'/spec/containers/0'")]
