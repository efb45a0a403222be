"""Who a call comes from, so that no single caller can take all of the service: the API key it presented when
the server has keys (several clients sharing a key are one caller), otherwise its peer's address."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import grpc


def presented_keys(metadata: Iterable[tuple[str, str | bytes]]) -> Iterator[str]:
    """Keys sent as `authorization: Bearer KEY` or `x-api-key: KEY`, in the order sent."""
    for name, value in metadata:
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if name == "authorization" and text[:7].lower() == "bearer ":
            yield text[7:].strip()
        elif name == "x-api-key":
            yield text


def caller_of(context: grpc.aio.ServicerContext, uses_keys: bool) -> str:
    """The caller's identity. A key is kept only as a digest, so that the key itself is never held longer than the
    call; a peer is its address without the port ("ipv4:10.0.0.7", "ipv6:[::1]")."""
    if uses_keys:
        key = next(presented_keys(context.invocation_metadata() or ()), "")
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    peer = context.peer() or "unknown"
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        address = address.rpartition(":")[0] or address
    return f"{kind}:{address}"


def owner_of(context: grpc.aio.ServicerContext, uses_keys: bool) -> str:
    """Who owns the registered voices a call creates and sees: a digest of its API key (the key itself is never
    stored), or "" for the one namespace that every caller shares when the server has no keys."""
    if not uses_keys:
        return ""
    key = next(presented_keys(context.invocation_metadata() or ()), "")
    return hashlib.sha256(key.encode()).hexdigest()
