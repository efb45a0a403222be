"""Model audio -> client encodings: every encoding decodes back with a real decoder, streaming equals one-shot."""

from __future__ import annotations

import io
import struct
import threading
import wave

import numpy as np
import pytest
import soundfile as sf
import soxr

from tts_service.audio import output
from tts_service.audio.output import (
    MODEL_SAMPLE_RATE,
    AudioEncoding,
    AudioFormatError,
    FileEncoder,
    FileEncoding,
    OutputFormat,
    StreamEncoder,
    _Container,
    _LibsndfileSink,
    encode_whole,
)

SOURCE_RATE = 24000
RATES = (8000, 16000, 22050, 24000, 44100, 48000)
OPUS_RATES = (8000, 16000, 24000, 48000)
# 0.8 s: a whole number of samples at every supported rate, so the expected length has no rounding tie.
NUM_SAMPLES = 19200
# Irregular model chunks, including empty and one-sample ones; the rest of the signal follows them.
CHUNK_SIZES = (0, 1, 479, 0, 1920, 7, 3840, 1, 1, 2000)
# PCM16 is floor(x * 32768) saturated to int16 (libsndfile's rule, which the encoder follows) and reads back as
# n / 32768, so a sample returns within one step.
PCM16_TOLERANCE = 1 / 32768
# G.711 keeps about 8 bits of a 13/14-bit magnitude; its error scales with the amplitude.
G711_RELATIVE_RMS_ERROR = 0.05
G711_SUBTYPES = {AudioEncoding.MULAW: "ULAW", AudioEncoding.ALAW: "ALAW"}
HEADERLESS = (AudioEncoding.PCM16, AudioEncoding.MULAW, AudioEncoding.ALAW)


