"""Registered lexicons: kept per owner (the API key's owner string, "" when the server has no keys), in memory and,
given a directory, also on disk, one JSON file per lexicon, so that they outlive the process.

An owner never sees another owner's lexicons: any other owner is told a lexicon does not exist, exactly as for an id
never created. Ids are random and URL-safe (`lex_` and 22 characters from 16 random bytes), so not guessable.

The directory is read once, when the store opens; every lexicon is then served from memory (a request naming one
reads no disk). A file that is not a whole, valid lexicon (cut short, damaged, of another format or id) is logged
once and skipped, never served; so is any entry that is not a regular file (a symbolic link is not followed out of
the directory, a FIFO never blocks the read), and any entry that is not the store's at all. A file appears whole or
not at all: it is written under a temporary name, flushed, then renamed over its own name, and the directory is
flushed after every rename and removal. Replicas sharing a directory see each other's lexicons only from their next
start: give each server its own directory (for example `<voice store>/lexicons`).

Creating and deleting write to the disk (a few milliseconds, flushes included): call them from a worker thread where
the event loop must not wait. Every method may be called from any thread.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tts_service.api.errors import ApiError, invalid
from tts_service.api.lexicons import Lexicon, LexiconEntry

logger = logging.getLogger(__name__)

LEXICON_ID_PREFIX = "lex_"
LEXICON_ID_PATTERN = re.compile(r"lex_[A-Za-z0-9_-]{22}")
DEFAULT_MAX_LEXICONS = 1_000
DEFAULT_MAX_LEXICONS_PER_OWNER = 100
# The largest lexicon (MAX_ENTRIES entries of the longest grapheme and alias, 4 bytes a character) with room to spare.
MAX_FILE_BYTES = 4 * 1024 * 1024
_FORMAT = "qwen3-tts-lexicon/1"
_SUFFIX = ".json"
_TEMP_PREFIX = ".tmp-"
# A temporary file this old is a write that a crash cut short, not one still being made.
_ABANDONED_WRITE_AGE_S = 600.0
# O_NOFOLLOW: a link planted under a lexicon's name is refused, not followed out of the directory. O_NONBLOCK:
# opening a FIFO returns at once instead of waiting for a writer; it changes nothing for a regular file.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_UNOPENABLE_KINDS = {errno.ELOOP: "a symbolic link", errno.ENXIO: "a socket or a device with no driver"}


def is_lexicon_id(text: str) -> bool:
    """Whether `text` has the form of a lexicon id (which also keeps any other path out of the directory)."""
    return LEXICON_ID_PATTERN.fullmatch(text) is not None


class LexiconNotFoundError(ApiError):
    """No lexicon has this id for this owner; a NOT_FOUND status naming `field`."""

    def __init__(self, lexicon_id: str, field: str = "lexicon_id") -> None:
        # Only an id of the right form is echoed: anything else could be any length and anything at all.
        shown = repr(lexicon_id) if is_lexicon_id(lexicon_id) else "of that id (it is not of the form lex_...)"
        super().__init__(grpc.StatusCode.NOT_FOUND, f"{field}: no lexicon {shown}", field=field)
        self.lexicon_id = lexicon_id


class LexiconStoreFullError(ApiError):
    """A new lexicon would pass a limit of the store; a RESOURCE_EXHAUSTED status whose message names the limit."""

    def __init__(self, message: str) -> None:
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


class LexiconStoreUnusableError(Exception):
    """The directory cannot be made, read or written; the message names it."""


class CorruptLexiconError(ValueError):
    """A stored file that is not a whole, valid lexicon; the message says why."""


@dataclass(frozen=True)
class LexiconLimits:
    max_lexicons: int = DEFAULT_MAX_LEXICONS
    max_lexicons_per_owner: int = DEFAULT_MAX_LEXICONS_PER_OWNER

    def __post_init__(self) -> None:
        if self.max_lexicons < 1 or self.max_lexicons_per_owner < 1:
            raise ValueError(f"lexicon limits must be at least 1: {self}")


@dataclass(frozen=True)
class RegisteredLexicon:
    lexicon_id: str
    owner: str
    created_at: float  # Unix time
    lexicon: Lexicon


class LexiconStore:
    def __init__(self, directory: Path | None, limits: LexiconLimits,
                 lexicons: dict[str, RegisteredLexicon] | None = None) -> None:
        self.directory = directory
        self.limits = limits
        self._lexicons = dict(lexicons or {})
        self._lock = threading.Lock()  # makes a limit check and the write that follows it one step

    @classmethod
    def open(cls, directory: Path | None, limits: LexiconLimits | None = None) -> LexiconStore:
        """The store kept in `directory` (created when missing) with the lexicons found there, or in memory."""
        limits = limits or LexiconLimits()
        if directory is None:
            logger.info("lexicon store: in memory, registered lexicons end with the process")
            return cls(None, limits)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            _check_writable(directory)
            lexicons = _read_directory(directory)
        except OSError as error:
            raise LexiconStoreUnusableError(f"lexicon store {directory}: {error.strerror or error}") from error
        logger.info("lexicon store: %d lexicon(s) in %s", len(lexicons), directory)
        return cls(directory, limits, lexicons)

    @property
    def is_persistent(self) -> bool:
        return self.directory is not None

    def create(self, owner: str, lexicon: Lexicon) -> str:
        """Keep `lexicon` for `owner`; its new id. LexiconStoreFullError when a limit is reached."""
        if not lexicon.entries:
            raise invalid("lexicon.entries", "is empty; a lexicon needs at least one entry")
        registered = RegisteredLexicon(f"{LEXICON_ID_PREFIX}{secrets.token_urlsafe(16)}", owner, time.time(), lexicon)
        with self._lock:
            self._check_room(owner)
            if self.directory is not None:
                _write_atomically(self.directory, registered.lexicon_id, _encode(registered))
            self._lexicons[registered.lexicon_id] = registered
        return registered.lexicon_id

    def get(self, owner: str, lexicon_id: str, field: str = "lexicon_id") -> RegisteredLexicon:
        """The owner's lexicon; LexiconNotFoundError (naming `field`) when it has none of this id."""
        with self._lock:
            registered = self._lexicons.get(lexicon_id)
        if registered is None or registered.owner != owner:
            raise LexiconNotFoundError(lexicon_id, field)
        return registered

    def list(self, owner: str) -> tuple[RegisteredLexicon, ...]:
        """The owner's lexicons, oldest first."""
        with self._lock:
            owned = [registered for registered in self._lexicons.values() if registered.owner == owner]
        return tuple(sorted(owned, key=lambda registered: (registered.created_at, registered.lexicon_id)))

    def delete(self, owner: str, lexicon_id: str, field: str = "lexicon_id") -> None:
        with self._lock:
            registered = self._lexicons.get(lexicon_id)
            if registered is None or registered.owner != owner:
                raise LexiconNotFoundError(lexicon_id, field)
            if self.directory is not None:
                _delete(self.directory, lexicon_id)
            del self._lexicons[lexicon_id]

    def _check_room(self, owner: str) -> None:
        limits = self.limits
        if len(self._lexicons) >= limits.max_lexicons:
            raise LexiconStoreFullError(f"the server already stores {limits.max_lexicons} lexicons, the most it keeps "
                                        "(--max-lexicons); delete one first")
        owned = sum(1 for registered in self._lexicons.values() if registered.owner == owner)
        if owned >= limits.max_lexicons_per_owner:
            raise LexiconStoreFullError(f"this caller already has {limits.max_lexicons_per_owner} lexicons, the most "
                                        "one caller may keep (--max-lexicons-per-caller); delete one first")


