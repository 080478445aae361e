"""Fixtures of the slurm tests: the session cluster (tests/slurm/cluster_fixture.py,
registered for every folder by tests/conftest.py) and a per-test view of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.slurm_testcluster import SlurmCluster


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster; jobs a test submits are cancelled after it, and a node it left
    drained is RESUMEd (a node is never left drained for the next test)."""
    try:
        yield slurm_cluster
    finally:
        slurm_cluster.cancel_all()
        slurm_cluster.resume_drained()
