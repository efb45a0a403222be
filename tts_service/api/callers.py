"""Who a call comes from, so that no single caller can take all of the service: the API key it presented when
the server has keys (several clients sharing a key are one caller), otherwise its peer's address."""

from __future__ import annotations

import hashlib
import hmac
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


def has_valid_key(metadata: Iterable[tuple[str, str | bytes]], keys: Iterable[bytes]) -> bool:
    """Whether any key presented in `metadata` (names in lower case) is one of `keys`."""
    accepted = list(keys)
    for presented in presented_keys(metadata):
        # Compare with every key, in constant time, so timing reveals nothing about them.
        if any([hmac.compare_digest(presented.encode(), key) for key in accepted]):
            return True
    return False


def caller_of(context: grpc.aio.ServicerContext, uses_keys: bool) -> str:
    return caller_from(context.invocation_metadata() or (), context.peer() or "unknown", uses_keys)


def caller_from(metadata: Iterable[tuple[str, str | bytes]], peer: str, uses_keys: bool) -> str:
    """The caller's identity. A key is kept only as a digest, so that the key itself is never held longer than the
    call; a peer (gRPC's spelling: "ipv4:10.0.0.7:5123") is its address without the port ("ipv4:10.0.0.7",
    "ipv6:[::1]"), so that the same client is one caller through either front door."""
    if uses_keys:
        key = next(presented_keys(metadata), "")
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        address = address.rpartition(":")[0] or address
    return f"{kind}:{address}"


def owner_of(context: grpc.aio.ServicerContext, uses_keys: bool) -> str:
    return owner_from(context.invocation_metadata() or (), uses_keys)


def owner_from(metadata: Iterable[tuple[str, str | bytes]], uses_keys: bool) -> str:
    """Who owns the registered voices a call creates and sees: a digest of its API key (the key itself is never
    stored), or "" for the one namespace that every caller shares when the server has no keys."""
    if not uses_keys:
        return ""
    key = next(presented_keys(metadata), "")
    return hashlib.sha256(key.encode()).hexdigest()
