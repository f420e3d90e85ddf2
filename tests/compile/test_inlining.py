"""Folding CEL variables into their users (webhook.compile.inlining)."""

from __future__ import annotations

from webhook.cel_inlining import fold_variables


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
