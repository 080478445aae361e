"""RecoveryGate's benchmarks: each figure is a ratio against a limit measured in the same run.

Run them all with ``python bench/run_all.py [--quick] [--only NAME]``; see bench/README.md.
"""
