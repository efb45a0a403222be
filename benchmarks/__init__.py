"""Benchmarks and profilers, run on a GPU machine (`benchmarks/device_*.sh`); outside the served code.

Results are written as JSON. The results of record are in `benchmarks/results/`, one file each with the command that
produced it; `BENCHMARKS.md` says what each measures and how to rerun it.
"""
