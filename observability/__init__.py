"""Metrics, traces and logs for the service."""
