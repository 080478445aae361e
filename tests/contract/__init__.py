"""One contract-test suite run against every Orchestrator implementation."""