def tone(hz: float = 440.0, num_samples: int = NUM_SAMPLES, amplitude: float = 0.5,
         sample_rate: int = SOURCE_RATE) -> np.ndarray:
    t = np.arange(num_samples) / sample_rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def resampled(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """What the encoder should carry: one-shot soxr at the same quality, clipped."""
    if sample_rate == SOURCE_RATE:
        return np.clip(samples, -1, 1)
    return np.clip(soxr.resample(samples, SOURCE_RATE, sample_rate, quality="HQ"), -1, 1)


def expected_length(num_samples: int, sample_rate: int) -> int:
    return round(num_samples * sample_rate / SOURCE_RATE)


# The most samples a decoder puts before an untagged MP3's audio: the encoder's delay and its own, within two frames.
MAX_MP3_DELAY = 2 * 1152


def stream_chunks(samples: np.ndarray, output: OutputFormat,
                  chunk_sizes: tuple[int, ...] = CHUNK_SIZES) -> tuple[list[bytes], StreamEncoder]:
    encoder = StreamEncoder(output)
    chunks, start = [], 0
    for size in chunk_sizes:
        chunks.append(encoder.encode(samples[start:start + size]))
        start += size
    chunks.append(encoder.encode(samples[start:]))
    chunks.append(encoder.finish())
    return chunks, encoder


def decode(data: bytes, output: OutputFormat) -> tuple[np.ndarray, int]:
    """Decodes with libsndfile: headerless bytes as RAW of the right subtype, containers from their header."""
    if output.encoding in (AudioEncoding.WAV, AudioEncoding.OGG_OPUS, AudioEncoding.MP3):
        return sf.read(io.BytesIO(data), dtype="float32")
    subtype = G711_SUBTYPES.get(output.encoding, "PCM_16")
    samples, _ = sf.read(io.BytesIO(data), samplerate=output.sample_rate, channels=1, format="RAW",
                         subtype=subtype, endian="LITTLE", dtype="float32")
    return samples, output.sample_rate


def every_format() -> list[OutputFormat]:
    return [OutputFormat(encoding, rate) for encoding in AudioEncoding
            for rate in (OPUS_RATES if encoding is AudioEncoding.OGG_OPUS else RATES)]


def relative_rms_error(decoded: np.ndarray, reference: np.ndarray) -> float:
    return float(np.sqrt(np.mean((decoded - reference) ** 2)) / np.sqrt(np.mean(reference ** 2)))


@pytest.mark.parametrize("output", every_format(), ids=lambda output: f"{output.encoding.name}-{output.sample_rate}")
def test_every_encoding_decodes_back_at_the_requested_rate_length_and_level(output: OutputFormat) -> None:
    samples = tone()
    decoded, rate = decode(b"".join(stream_chunks(samples, output)[0]), output)
    reference = resampled(samples, output.sample_rate)
    assert rate == output.sample_rate
    if output.encoding is AudioEncoding.OGG_OPUS:
        # The Ogg granule position and Opus pre-skip let a decoder trim to the exact length; a decoder
        # that ignores the end trim may add up to one 20 ms Opus frame of padding, never lose samples.
        assert len(reference) <= len(decoded) <= len(reference) + output.sample_rate // 50
        decoded = decoded[:len(reference)]
        assert np.corrcoef(decoded, reference)[0, 1] > 0.99
        assert abs(np.std(decoded) / np.std(reference) - 1) < 0.05
    elif output.encoding is AudioEncoding.MP3:
        # No LAME tag: the decoder keeps the codec's delay (the encoder's and its own, under two frames of 1,152
        # samples) before the audio and the last frame's padding after it, and loses nothing.
        onset = int(np.argmax(np.abs(decoded) > 0.1))  # the tone starts at full level, the delay is silent
        delay = max(range(max(0, onset - 20), onset + 20),
                    key=lambda shift: float(np.dot(decoded[shift:shift + 1000], reference[:1000])))
        assert delay < MAX_MP3_DELAY and len(decoded) >= delay + len(reference)
        decoded = decoded[delay:delay + len(reference)]
        assert np.corrcoef(decoded, reference)[0, 1] > 0.98
        assert abs(np.std(decoded) / np.std(reference) - 1) < 0.1
    elif output.encoding in G711_SUBTYPES:
        assert len(decoded) == len(reference)
        assert relative_rms_error(decoded, reference) < G711_RELATIVE_RMS_ERROR
    else:
        assert len(decoded) == len(reference)
        np.testing.assert_allclose(decoded, reference, rtol=0, atol=PCM16_TOLERANCE)


@pytest.mark.parametrize("encoding", HEADERLESS, ids=lambda encoding: encoding.name)
@pytest.mark.parametrize("sample_rate", RATES)
def test_streamed_chunks_concatenate_to_the_whole_utterance_encoding(encoding: AudioEncoding,
                                                                     sample_rate: int) -> None:
    output = OutputFormat(encoding, sample_rate)
    samples = tone(hz=300.0, num_samples=12345)
    chunks, encoder = stream_chunks(samples, output)
    whole = encode_whole(samples, output)
    assert b"".join(chunks) == whole
    streamed_samples, _ = decode(b"".join(chunks), output)
    whole_samples, _ = decode(whole, output)
    np.testing.assert_array_equal(streamed_samples, whole_samples)
    assert encoder.num_output_samples == len(whole_samples) == expected_length(12345, sample_rate)


def test_headerless_bytes_track_num_output_samples_chunk_by_chunk() -> None:
    encoder = StreamEncoder(OutputFormat(AudioEncoding.PCM16, 16000))
    samples, emitted = tone(), 0
    for start in range(0, NUM_SAMPLES, 1000):
        emitted += len(encoder.encode(samples[start:start + 1000]))
        assert emitted == 2 * encoder.num_output_samples
    emitted += len(encoder.finish())
    assert emitted == 2 * encoder.num_output_samples == 2 * expected_length(NUM_SAMPLES, 16000)


@pytest.mark.parametrize("sample_rate", RATES)
def test_streamed_wav_announces_unknown_sizes_and_carries_the_whole_files_samples(sample_rate: int) -> None:
    output = OutputFormat(AudioEncoding.WAV, sample_rate)
    samples = tone()
    chunks, _ = stream_chunks(samples, output)
    streamed, whole = b"".join(chunks), encode_whole(samples, output)
    assert chunks[0].startswith(b"RIFF") and chunks[0][8:12] == b"WAVE"
    assert struct.unpack_from("<I", streamed, 4)[0] == 0xFFFFFFFF
    assert streamed[36:40] == b"data" and struct.unpack_from("<I", streamed, 40)[0] == 0xFFFFFFFF
    assert streamed[44:] == whole[44:]
    decoded, rate = sf.read(io.BytesIO(streamed), dtype="int16")
    assert rate == sample_rate
    np.testing.assert_array_equal(decoded, sf.read(io.BytesIO(whole), dtype="int16")[0])


def test_whole_wav_header_states_the_exact_sizes() -> None:
    data = encode_whole(tone(), OutputFormat(AudioEncoding.WAV, 22050))
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 22050)
        assert wav.getnframes() == expected_length(NUM_SAMPLES, 22050)
    assert struct.unpack_from("<I", data, 4)[0] == len(data) - 8


