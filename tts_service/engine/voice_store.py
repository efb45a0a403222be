"""Registered voices, kept in a directory (one file per voice, written atomically) or in memory.

The store is the one place that decides who sees a voice: a voice belongs to its owner, and any other owner is told
it does not exist, exactly as for an id never created. Every read decodes and checks the voice again, so that a file
damaged on disk, or written by another replica sharing the directory, is judged when it is used: a damaged one is
logged (once) and treated as absent, never served. So is an entry under a voice's name that is not a regular file
(a FIFO, a device, a directory, a symbolic link) or is larger than a voice may be: reading a FIFO would block every
later call of the one worker thread, and a link would serve a file from outside the directory.

Its methods block on the disk: the engine calls them from a worker thread, one at a time, which also makes the check
of the count limit and the write that follows it one step.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tts_service.engine.voice_files import (
    CorruptVoiceError,
    RegisteredVoice,
    VoiceKind,
    VoiceShape,
    decode_voice,
    encode_voice,
)
from tts_service.model.prompts import VoiceClone

logger = logging.getLogger(__name__)

VOICE_ID_PATTERN = re.compile(r"voice_[0-9a-f]{24}")
_SUFFIX = ".safetensors"
_TEMP_PREFIX = ".tmp-"
# A temporary file this old is a write that never finished (a crash), not one another replica is still making.
_ABANDONED_WRITE_AGE_S = 600.0
# O_NOFOLLOW: a link planted under a voice's name is refused, not followed out of the directory. O_NONBLOCK: opening a
# FIFO returns at once instead of waiting for a writer; it changes nothing for a regular file.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Entries that open refuses outright, with those flags, for not being files.
_UNOPENABLE_KINDS = {errno.ELOOP: "a symbolic link", errno.ENXIO: "a socket or a device with no driver"}
_NON_REGULAR_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                      (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def is_voice_id(text: str) -> bool:
    """Whether `text` has the form of a voice id (which also keeps any other path out of the directory)."""
    return VOICE_ID_PATTERN.fullmatch(text) is not None


class VoiceNotFoundError(LookupError):
    """No voice has this id for this owner."""

    def __init__(self, voice_id: str) -> None:
        super().__init__(f"no voice {voice_id!r}")
        self.voice_id = voice_id

    def __reduce__(self) -> tuple[type[VoiceNotFoundError], tuple[str]]:
        return type(self), (self.voice_id,)


class VoiceStoreFullError(Exception):
    """A new voice would pass a limit of the store; the message names it."""


class VoiceStoreUnusableError(Exception):
    """The voice-store directory cannot be made or written; the message names the flag and the directory."""


@dataclass(frozen=True)
class VoiceLimits:
    max_voices: int
    max_voice_bytes: int
    max_voices_per_owner: int


class Storage(Protocol):
    """Where the encoded voices live."""

    def read(self, voice_id: str) -> bytes | None: ...
    def write(self, voice_id: str, data: bytes) -> None: ...
    def delete(self, voice_id: str) -> bool: ...
    def ids(self) -> list[str]: ...


class MemoryStorage:
    """Voices for the life of the process (no --voice-store)."""

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    def read(self, voice_id: str) -> bytes | None:
        return self._files.get(voice_id)

    def write(self, voice_id: str, data: bytes) -> None:
        self._files[voice_id] = data

    def delete(self, voice_id: str) -> bool:
        return self._files.pop(voice_id, None) is not None

    def ids(self) -> list[str]:
        return list(self._files)


class DirectoryStorage:
    """One `<voice id>.safetensors` file per voice. A file appears whole or not at all: it is written under a
    temporary name, flushed to disk, then renamed, and the directory is flushed after every rename and removal.
    Only a regular file of at most `max_file_bytes` is read as a voice."""

    def __init__(self, directory: Path, max_file_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.max_file_bytes = max_file_bytes

    def check_writable(self) -> None:
        """Raise OSError now, at start-up, when a voice could not be written here later."""
        descriptor, temporary = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=self.directory)
        os.close(descriptor)
        Path(temporary).unlink()

    def read(self, voice_id: str) -> bytes | None:
        """The voice's file, or None when there is none. CorruptVoiceError when the entry is not a regular file or
        is larger than a voice may be; the kind of entry is judged on the opened descriptor, so that it cannot be
        swapped between the check and the read."""
        try:
            descriptor = os.open(self._path(voice_id), _READ_FLAGS)
        except FileNotFoundError:
            return None
        except PermissionError:  # another user's file, say: this entry alone cannot be served
            raise CorruptVoiceError("not readable by the server (permission denied)") from None
        except OSError as error:
            if error.errno in _UNOPENABLE_KINDS:
                raise CorruptVoiceError(f"not a regular file but {_UNOPENABLE_KINDS[error.errno]}") from None
            raise
        try:
            _require_regular_file(os.fstat(descriptor).st_mode)
            return _read_at_most(descriptor, self.max_file_bytes)
        finally:
            os.close(descriptor)

    def write(self, voice_id: str, data: bytes) -> None:
        descriptor, temporary = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=self.directory)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            # A rename replaces whatever entry holds the name, a planted link included, and never writes through it.
            os.replace(temporary, self._path(voice_id))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._sync_directory()

    def delete(self, voice_id: str) -> bool:
        try:
            self._path(voice_id).unlink()
        except FileNotFoundError:
            return False
        self._sync_directory()
        return True

    def ids(self) -> list[str]:
        return [path.name.removesuffix(_SUFFIX) for path in self.directory.glob(f"*{_SUFFIX}")
                if is_voice_id(path.name.removesuffix(_SUFFIX))]

    def remove_abandoned_writes(self) -> None:
        """Temporary files left by a write that a crash cut short: reported, and removed."""
        for path in self.directory.glob(f"{_TEMP_PREFIX}*"):
            try:
                status = path.lstat()
                # The store's writes are regular files: any other entry under the prefix is not one of them, and
                # unlinking a directory would fail, stopping the server at start.
                if stat.S_ISREG(status.st_mode) and time.time() - status.st_mtime >= _ABANDONED_WRITE_AGE_S:
                    logger.warning("voice store: removing %s, a write that never finished", path)
                    path.unlink()
            except FileNotFoundError:  # its writer finished, or another replica removed it
                continue

    def _path(self, voice_id: str) -> Path:
        return self.directory / f"{voice_id}{_SUFFIX}"

    def _sync_directory(self) -> None:
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


class VoiceStore:
    def __init__(self, storage: Storage, limits: VoiceLimits, shape: VoiceShape) -> None:
        self.storage = storage
        self.limits = limits
        self._shape = shape
        self._reported: set[tuple[str, str]] = set()  # (voice id, reason) already logged

    @classmethod
    def open(cls, directory: Path | None, limits: VoiceLimits, shape: VoiceShape) -> VoiceStore:
        """The store in `directory` (created when missing), or in memory; reports its unusable entries."""
        if directory is None:
            logger.info("voice store: in memory, registered voices end with the process")
            return cls(MemoryStorage(), limits, shape)
        try:
            storage = DirectoryStorage(directory, limits.max_voice_bytes)
            storage.check_writable()
            storage.remove_abandoned_writes()
        except OSError as error:
            raise VoiceStoreUnusableError(f"--voice-store {directory}: {error.strerror or error}") from error
        store = cls(storage, limits, shape)
        logger.info("voice store: %d voice(s) in %s", len(store._usable()), directory)
        return store

    @property
    def is_persistent(self) -> bool:
        return isinstance(self.storage, DirectoryStorage)

    def check_room(self, owner: str) -> None:
        """Raise VoiceStoreFullError when the owner may add no voice: the store or the owner's share is full. Only
        voices that can be served count: an unusable entry (reported at open) is no voice a caller could delete."""
        limits = self.limits
        voices = self._usable()
        if len(voices) >= limits.max_voices:
            raise VoiceStoreFullError(f"the server already stores {limits.max_voices} voices, the most it "
                                      "keeps (--max-voices); delete one first")
        if sum(1 for voice in voices if voice.owner == owner) >= limits.max_voices_per_owner:
            raise VoiceStoreFullError(f"this caller already has {limits.max_voices_per_owner} voices, the most one "
                                      "caller may keep (--max-voices-per-caller); delete one first")

    def create(self, clone: VoiceClone, reference_seconds: float, owner: str) -> RegisteredVoice:
        kind = VoiceKind.X_VECTOR if clone.reference_codes is None else VoiceKind.IN_CONTEXT
        # An x-vector voice is cloned from the embedding alone: a transcript sent with it was never used.
        reference_text = (clone.reference_text or "") if kind is VoiceKind.IN_CONTEXT else ""
        voice = RegisteredVoice(voice_id=f"voice_{secrets.token_hex(12)}", owner=owner, kind=kind,
                                reference_seconds=reference_seconds, reference_text=reference_text,
                                created_at=time.time(), clone=clone)
        data = encode_voice(voice)
        if len(data) > self.limits.max_voice_bytes:
            raise VoiceStoreFullError(f"the voice takes {len(data)} bytes, more than the {self.limits.max_voice_bytes} "
                                      "one voice may take (--max-voice-bytes); use a shorter reference recording, "
                                      "or x_vector_only")
        self.check_room(owner)
        self.storage.write(voice.voice_id, data)
        return voice

    def get(self, voice_id: str, owner: str) -> RegisteredVoice:
        voice = self._read(voice_id) if is_voice_id(voice_id) else None
        if voice is None or voice.owner != owner:
            raise VoiceNotFoundError(voice_id)
        return voice

    def owned_by(self, owner: str) -> list[RegisteredVoice]:
        """The owner's voices, oldest first."""
        return sorted((voice for voice in self._usable() if voice.owner == owner),
                      key=lambda voice: (voice.created_at, voice.voice_id))

    def _usable(self) -> list[RegisteredVoice]:
        voices = (self._read(voice_id) for voice_id in self.storage.ids())
        return [voice for voice in voices if voice is not None]

    def delete(self, voice_id: str, owner: str) -> None:
        self.get(voice_id, owner)
        if not self.storage.delete(voice_id):
            raise VoiceNotFoundError(voice_id)

    def _read(self, voice_id: str) -> RegisteredVoice | None:
        try:
            data = self.storage.read(voice_id)
            return None if data is None else decode_voice(data, voice_id, self._shape)
        except CorruptVoiceError as error:
            if (voice_id, str(error)) not in self._reported:
                self._reported.add((voice_id, str(error)))
                logger.error("voice store: skipping voice %s, which cannot be served: %s", voice_id, error)
            return None


def _require_regular_file(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for is_kind, name in _NON_REGULAR_KINDS if is_kind(mode)), "an unknown kind of entry")
        raise CorruptVoiceError(f"not a regular file but {kind}")


def _read_at_most(descriptor: int, max_bytes: int) -> bytes:
    """The file's bytes, reading at most one byte past `max_bytes`: CorruptVoiceError when that byte is there, so
    that a file growing while it is read is bounded too."""
    parts: list[bytes] = []
    remaining = max_bytes + 1
    while remaining > 0 and (part := os.read(descriptor, remaining)):
        parts.append(part)
        remaining -= len(part)
    if remaining == 0:
        raise CorruptVoiceError(f"larger than the {max_bytes} bytes a voice may take (--max-voice-bytes)")
    return b"".join(parts)
