"""Batched admission lines: in order, whole lines, at most PIPE_BUF bytes per write, on time."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from webhook.server import json_logs
from webhook.server.json_logs import PIPE_BUF, LineBatcher


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)


def drain(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every ``os.write`` the batcher makes (the writes still happen)."""
    sizes: list[int] = []
    real_write = os.write

    def recording_write(fd: int, data: bytes) -> int:
        sizes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(json_logs.os, "write", recording_write)
    return sizes


def line(index: int, size: int = 300) -> bytes:
    text = f'{{"uid":"{index}","pad":"'
    return (text + "x" * (size - len(text) - 3) + '"}\n').encode()


def test_nothing_is_written_before_the_batch_is_due(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    batcher = LineBatcher(write_end, max_age=60)
    batcher.add(line(1))
    remaining = batcher.flush_due()
    assert drain(read_end) == b""
    assert remaining is not None and 59 < remaining <= 60
    assert batcher.seconds_until_due() == pytest.approx(remaining, abs=1)
    batcher.flush()
    assert drain(read_end) == line(1)
    assert batcher.seconds_until_due() is None


def test_a_due_batch_is_written_by_the_loop(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    batcher = LineBatcher(write_end, max_age=0.05)
    batcher.add(line(1))
    time.sleep(0.06)
    assert batcher.seconds_until_due() == 0.0
    assert batcher.flush_due() is None
    assert drain(read_end) == line(1)


def test_lines_leave_in_order_in_whole_lines_within_pipe_buf(
    pipe: tuple[int, int], writes: list[int]
) -> None:
    read_end, write_end = pipe
    batcher = LineBatcher(write_end, max_age=60)
    lines = [line(index) for index in range(40)]  # 12000 bytes: several batches
    for each in lines:
        batcher.add(each)
    batcher.flush()
    assert drain(read_end) == b"".join(lines)
    assert writes == [3900, 3900, 3900, 300]  # 13 lines of 300 bytes fit in 4096


def test_a_line_longer_than_pipe_buf_goes_out_alone_after_the_pending_ones(
    pipe: tuple[int, int], writes: list[int]
) -> None:
    read_end, write_end = pipe
    batcher = LineBatcher(write_end, max_age=60)
    batcher.add(line(1))
    batcher.add(line(2, size=PIPE_BUF + 100))
    batcher.add(line(3))
    batcher.flush()
    assert drain(read_end) == line(1) + line(2, size=PIPE_BUF + 100) + line(3)
    assert writes == [300, PIPE_BUF + 100, 300]