def test_empty_utterance_gives_empty_pcm_and_a_valid_empty_wav() -> None:
    empty = np.zeros(0, dtype=np.float32)
    assert encode_whole(empty, OutputFormat(AudioEncoding.PCM16, 16000)) == b""
    with wave.open(io.BytesIO(encode_whole(empty, OutputFormat(AudioEncoding.WAV, 16000)))) as wav:
        assert wav.getnframes() == 0 and wav.getframerate() == 16000


@pytest.mark.parametrize("sample_rate", OPUS_RATES)
def test_streamed_opus_is_one_valid_ogg_file_of_the_right_length_and_rate(sample_rate: int) -> None:
    output = OutputFormat(AudioEncoding.OGG_OPUS, sample_rate)
    samples = tone(num_samples=12345)
    chunks, encoder = stream_chunks(samples, output)
    data = b"".join(chunks)
    assert data.startswith(b"OggS") and b"OpusHead" in data[:64]
    info = sf.info(io.BytesIO(data))
    assert (info.format, info.subtype, info.samplerate, info.channels) == ("OGG", "OPUS", sample_rate, 1)
    decoded, _ = sf.read(io.BytesIO(data), dtype="float32")
    expected = expected_length(12345, sample_rate)
    assert encoder.num_output_samples == expected
    assert expected <= len(decoded) <= expected + sample_rate // 50


def test_opus_pages_arrive_while_the_utterance_is_still_streaming() -> None:
    # A codec frame (80 ms) at a time for 2 s; libsndfile's default would hold pages back for about 1 s.
    encoder = StreamEncoder(OutputFormat(AudioEncoding.OGG_OPUS, 24000))
    samples = tone(num_samples=48000)
    arrivals = [len(encoder.encode(samples[start:start + 1920])) > 0 for start in range(0, 48000, 1920)]
    tail = encoder.finish()
    assert sum(arrivals) >= 10
    assert all(arrivals[:2]) and len(tail) > 0


@pytest.mark.parametrize("sample_rate, hz", [(8000, 1000.0), (8000, 3000.0), (16000, 1000.0), (22050, 2500.0),
                                             (44100, 1000.0), (48000, 5000.0)])
def test_resampled_sine_keeps_its_frequency(sample_rate: int, hz: float) -> None:
    output = OutputFormat(AudioEncoding.PCM16, sample_rate)
    decoded, _ = decode(b"".join(stream_chunks(tone(hz=hz), output)[0]), output)
    spectrum = np.abs(np.fft.rfft(decoded * np.hanning(len(decoded))))
    peak_hz = np.argmax(spectrum) * sample_rate / len(decoded)
    bin_hz = sample_rate / len(decoded)
    assert abs(peak_hz - hz) <= bin_hz


def test_resampling_filters_out_what_the_output_rate_cannot_carry() -> None:
    # 5 kHz is above 8 kHz's Nyquist: decimating without a filter would fold it onto 3 kHz at full level.
    output = OutputFormat(AudioEncoding.PCM16, 8000)
    decoded, _ = decode(encode_whole(tone(hz=5000.0), output), output)
    # The tone's abrupt start and end are broadband clicks that rightly pass; 50 ms later only the tone is left.
    steady = decoded[400:-400]
    assert np.abs(steady).max() <= PCM16_TOLERANCE


def test_pcm16_bytes_are_the_ones_libsndfile_writes_for_every_step_and_between() -> None:
    # The encoder casts PCM16 itself (libsndfile's file callbacks cost six times as much); every quantisation
    # step's edge, each side of it, and random samples must come out as libsndfile writes them.
    steps = np.arange(-32770, 32770, dtype=np.float64) / 32768
    edges = np.concatenate([steps, steps + 0.5 / 32768, np.nextafter(steps, -np.inf), np.nextafter(steps, np.inf)])
    samples = np.concatenate([edges.astype(np.float32),
                              np.random.default_rng(3).uniform(-1.2, 1.2, 100_000).astype(np.float32)])
    clipped = np.clip(samples, -1.0, 1.0)
    oracle = io.BytesIO()
    sf.write(oracle, clipped, 24000, format="RAW", subtype="PCM_16", endian="LITTLE")
    assert encode_whole(samples, OutputFormat(AudioEncoding.PCM16, 24000)) == oracle.getvalue()


