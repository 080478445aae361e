"""Which kubernetes client these tests ran on (CI runs them on two generations)."""

from __future__ import annotations

import os

import pytest


def test_the_client_under_test_is_the_one_ci_asked_for() -> None:
    import kubernetes

    expected = os.environ.get("RECOVERYGATE_EXPECT_KUBERNETES")
    if not expected:
        pytest.skip(f"kubernetes {kubernetes.__version__}; no version requested")
    assert kubernetes.__version__ == expected