def _encode(registered: RegisteredLexicon) -> bytes:
    document = {"format": _FORMAT, "lexicon_id": registered.lexicon_id, "owner": registered.owner,
                "created_at": registered.created_at,
                "entries": [{"grapheme": entry.grapheme, "alias": entry.alias}
                            for entry in registered.lexicon.entries]}
    return json.dumps(document, ensure_ascii=False).encode()


def _decode(data: bytes, lexicon_id: str) -> RegisteredLexicon:
    """The lexicon stored as `data` under `lexicon_id`; CorruptLexiconError when it is not a whole, valid one."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CorruptLexiconError("not JSON") from None
    _require(isinstance(document, dict), "not a JSON object")
    _require(document.get("format") == _FORMAT, f"format {document.get('format')!r}, expected {_FORMAT!r}")
    _require(document.get("lexicon_id") == lexicon_id,
             f"holds lexicon {document.get('lexicon_id')!r}, not {lexicon_id!r}")
    owner, created_at, entries = document.get("owner"), document.get("created_at"), document.get("entries")
    _require(isinstance(owner, str), "no owner")
    _require(isinstance(created_at, int | float) and math.isfinite(created_at), "no creation time")
    _require(isinstance(entries, list) and all(_is_entry(entry) for entry in entries), "its entries are malformed")
    try:
        lexicon = Lexicon(tuple(LexiconEntry(entry["grapheme"], entry["alias"]) for entry in entries))
    except ApiError as error:
        raise CorruptLexiconError(error.message) from None
    return RegisteredLexicon(lexicon_id, owner, float(created_at), lexicon)


def _is_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("grapheme"), str)
            and isinstance(entry.get("alias"), str))


def _read_directory(directory: Path) -> dict[str, RegisteredLexicon]:
    """The valid lexicons in `directory`; what else is there is reported (once: the directory is read only here)."""
    lexicons: dict[str, RegisteredLexicon] = {}
    for name in sorted(os.listdir(directory)):
        path = directory / name
        if name.startswith(_TEMP_PREFIX):
            _remove_if_abandoned(path)
            continue
        lexicon_id = name.removesuffix(_SUFFIX)
        if not name.endswith(_SUFFIX) or not is_lexicon_id(lexicon_id):
            logger.warning("lexicon store: ignoring %s, which is not a lexicon's file", path)
            continue
        try:
            lexicons[lexicon_id] = _decode(_read_regular_file(path), lexicon_id)
        except (CorruptLexiconError, OSError) as error:  # one unreadable file costs that lexicon, not the store
            logger.error("lexicon store: skipping %s, which cannot be served: %s", path, error)
    return lexicons


def _read_regular_file(path: Path) -> bytes:
    """The file's bytes; CorruptLexiconError when it is not a regular file or is larger than a lexicon may be. The
    kind of entry is judged on the opened descriptor, so that it cannot be swapped between the check and the read."""
    try:
        descriptor = os.open(path, _READ_FLAGS)
    except OSError as error:
        if error.errno in _UNOPENABLE_KINDS:
            raise CorruptLexiconError(f"not a regular file but {_UNOPENABLE_KINDS[error.errno]}") from None
        raise
    try:
        _require(stat.S_ISREG(os.fstat(descriptor).st_mode), "not a regular file")
        # One byte past the limit is read, so that a file growing while it is read is bounded too.
        data = _read_at_most(descriptor, MAX_FILE_BYTES + 1)
    finally:
        os.close(descriptor)
    _require(len(data) <= MAX_FILE_BYTES, f"larger than the {MAX_FILE_BYTES} bytes a lexicon's file may take")
    return data


def _read_at_most(descriptor: int, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    remaining = max_bytes
    while remaining > 0 and (part := os.read(descriptor, remaining)):
        parts.append(part)
        remaining -= len(part)
    return b"".join(parts)


def _check_writable(directory: Path) -> None:
    """Raise OSError now, at start-up, when a lexicon could not be written here later."""
    descriptor, temporary = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=directory)
    os.close(descriptor)
    Path(temporary).unlink()


def _write_atomically(directory: Path, lexicon_id: str, data: bytes) -> None:
    descriptor, temporary = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        # A rename replaces whatever entry holds the name, a planted link included, and never writes through it.
        os.replace(temporary, directory / f"{lexicon_id}{_SUFFIX}")
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync_directory(directory)


def _delete(directory: Path, lexicon_id: str) -> None:
    (directory / f"{lexicon_id}{_SUFFIX}").unlink(missing_ok=True)
    _sync_directory(directory)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove_if_abandoned(path: Path) -> None:
    try:
        status = path.lstat()
        # The store's writes are regular files: any other entry under the prefix is not one of them.
        if stat.S_ISREG(status.st_mode) and time.time() - status.st_mtime >= _ABANDONED_WRITE_AGE_S:
            logger.warning("lexicon store: removing %s, a write that never finished", path)
            path.unlink()
    except FileNotFoundError:  # its writer finished
        return


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise CorruptLexiconError(reason)
