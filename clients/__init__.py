"""Clients for the service."""
