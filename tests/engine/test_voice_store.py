"""The voice store on disk: whole files only, every damaged or foreign entry refused and logged, owners kept apart."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tts_service.engine.voice_files import VoiceShape
from tts_service.engine.voice_store import (
    DirectoryStorage,
    VoiceLimits,
    VoiceNotFoundError,
    VoiceStore,
    VoiceStoreFullError,
)
from tts_service.model.prompts import VoiceClone

SHAPE = VoiceShape(embedding_size=8, num_code_groups=4, device=torch.device("cpu"))
LIMITS = VoiceLimits(max_voices=10, max_voice_bytes=1 << 20, max_voices_per_owner=10)
IN_CONTEXT = VoiceClone(speaker_embedding=torch.linspace(-1, 1, 8), reference_codes=((1, 2, 3, 4), (5, 6, 7, 8)),
                        reference_text="Hello.")
UNSEEN_ID = "voice_" + "b" * 24


def open_store(directory: Path, limits: VoiceLimits = LIMITS, shape: VoiceShape = SHAPE) -> VoiceStore:
    return VoiceStore.open(directory, limits, shape)


def test_a_voice_read_back_after_reopening_is_the_one_stored(tmp_path: Path) -> None:
    created = open_store(tmp_path).create(IN_CONTEXT, 2.5, owner="alice")
    read = open_store(tmp_path).get(created.voice_id, "alice")
    assert torch.equal(read.clone.speaker_embedding, IN_CONTEXT.speaker_embedding)  # type: ignore[arg-type]
    assert read.clone.reference_codes == IN_CONTEXT.reference_codes
    assert (read.reference_text, read.reference_seconds, read.created_at) == ("Hello.", 2.5, created.created_at)


def damage_by_truncating(data: bytes) -> bytes:
    return data[:len(data) // 2]


def damage_by_flipping_a_tensor_bit(data: bytes) -> bytes:
    return data[:-3] + bytes([data[-3] ^ 0x01]) + data[-2:]


def damage_by_replacing_with_garbage(data: bytes) -> bytes:
    return b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"


@pytest.mark.parametrize("damage", [damage_by_truncating, damage_by_flipping_a_tensor_bit,
                                    damage_by_replacing_with_garbage])
def test_a_damaged_file_is_reported_at_open_and_never_served(tmp_path: Path, damage: object,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(tmp_path)
    kept = store.create(IN_CONTEXT, 1.0, owner="")
    damaged = store.create(IN_CONTEXT, 1.0, owner="")
    path = tmp_path / f"{damaged.voice_id}.safetensors"
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with caplog.at_level(logging.ERROR):
        reopened = open_store(tmp_path)
    assert f"skipping voice {damaged.voice_id}" in caplog.text
    assert [voice.voice_id for voice in reopened.owned_by("")] == [kept.voice_id]
    with pytest.raises(VoiceNotFoundError):
        reopened.get(damaged.voice_id, "")



def plant_a_fifo(store: Path, elsewhere: Path) -> str:
    os.mkfifo(store / f"{UNSEEN_ID}.safetensors")
    return UNSEEN_ID


def plant_a_link_to_a_valid_voice_elsewhere(store: Path, elsewhere: Path) -> str:
    voice = open_store(elsewhere).create(IN_CONTEXT, 1.0, owner="")
    (store / f"{voice.voice_id}.safetensors").symlink_to(elsewhere / f"{voice.voice_id}.safetensors")
    return voice.voice_id


def plant_a_directory(store: Path, elsewhere: Path) -> str:
    (store / f"{UNSEEN_ID}.safetensors").mkdir()
    return UNSEEN_ID


@pytest.mark.timeout(10)  # reading a FIFO with no writer would block for ever
@pytest.mark.parametrize(("plant", "kind"), [(plant_a_fifo, "a FIFO"),
                                             (plant_a_link_to_a_valid_voice_elsewhere, "a symbolic link"),
                                             (plant_a_directory, "a directory")])
def test_an_entry_that_is_not_a_regular_file_is_reported_once_and_treated_as_absent(
        tmp_path: Path, plant: Callable[[Path, Path], str], kind: str, caplog: pytest.LogCaptureFixture) -> None:
    store_path = tmp_path / "store"
    kept = open_store(store_path).create(IN_CONTEXT, 1.0, owner="")
    planted_id = plant(store_path, tmp_path / "elsewhere")
    with caplog.at_level(logging.ERROR):
        store = open_store(store_path)
        for _ in range(3):
            assert [voice.voice_id for voice in store.owned_by("")] == [kept.voice_id]
            with pytest.raises(VoiceNotFoundError):
                store.get(planted_id, "")
    reports = [record.getMessage() for record in caplog.records if planted_id in record.getMessage()]
    assert len(reports) == 1
    assert f"not a regular file but {kind}" in reports[0]


def test_a_file_larger_than_a_voice_may_take_is_reported_and_treated_as_absent(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    voice = open_store(tmp_path).create(IN_CONTEXT, 1.0, owner="")
    size = (tmp_path / f"{voice.voice_id}.safetensors").stat().st_size
    one_byte_short = replace(LIMITS, max_voice_bytes=size - 1)
    with caplog.at_level(logging.ERROR):
        assert open_store(tmp_path, limits=one_byte_short).owned_by("") == []
    assert f"skipping voice {voice.voice_id}" in caplog.text and "--max-voice-bytes" in caplog.text
    just_enough = replace(LIMITS, max_voice_bytes=size)
    assert [found.voice_id for found in open_store(tmp_path, limits=just_enough).owned_by("")] == [voice.voice_id]


def test_a_write_replaces_a_link_planted_at_its_name_and_never_writes_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"not the store's")
    storage = DirectoryStorage(tmp_path / "store", LIMITS.max_voice_bytes)
    planted = tmp_path / "store" / f"{UNSEEN_ID}.safetensors"
    planted.symlink_to(outside)
    storage.write(UNSEEN_ID, b"the voice")
    assert outside.read_bytes() == b"not the store's"
    assert not planted.is_symlink() and planted.read_bytes() == b"the voice"

def test_a_file_renamed_to_another_id_or_cloned_by_another_model_is_refused(tmp_path: Path) -> None:
    voice = open_store(tmp_path).create(IN_CONTEXT, 1.0, owner="")
    other_id = "voice_" + "a" * 24
    (tmp_path / f"{voice.voice_id}.safetensors").rename(tmp_path / f"{other_id}.safetensors")
    assert open_store(tmp_path).owned_by("") == []
    (tmp_path / f"{other_id}.safetensors").rename(tmp_path / f"{voice.voice_id}.safetensors")
    larger_model = VoiceShape(embedding_size=16, num_code_groups=4, device=torch.device("cpu"))
    assert open_store(tmp_path, shape=larger_model).owned_by("") == []
    assert [found.voice_id for found in open_store(tmp_path).owned_by("")] == [voice.voice_id]


def test_a_failed_write_leaves_neither_the_voice_nor_a_temporary_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path)

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError):
        store.create(IN_CONTEXT, 1.0, owner="")
    assert list(tmp_path.iterdir()) == []


def test_a_write_abandoned_by_a_crash_is_removed_at_open_and_a_recent_one_is_left(tmp_path: Path,
                                                                                   caplog: pytest.LogCaptureFixture
                                                                                   ) -> None:
    abandoned, recent = tmp_path / ".tmp-abandoned", tmp_path / ".tmp-recent"
    abandoned.write_bytes(b"half a voice")
    recent.write_bytes(b"another replica is writing this")
    an_hour_ago = time.time() - 3600
    os.utime(abandoned, (an_hour_ago, an_hour_ago))
    with caplog.at_level(logging.WARNING):
        assert open_store(tmp_path).owned_by("") == []
    assert not abandoned.exists() and recent.exists()
    assert "a write that never finished" in caplog.text



def test_an_old_temporary_entry_that_is_no_file_is_left_alone_and_the_store_still_opens(tmp_path: Path) -> None:
    not_a_write = tmp_path / ".tmp-not-a-write"
    not_a_write.mkdir()
    an_hour_ago = time.time() - 3600
    os.utime(not_a_write, (an_hour_ago, an_hour_ago))
    assert open_store(tmp_path).owned_by("") == []
    assert not_a_write.is_dir()

def test_another_owner_sees_nothing_and_cannot_delete(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    voice = store.create(IN_CONTEXT, 1.0, owner="alice")
    assert store.owned_by("bob") == []
    with pytest.raises(VoiceNotFoundError):
        store.delete(voice.voice_id, "bob")
    assert store.get(voice.voice_id, "alice").voice_id == voice.voice_id


def test_the_count_and_size_limits_refuse_a_new_voice(tmp_path: Path) -> None:
    store = open_store(tmp_path, limits=VoiceLimits(max_voices=1, max_voice_bytes=1 << 20, max_voices_per_owner=1))
    store.create(IN_CONTEXT, 1.0, owner="")
    with pytest.raises(VoiceStoreFullError, match="--max-voices"):
        store.create(IN_CONTEXT, 1.0, owner="")
    tiny = open_store(tmp_path / "tiny",
                      limits=VoiceLimits(max_voices=10, max_voice_bytes=100, max_voices_per_owner=10))
    with pytest.raises(VoiceStoreFullError, match="--max-voice-bytes"):
        tiny.create(IN_CONTEXT, 1.0, owner="")
    assert tiny.owned_by("") == []


def test_one_owner_cannot_take_more_than_its_share_and_others_still_can_add(tmp_path: Path) -> None:
    store = open_store(tmp_path, limits=VoiceLimits(max_voices=10, max_voice_bytes=1 << 20, max_voices_per_owner=2))
    for _ in range(2):
        store.create(IN_CONTEXT, 1.0, owner="alice")
    with pytest.raises(VoiceStoreFullError, match="--max-voices-per-caller"):
        store.create(IN_CONTEXT, 1.0, owner="alice")
    assert store.create(IN_CONTEXT, 1.0, owner="bob").owner == "bob"
    assert len(store.owned_by("alice")) == 2


def test_a_memory_store_keeps_voices_without_a_directory() -> None:
    store = VoiceStore.open(None, LIMITS, SHAPE)
    voice = store.create(IN_CONTEXT, 1.0, owner="")
    assert not store.is_persistent
    assert store.get(voice.voice_id, "").clone.reference_codes == IN_CONTEXT.reference_codes


def test_a_file_the_server_may_not_read_is_reported_once_and_the_rest_are_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Another user's file with no read permission (simulated: these tests may run as root, whom permissions do
    not stop) takes neither the store's opening nor its listing down with it."""
    store = open_store(tmp_path)
    kept, locked = (store.create(IN_CONTEXT, 1.0, owner="") for _ in range(2))
    real_open = os.open

    def open_refusing_the_locked_file(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        if Path(path).name.startswith(locked.voice_id):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_refusing_the_locked_file)
    with caplog.at_level(logging.ERROR):
        reopened = open_store(tmp_path)
        for _ in range(3):
            assert [voice.voice_id for voice in reopened.owned_by("")] == [kept.voice_id]
            with pytest.raises(VoiceNotFoundError):
                reopened.get(locked.voice_id, "")
    reports = [record.getMessage() for record in caplog.records if locked.voice_id in record.getMessage()]
    assert len(reports) == 1 and "permission denied" in reports[0]


def test_entries_that_cannot_be_served_leave_room_for_voices_under_the_count_limit(tmp_path: Path) -> None:
    limits = VoiceLimits(max_voices=1, max_voice_bytes=1 << 20, max_voices_per_owner=1)
    (tmp_path / f"{UNSEEN_ID}.safetensors").write_bytes(b"not a voice")
    store = open_store(tmp_path, limits=limits)
    assert store.create(IN_CONTEXT, 1.0, owner="").owner == ""
    with pytest.raises(VoiceStoreFullError, match="--max-voices"):
        store.create(IN_CONTEXT, 1.0, owner="")
