"""Continuous-batching scheduler: decides which requests run each engine step. Pure Python, no torch."""