def test_samples_beyond_full_scale_saturate_instead_of_wrapping() -> None:
    samples = np.array([2.0, -2.0, 1.0, -1.0, 0.5, 0.0], dtype=np.float32)
    data = encode_whole(samples, OutputFormat(AudioEncoding.PCM16, 24000))
    assert np.frombuffer(data, dtype="<i2").tolist() == [32767, -32768, 32767, -32768, 16384, 0]


@pytest.mark.parametrize("encoding, sample_rate, field", [
    (AudioEncoding.PCM16, 11025, "audio_format.sample_rate"),
    (AudioEncoding.WAV, 0, "audio_format.sample_rate"),
    (AudioEncoding.MULAW, 96000, "audio_format.sample_rate"),
    (AudioEncoding.PCM16, 24000.0, "audio_format.sample_rate"),
    (AudioEncoding.OGG_OPUS, 22050, "audio_format.sample_rate"),
    (AudioEncoding.OGG_OPUS, 44100, "audio_format.sample_rate"),
    ("mp3", 24000, "audio_format.encoding"),
    (None, 24000, "audio_format.encoding"),
])
def test_unsupported_formats_are_refused_naming_the_field(encoding: object, sample_rate: object, field: str) -> None:
    with pytest.raises(AudioFormatError) as raised:
        OutputFormat(encoding, sample_rate)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert isinstance(raised.value, ValueError) and str(raised.value).startswith(f"{field}: ")


def test_opus_refusal_says_which_rates_it_can_use() -> None:
    with pytest.raises(AudioFormatError, match="Opus") as raised:
        OutputFormat(AudioEncoding.OGG_OPUS, 44100)
    assert "48000" in str(raised.value) and "12000" not in str(raised.value)


@pytest.mark.parametrize("output, mime_type", [
    (OutputFormat(AudioEncoding.PCM16, 24000), "audio/L16;rate=24000"),
    (OutputFormat(AudioEncoding.WAV, 44100), "audio/wav"),
    (OutputFormat(AudioEncoding.OGG_OPUS, 48000), "audio/ogg;codecs=opus"),
    (OutputFormat(AudioEncoding.MULAW, 8000), "audio/PCMU;rate=8000"),
    (OutputFormat(AudioEncoding.ALAW, 8000), "audio/PCMA;rate=8000"),
])
def test_mime_type_names_the_encoding_and_the_rate_where_the_bytes_do_not(output: OutputFormat,
                                                                          mime_type: str) -> None:
    assert output.mime_type == mime_type


def test_a_finished_stream_accepts_nothing_more() -> None:
    encoder = StreamEncoder(OutputFormat(AudioEncoding.PCM16, 16000))
    encoder.encode(tone(num_samples=100))
    encoder.finish()
    with pytest.raises(RuntimeError):
        encoder.encode(tone(num_samples=100))
    with pytest.raises(RuntimeError):
        encoder.finish()


def test_multichannel_input_is_refused() -> None:
    with pytest.raises(ValueError, match="mono"):
        StreamEncoder(OutputFormat(AudioEncoding.PCM16, 24000)).encode(np.zeros((2, 100), dtype=np.float32))


def test_a_container_that_seeks_back_to_fix_its_header_is_refused_rather_than_sent_corrupted() -> None:
    # libsndfile's own WAV writer rewrites its header in place; bytes already sent cannot be rewritten.
    sink = _LibsndfileSink(_Container("WAV", "PCM_16"), 24000)
    with pytest.raises(RuntimeError, match="seek back"):
        sink.write(tone(num_samples=100))


