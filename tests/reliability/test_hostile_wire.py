"""A hostile progress line cannot stop the drill from reading the job's output.

Fool6 finding 1: a job that printed a loss no float can hold (a 400-digit integer,
``1e400``, JSON's ``NaN`` literal) made the wire raise OverflowError; through
:meth:`StreamEventSource.attach_pipe` the reader thread died and closed the job's stdout
pipe (the job's next write got EPIPE). Here, through a real ``os.pipe``: every hostile line is
counted malformed, every later line is still read, and the pipe stays open.
"""

from __future__ import annotations

import os
import threading

import pytest

from pytest_recoverygate.shared.events import StreamEventSource
from tests.patience import PROCESS, within

HOSTILE = [
    "1" + "0" * 400,
    "-" + "9" * 320,
    "4" * 4000,
    "1e400",
    "NaN",
    "-Infinity",
    "[" * 1500 + "]" * 1500,
]


def progress(step: int, loss: str = "0.5") -> bytes:
    return (
        f'RECOVERYGATE/v1 {{"event":"progress","time":2.5,"inc":"ab","step":{step},'
        f'"loss":{loss}}}\n'
    ).encode()


@pytest.mark.parametrize("loss", HOSTILE)
def test_a_hostile_loss_is_malformed_and_the_reader_keeps_reading(loss: str) -> None:
    errors: list[BaseException] = []
    old_hook = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        errors.append(args.exc_value or RuntimeError("a reader thread died"))

    threading.excepthook = hook
    read_fd, write_fd = os.pipe()
    source = StreamEventSource()
    try:
        thread = source.attach_pipe(read_fd)
        os.write(write_fd, progress(3, loss))
        for step in (4, 5, 6):  # EPIPE here if the reader died and closed the pipe
            os.write(write_fd, progress(step))
        os.close(write_fd)
        thread.join(within(PROCESS))
        assert not thread.is_alive()
        events = source.poll()
    finally:
        threading.excepthook = old_hook
        source.close()
    assert not errors, errors
    assert [e.step for e in events] == [4, 5, 6]
    assert source.malformed_lines == 1
