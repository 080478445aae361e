"""The CLI's live progress: one updating line on a terminal, timestamped lines otherwise."""

from __future__ import annotations

import io
import re

from pytest_recoverygate.cli import LiveStatus
from pytest_recoverygate.engine.machine import Phase
from pytest_recoverygate.runner import Status


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def statuses() -> list[Status]:
    waiting = Phase.WAITING_FOR_CHECKPOINT
    return [
        Status(waiting, "waiting for checkpoint >= step 40", 0.1, None, None, None, True),
        Status(waiting, "waiting for checkpoint >= step 40", 1.1, 12, None, None),
        Status(Phase.RECOVERING, "killed; waiting for a new incarnation", 2.0, 40, 0.5, 60.0, True),
        Status(Phase.DONE, "PASS: resumed from step 40", 3.0, 41, 1.5, 60.0, True),
    ]


def test_on_a_terminal_it_rewrites_one_status_line() -> None:
    stream = Terminal()
    live = LiveStatus(stream)
    for status in statuses():
        live(status)
    text = stream.getvalue()
    assert text.count("\r") == 4
    assert text.endswith("\n")
    assert text.count("\n") == 1  # only the final verdict ends the line
    assert "step 12" in text  # the step is shown while waiting
    assert "0.5s since kill / SLO 60s" in text


def test_off_a_terminal_it_prints_timestamped_lines_without_repeating_the_wait() -> None:
    stream = io.StringIO()
    live = LiveStatus(stream)
    for status in statuses():
        live(status)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # the periodic "still waiting" update is not repeated in CI logs
    assert all(re.match(r"\d\d:\d\d:\d\d \[", line) for line in lines)
    assert "\r" not in stream.getvalue()


def test_quiet_prints_nothing() -> None:
    stream = Terminal()
    live = LiveStatus(stream, quiet=True)
    for status in statuses():
        live(status)
    assert stream.getvalue() == ""
