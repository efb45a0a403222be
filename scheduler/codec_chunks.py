"""How generated frames are cut into codec-decoder chunks.

Small first chunks get the first audio out fast; later chunks grow so the codec runs less often
per second of audio. The schedule's last size repeats for the rest of the stream.
"""

from __future__ import annotations


def chunk_size(schedule: tuple[int, ...], chunk_index: int) -> int:
    return schedule[min(chunk_index, len(schedule) - 1)]


def plan_chunk_sizes(schedule: tuple[int, ...], num_chunks_sent: int, num_pending_frames: int,
                     is_end_of_stream: bool) -> list[int]:
    """Sizes of the chunks to emit now, in order.

    While the stream runs, only full chunks are emitted. At end of stream the remainder becomes
    one final chunk, which may be shorter than the schedule says, or empty when nothing is left:
    the empty chunk still tells the runner the stream is over.
    """
    sizes: list[int] = []
    chunk_index = num_chunks_sent
    num_remaining = num_pending_frames
    while True:
        size = chunk_size(schedule, chunk_index)
        # At end of stream an exactly full chunk is itself the final one, so stop before it.
        if num_remaining < size or (is_end_of_stream and num_remaining == size):
            break
        sizes.append(size)
        num_remaining -= size
        chunk_index += 1
    if is_end_of_stream:
        sizes.append(num_remaining)
    return sizes
