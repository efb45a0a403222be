"""The voice store on disk: whole files only, every damaged or foreign entry refused and logged, owners kept apart."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import torch

from tts_service.engine.voice_files import VoiceShape
from tts_service.engine.voice_store import VoiceLimits, VoiceNotFoundError, VoiceStore, VoiceStoreFullError
from tts_service.model.prompts import VoiceClone

SHAPE = VoiceShape(embedding_size=8, num_code_groups=4, device=torch.device("cpu"))
LIMITS = VoiceLimits(max_voices=10, max_voice_bytes=1 << 20, max_voices_per_owner=10)
IN_CONTEXT = VoiceClone(speaker_embedding=torch.linspace(-1, 1, 8), reference_codes=((1, 2, 3, 4), (5, 6, 7, 8)),
                        reference_text="Hello.")


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
