"""Who a call comes from, so that no single caller can take all of the service.

With API keys, a call presents exactly one credential (`authorization: Bearer KEY` or `x-api-key: KEY`), and the
key that authenticated it is the caller (several clients sharing a key are one caller) and the owner of the voices
it registers. The ElevenLabs-compatible WebSocket route also takes ElevenLabs' own header, `xi-api-key: KEY`
(`ELEVENLABS_CREDENTIAL_HEADERS`), as one more place for the one credential. Two credentials are refused rather
than resolved: taking the caller from one and the permission from another let one valid key pose as any number of
callers. Without keys the caller is the peer's address, loopback over IPv4 and IPv6 being one address, and every
caller shares one namespace of voices.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from tts_service.api.errors import ApiError

CREDENTIAL_HEADERS = ("authorization", "x-api-key")
# ElevenLabs' clients send their key in this header only; accepted on the ElevenLabs-compatible route alone.
ELEVENLABS_CREDENTIAL_HEADERS = (*CREDENTIAL_HEADERS, "xi-api-key")
LOOPBACK_CALLER = "loopback"

Metadata = Iterable[tuple[str, str | bytes]]


@dataclass(frozen=True)
class Identity:
    caller: str  # whom the per-caller limits count: a key's short digest, or a peer address
    owner: str  # whose registered voices the call sees: a key's digest, or "" (one shared namespace)


def unauthenticated(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.UNAUTHENTICATED, message)


class Credentials:
    """The server's API keys and the rule for presenting one. Keys are compared in constant time with every
    configured key, so that timing reveals nothing about them."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [key.encode() for key in keys]

    @property
    def is_required(self) -> bool:
        return bool(self._keys)

    def authenticate(self, metadata: Metadata, headers: tuple[str, ...] = CREDENTIAL_HEADERS) -> str | None:
        """The key the call authenticated with (None when the server has no keys); raises an UNAUTHENTICATED
        ApiError for no credential, more than one, or one that is not a configured key. `headers` are the names a
        credential may come in (every one of them counts towards the one credential)."""
        if not self._keys:
            return None
        how = _how_to_authenticate(headers)
        presented = [(name, _text(value)) for name, value in metadata if name in headers]
        if not presented:
            raise unauthenticated(f"a valid API key is required: {how}")
        if len(presented) > 1:
            names = ", ".join(name for name, _ in presented)
            raise unauthenticated(f"a call presents exactly one credential, this one presented {len(presented)} "
                                  f"({names}): {how}")
        name, value = presented[0]
        key = _bearer_token(value) if name == "authorization" else value
        if key is None:
            raise unauthenticated(f"authorization: only the Bearer scheme is accepted: {how}")
        if not any([hmac.compare_digest(key.encode(), accepted) for accepted in self._keys]):
            raise unauthenticated(f"the API key is not valid: {how}")
        return key

    def identity(self, metadata: Metadata, peer: str, headers: tuple[str, ...] = CREDENTIAL_HEADERS) -> Identity:
        """The caller and owner of a call from `peer` (gRPC's spelling, "ipv4:10.0.0.7:5123"). A key is kept only
        as a digest, so that the key itself is never held longer than the call."""
        key = self.authenticate(metadata, headers)
        if key is None:
            return Identity(caller=peer_address(peer), owner="")
        digest = hashlib.sha256(key.encode()).hexdigest()
        return Identity(caller="key:" + digest[:16], owner=digest)

    def identity_of(self, context: grpc.aio.ServicerContext) -> Identity:
        return self.identity(context.invocation_metadata() or (), context.peer() or "unknown")


def peer_address(peer: str) -> str:
    """A peer's address without its port, the same client one caller through either front door: "ipv4:10.0.0.7",
    "ipv6:2001:db8::7"; an IPv4 address mapped into IPv6 as IPv4; every loopback address as one."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = address.rpartition(":")[0] or address
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return f"{kind}:{host}"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK_CALLER
    return f"ipv{ip.version}:{ip}"


def _how_to_authenticate(headers: tuple[str, ...]) -> str:
    ways = [f"'{name}: Bearer KEY'" if name == "authorization" else f"'{name}: KEY'" for name in headers]
    return f"send one of {', '.join(ways[:-1])} or {ways[-1]}"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _bearer_token(value: str) -> str | None:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None
