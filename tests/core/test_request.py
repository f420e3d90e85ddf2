"""Reading the gpu-fraction / gpu-memory / gpu-fraction-container-name annotations."""

from __future__ import annotations

import pytest

from webhook.core.quantity import parse_memory_mib
from webhook.core.request import GpuRequest, RequestProblem, has_gpu_request, read_request

ACCEPTED = (
    'use a decimal between 0 and 1 such as "0.5" for a share of one GPU, '
    'or a whole number such as "1" or "2" for whole GPUs.'
)


def _problems(annotations: dict[str, object]) -> list[str]:
    result = read_request(annotations)
    assert isinstance(result, list), f"accepted: {result}"
    assert all(isinstance(p, RequestProblem) for p in result)
    return [p.message for p in result]


def _request(annotations: dict[str, object]) -> GpuRequest:
    result = read_request(annotations)
    assert isinstance(result, GpuRequest), result
    return result


@pytest.mark.parametrize(
    ("text", "fraction"),
    [
        ("0.5", 0.5),
        (".5", 0.5),
        ("0.50", 0.5),
        ("0.25", 0.25),
        ("0.125", 0.125),
        ("0.3333", 0.3333),
        ("0.999", 0.999),
        ("0.01", 0.01),
    ],
)
def test_share_of_one_gpu_is_read_as_fraction(text: str, fraction: float) -> None:
    request = _request({"gpu-fraction": text})
    assert request.fraction == pytest.approx(fraction)
    assert request.fraction_text == text
    assert request.whole_gpus is None
    assert not request.is_whole


@pytest.mark.parametrize(("text", "gpus"), [("1", 1), ("2", 2), ("8", 8), ("1.0", 1), ("02", 2)])
def test_whole_numbers_are_read_as_whole_gpus(text: str, gpus: int) -> None:
    request = _request({"gpu-fraction": text})
    assert request.whole_gpus == gpus
    assert request.is_whole
    assert request.fraction is None


@pytest.mark.parametrize(
    "text", ["abc", "", "-0.5", "50%", "0.5.1", "nan", "inf", "1e-9", "+0.5", " 0.5", "0,5", "1/2"]
)
def test_anything_but_a_plain_decimal_is_refused_naming_the_value(text: str) -> None:
    assert _problems({"gpu-fraction": text}) == [
        f'gpu-fraction "{text}" is not a plain decimal: {ACCEPTED}'
    ]


@pytest.mark.parametrize("text", ["0.5\n", "0.5 ", "\u0660.\u0665", "\uff10.\uff15"])
def test_trailing_newline_and_non_ascii_digits_are_not_plain_decimals(text: str) -> None:
    # "$" in a Python regex also matches before a trailing newline, and "\d" matches any
    # Unicode digit, which Decimal() then happily reads: "0.5\n" and Arabic-Indic zero point five
    # must be refused like any other non-plain decimal.
    assert _problems({"gpu-fraction": text}) == [
        f'gpu-fraction "{text}" is not a plain decimal: {ACCEPTED}'
    ]


@pytest.mark.parametrize("text", ["0", "0.0", "00", ".0"])
def test_zero_asks_for_no_gpu(text: str) -> None:
    assert _problems({"gpu-fraction": text}) == [
        f'gpu-fraction "{text}" asks for no GPU: {ACCEPTED}'
    ]


@pytest.mark.parametrize("text", ["1.5", "2.25", "1.01"])
def test_more_than_one_but_not_whole_is_refused(text: str) -> None:
    assert _problems({"gpu-fraction": text}) == [
        f'gpu-fraction "{text}" is more than one GPU but not a whole number: {ACCEPTED}'
    ]


@pytest.mark.parametrize(
    ("text", "mib"),
    [("10Gi", 10240), ("512Mi", 512), ("16G", 16e9 / 2**20), ("1Ti", 2**20), ("1.5Gi", 1536)],
)
def test_gpu_memory_is_read_in_mib(text: str, mib: float) -> None:
    request = _request({"gpu-memory": text})
    assert request.memory_mib == pytest.approx(mib)
    assert request.memory_text == text
    assert request.fraction is None


MEMORY_FORMS = (
    'use a size with a unit such as "10Gi", "512Mi" or "16G", or a whole number of MiB such '
    'as "8000".'
)


@pytest.mark.parametrize(
    "text", ["abc", "", "0Gi", "-1Gi", "-1", "10GB", "10 Gi", "1e3Mi", "Gi", "0x10", "8000 "]
)
def test_bad_gpu_memory_is_refused_naming_the_value(text: str) -> None:
    assert _problems({"gpu-memory": text}) == [
        f'gpu-memory "{text}" is not a memory size: {MEMORY_FORMS}'
    ]


@pytest.mark.parametrize(
    ("text", "mib"), [("8000", 8000), ("2000", 2000), ("1", 1), ("081920", 81920)]
)
def test_a_bare_whole_number_is_mib_as_in_kai_scheduler(text: str, mib: int) -> None:
    """KAI-Scheduler reads gpu-memory "2000" as 2000 MiB (v0.13.0,
    docs/gpu-sharing/gpu-memory.yaml: ``gpu-memory: "2000" # in Mib``); so does gpushare."""
    request = _request({"gpu-memory": text})
    assert request.memory_mib == mib
    assert request.memory_text == text


