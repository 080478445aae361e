"""``__all__`` of the integration modules is complete and resolves (as tests/test_exported_members.py)."""

from __future__ import annotations

import pytest

from tests import test_exported_members as members

MODULES = [
    "recoverygate.integrations",
    "recoverygate.integrations._common",
    "recoverygate.integrations.auto",
    "recoverygate.integrations.dcp",
    "recoverygate.integrations.transformers",
    "recoverygate.integrations.lightning",
    "recoverygate.integrations.pytorch_lightning",
]


@pytest.mark.filterwarnings("ignore")  # resolving RecoveryGateCallback imports the framework
@pytest.mark.parametrize("name", MODULES)
def test_the_integrations_export_what_they_define(name: str) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    members.test_all_is_complete_and_resolves(name)
