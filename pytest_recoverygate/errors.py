"""RecoveryGate's exceptions.

::

    RecoveryGateError            base of everything we raise on purpose
    ├── ConfigError              the drill config is invalid (exit 2)
    ├── UsageError               the command line or the environment asks the impossible (exit 2)
    │   ├── ConfirmationRequired  a kill needs confirming and this run cannot ask
    │   ├── BaselineError       a report or allowance given to compare/history is unusable
    │   └── TranscriptError     a transcript given to rejudge is unusable (FILE:LINE: why)
    ├── DrillError               the drill could not be carried out (verdict ERROR, exit 3)
    │   ├── DiscoveryError       no workload, an ambiguous one, or the target is absent
    │   ├── PermissionDeniedError  the backend refused an operation we need
    │   └── BackendError         the backend failed in a way retries did not fix
    ├── ReportError              the drill ended but its report could not be written (exit 3)
    └── DrillInterrupted         Ctrl-C or SIGTERM during a drill (exit 130, after cleanup)
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

__all__ = [
    "BackendError",
    "BaselineError",
    "ConfigError",
    "ConfirmationRequired",
    "DiscoveryError",
    "DrillError",
    "DrillInterrupted",
    "PermissionDeniedError",
    "RecoveryGateError",
    "ReportError",
    "TranscriptError",
    "UsageError",
    "describe_exception",
    "pip_command_for",
]

#: Modules RecoveryGate imports only when a feature needs them, and how to get each.
#: Anything else missing is a broken install of a dependency, named as such.
_PIP_COMMANDS = {
    "kubernetes": "pip install 'kubernetes>=35'",
    "urllib3": "pip install 'kubernetes>=35'",
    "matplotlib": "pip install 'recoverygate[plot]'",
    "yaml": "pip install pyyaml",
    "torch": "pip install torch",
}


class RecoveryGateError(Exception):
    """Base class of every error RecoveryGate raises on purpose."""


class ConfigError(RecoveryGateError):
    """The drill config is invalid; the message names the file, key, line and fix."""


class UsageError(RecoveryGateError):
    """The command line or environment asks for something that cannot be done."""


class ConfirmationRequired(UsageError):
    """safety.requireConfirm is set and nothing confirmed the kill (no terminal, no --yes)."""


class BaselineError(UsageError):
    """A report, report folder or allowance given to compare or history cannot be used."""


class TranscriptError(UsageError):
    """A transcript given to ``recoverygate rejudge`` is unusable: missing, of another
    version, past a bound, or a line that is not what it should be (``FILE:LINE: why``)."""


class ReportError(RecoveryGateError):
    """The drill ended, but its report could not be written; ``result`` holds the verdict."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


class DrillError(RecoveryGateError):
    """The drill could not be carried out (the verdict is ERROR)."""


class DiscoveryError(DrillError):
    """No workload was found, it was ambiguous, or the target worker is absent."""


class PermissionDeniedError(DrillError):
    """The backend refused an operation the drill needs."""


class BackendError(DrillError):
    """The backend failed in a way that retrying did not fix."""


class DrillInterrupted(RecoveryGateError):
    """The drill was interrupted by Ctrl-C or SIGTERM (cleanup has run)."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(f"interrupted by {signal_name}")
        self.signal_name = signal_name
        self.result: Any = None  # the partial DrillResult, once cleanup has run

    def with_result(self, result: Any) -> DrillInterrupted:
        self.result = result
        return self


def pip_command_for(module: str) -> str:
    """The exact pip command that installs the top-level package ``module`` comes from."""
    top = module.split(".", 1)[0]
    return _PIP_COMMANDS.get(top, f"pip install {top}")


def describe_exception(exc: BaseException) -> str:
    """One line for an unexpected exception; a missing module says how to install it.

    ``ModuleNotFoundError: No module named 'kubernetes'`` becomes "the Python package
    'kubernetes' is not installed where RecoveryGate runs (…): pip install 'kubernetes>=35'".
    """
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (
            f"the Python package {exc.name.split('.', 1)[0]!r} is not installed in the "
            f"environment RecoveryGate runs in ({sys.executable}); install it with: "
            f"{pip_command_for(exc.name)}"
        )
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