@pytest.mark.parametrize("text", ["0", "000", "0.0"])
def test_a_bare_zero_asks_for_no_memory(text: str) -> None:
    assert _problems({"gpu-memory": text}) == [
        f'gpu-memory "{text}" asks for no GPU memory: {MEMORY_FORMS}'
    ]


@pytest.mark.parametrize("text", ["1.5", "0.5", "80.0"])
def test_a_bare_decimal_is_refused_saying_which_unit_is_which(text: str) -> None:
    assert _problems({"gpu-memory": text}) == [
        f'gpu-memory "{text}" has no unit: a number without a unit is MiB and must be whole, '
        f'such as "8000" (8000 MiB); for GiB write "{text}Gi".'
    ]


def test_whole_gpus_with_gpu_memory_is_refused() -> None:
    assert _problems({"gpu-fraction": "2", "gpu-memory": "10Gi"}) == [
        'gpu-fraction "2" asks for whole GPUs, which cannot be combined with gpu-memory "10Gi": '
        "remove one of the two."
    ]


def test_fraction_and_memory_together_are_both_read_for_the_planner_to_compare() -> None:
    request = _request({"gpu-fraction": "0.25", "gpu-memory": "20Gi"})
    assert request.fraction == 0.25
    assert request.memory_mib == 20480


def test_every_problem_is_reported_at_once() -> None:
    problems = _problems(
        {"gpu-fraction": "abc", "gpu-memory": "lots", "gpu-fraction-container-name": " "}
    )
    assert len(problems) == 3
    assert problems[0].startswith('gpu-fraction "abc"')
    assert problems[1].startswith('gpu-memory "lots"')
    assert problems[2].startswith("gpu-fraction-container-name is empty")


def test_container_name_is_carried_and_an_empty_one_refused() -> None:
    assert (
        _request({"gpu-fraction": "0.5", "gpu-fraction-container-name": "model"}).container_name
        == "model"
    )
    assert _request({"gpu-fraction": "0.5"}).container_name is None
    assert _problems({"gpu-fraction": "0.5", "gpu-fraction-container-name": ""}) == [
        "gpu-fraction-container-name is empty: name one of the pod's containers, or remove the "
        "annotation to use the first container."
    ]


def test_non_string_annotation_values_are_read_as_text() -> None:
    # Annotations are strings in the API; an unquoted YAML number in a CLI manifest is not.
    assert _request({"gpu-fraction": 0.5}).fraction == 0.5
    assert _request({"gpu-fraction": 2}).whole_gpus == 2


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"gpu-fraction": "0.5"}, True),
        ({"gpu-memory": "1Gi"}, True),
        ({"gpu-fraction": ""}, True),
        ({"gpu-fraction-container-name": "app"}, False),
        ({"nvidia.com/gpu": "1"}, False),
        ({}, False),
    ],
)
def test_has_gpu_request_only_for_fraction_or_memory(
    annotations: dict[str, str], expected: bool
) -> None:
    assert has_gpu_request(annotations) is expected


@pytest.mark.parametrize(
    ("text", "mib"),
    [("1Ki", 1 / 1024), ("1M", 1e6 / 2**20), ("80Gi", 81920), ("24Gi", 24576), ("1048576", 1)],
)
def test_parse_memory_mib_units(text: str, mib: float) -> None:
    # Policies write Kubernetes quantities: there a bare number is bytes.
    assert parse_memory_mib(text) == pytest.approx(mib)


@pytest.mark.parametrize("text", ["", "0", "0Mi", "Mi", "1Pi", "1mi", "-5Gi", "1.Gi", "nan"])
def test_parse_memory_mib_refuses_what_is_not_a_positive_quantity(text: str) -> None:
    assert parse_memory_mib(text) is None


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"gpu-fraction": str(2**64)}, "more GPUs than any node has"),
        ({"gpu-fraction": "1025"}, "at most 1024"),
        ({"gpu-fraction": "1" * 5000}, "longer than 32 characters"),
        ({"gpu-fraction": "0." + "5" * 40}, "longer than 32 characters"),
        ({"gpu-memory": "1" * 5000 + "Gi"}, "is not a memory size"),
    ],
)
def test_huge_values_are_refused_before_any_arithmetic(
    annotations: dict[str, str], expected: str
) -> None:
    """Values no real pod carries (2**64 GPUs, thousands of digits) get a short, clear
    refusal instead of an overflow deep in planning."""
    problems = read_request(annotations)
    assert isinstance(problems, list)
    (problem,) = problems
    assert expected in problem.message
    assert len(problem.message) < 300  # the value is cut short in the message


def test_the_largest_whole_count_is_read() -> None:
    assert read_request({"gpu-fraction": "1024"}) == GpuRequest(
        fraction_text="1024", whole_gpus=1024
    )
