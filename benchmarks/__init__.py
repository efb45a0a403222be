"""Benchmarks and profilers, run on a GPU machine (`benchmarks/device_*.sh`); outside the served code.

Results are written as JSON and recorded, with the command that produced them, in `BENCHMARKS.md`.
"""
