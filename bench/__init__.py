"""Benchmarks: orchestration overhead, recovery time and goodput, measured side by side.

``python -m bench --help``. Each figure is a ratio or a count measured in one run on the local CPU
Ray cluster; results go to ``bench/results/*.json`` and a printed table (see bench/README.md).
"""