@pytest.mark.parametrize("encoding", list(FileEncoding))
def test_a_file_written_chunk_by_chunk_and_spooled_to_disk_decodes_as_the_whole_utterance(
        encoding: FileEncoding) -> None:
    samples = (0.4 * np.sin(2 * np.pi * 220 * np.arange(3 * MODEL_SAMPLE_RATE) / MODEL_SAMPLE_RATE)).astype(np.float32)

    def written(pieces: list[np.ndarray], spool_bytes: int) -> np.ndarray:
        encoder = FileEncoder(encoding, spool_bytes=spool_bytes)
        try:
            for piece in pieces:
                encoder.write(piece)
            decoded, rate = sf.read(io.BytesIO(encoder.finish().read()), dtype="float32")
        finally:
            encoder.close()
        assert rate == MODEL_SAMPLE_RATE
        return decoded

    whole = written([samples], spool_bytes=1 << 30)
    # 80 ms chunks as the engine makes them, into a file that outgrows its 4 KiB in memory at once.
    chunked = written(np.array_split(samples, len(samples) // 1920), spool_bytes=4096)
    np.testing.assert_array_equal(chunked, whole)
    assert len(whole) == len(samples)
    level = np.sqrt(np.mean(whole[4096:-4096] ** 2))
    assert abs(level - 0.4 / np.sqrt(2)) < 0.02



class _SlowSoundFile:
    """Stands in for libsndfile's file: a write that lasts until released, and a close that notes whether a write
    was still running when it came."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.closed = False
        self.writing = threading.Event()
        self.release = threading.Event()
        self.closed_mid_write = False

    def write(self, samples: np.ndarray) -> None:
        if self.closed:
            raise RuntimeError("I/O operation on closed file")
        self.writing.set()
        self.release.wait(timeout=30)
        self.writing.clear()

    def close(self) -> None:
        self.closed_mid_write = self.writing.is_set()
        self.closed = True


def test_a_file_closed_while_a_worker_thread_writes_it_waits_for_the_write_and_refuses_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client gone mid-call tears its call down on the event loop while a chunk is encoded in a worker thread:
    libsndfile must not close the file under that write."""
    monkeypatch.setattr(output.sf, "SoundFile", _SlowSoundFile)
    encoder = FileEncoder(FileEncoding.FLAC)
    sound = encoder._sound  # the stand-in: what it saw is the test's evidence
    writer = threading.Thread(target=encoder.write, args=(np.zeros(1920, dtype=np.float32),))
    writer.start()
    assert sound.writing.wait(timeout=30)
    closer = threading.Thread(target=encoder.close)
    closer.start()
    closer.join(timeout=0.2)
    assert closer.is_alive()  # waiting for the write
    sound.release.set()
    writer.join(timeout=30)
    closer.join(timeout=30)
    assert not closer.is_alive() and sound.closed and not sound.closed_mid_write
    with pytest.raises(RuntimeError):
        encoder.write(np.zeros(1920, dtype=np.float32))


def test_mp3_streams_the_bytes_of_one_shot_encoding_at_the_asked_bit_rate() -> None:
    samples = tone()
    output = OutputFormat(AudioEncoding.MP3, 44100, bit_rate_kbps=128)
    streamed = b"".join(stream_chunks(samples, output)[0])
    assert streamed == encode_whole(samples, output)
    seconds = len(samples) / SOURCE_RATE
    frame_bytes = 1152 * 128_000 // 8 // 44100
    assert abs(len(streamed) - seconds * 128_000 / 8) < 3 * frame_bytes  # a constant 128 kbps, give or take frames
    assert output.mime_type == "audio/mpeg"
    assert OutputFormat(AudioEncoding.MP3, 24000).mp3_kbps == 64


@pytest.mark.parametrize(("encoding", "sample_rate", "kbps", "message"), [
    (AudioEncoding.MP3, 44100, 100, "100 kbps is not an MP3 bit rate at 44100 Hz"),
    (AudioEncoding.MP3, 8000, 128, "128 kbps is not an MP3 bit rate at 8000 Hz"),
    (AudioEncoding.OGG_OPUS, 48000, 64, "applies to MP3 only, not OGG_OPUS"),
])
def test_a_bit_rate_mp3_does_not_have_is_refused_naming_the_field(encoding: AudioEncoding, sample_rate: int,
                                                                   kbps: int, message: str) -> None:
    with pytest.raises(AudioFormatError) as raised:
        OutputFormat(encoding, sample_rate, bit_rate_kbps=kbps)
    assert raised.value.field == "audio_format.bit_rate_kbps" and message in str(raised.value)
