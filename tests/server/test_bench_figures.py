"""The admission benchmark's arithmetic: wrk output parsed, ratios paired per round."""

from __future__ import annotations

import pytest

from bench.admission_bench import Measurement, paired_ratios, parse_wrk, report_peers

WRK_OUTPUT = """Running 4s test @ https://127.0.0.1:40000/mutate
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.91ms    1.20ms  30.10ms   90.00%
  Latency Distribution
     50%    2.68ms
     75%    3.10ms
     90%    4.02ms
     99%   10.06ms
  10144 requests in 4.00s, 3.10MB read
  Socket errors: connect 0, read 1, write 0, timeout 2
  Non-2xx or 3xx responses: 4
Requests/sec:   2536.00
Transfer/sec:    792.00KB
"""


def test_wrk_output_is_parsed() -> None:
    measurement = parse_wrk(WRK_OUTPUT)
    assert measurement.requests_per_second == 2536.0
    assert measurement.p50_ms == pytest.approx(2.68)
    assert measurement.p99_ms == pytest.approx(10.06)
    assert measurement.errors == 7  # socket errors and non-2xx answers both count


def test_ratios_are_paired_round_by_round() -> None:
    # Round 2 ran in a slow spell for the floor only, round 3 for the service only: each
    # round's ratio is taken first, so one bad round of either side does not decide.
    floor = [Measurement(1000, 1, 10, 0), Measurement(400, 1, 40, 0), Measurement(1100, 1, 9, 0)]
    service = [Measurement(900, 1, 11, 0), Measurement(380, 1, 42, 0), Measurement(500, 1, 30, 0)]
    rps, p99 = paired_ratios(floor, service)
    assert rps == pytest.approx(0.9)  # ratios 0.9, 0.95, 0.45
    assert p99 == pytest.approx(1.1)  # ratios 1.1, 1.05, 3.33


def test_the_peers_report_gives_each_side_and_the_ratios_of_the_same_rounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Two rounds: the service 0.24 and 0.30 ms at p50 against the peer's 0.15 and 0.15.
    samples = {
        ("service", 1): [Measurement(4000, 0.24, 1, 0, 240), Measurement(3000, 0.30, 1, 0, 300)],
        ("peer", 1): [Measurement(6000, 0.15, 1, 0, 200), Measurement(6000, 0.15, 1, 0, 200)],
        ("floor", 1): [Measurement(6000, 0.15, 1, 0, 150), Measurement(6000, 0.15, 1, 0, 150)],
        ("noop", 1): [Measurement(20000, 0.04, 1, 0, 40), Measurement(20000, 0.04, 1, 0, 40)],
    }
    report_peers(samples, (1,))
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("   1 |")]
    assert line.split("|")[2].split() == ["1.80", "1.35"]  # medians of 1.6, 2.0 and 1.2, 1.5
    assert "0.270 /   270" in line  # the median measurement: the two rounds' middle
