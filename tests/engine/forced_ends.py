"""A test double for the model's end of speech: the runner reports EOS at a chosen frame."""

from __future__ import annotations

from tts_service.runner.runner import StepInput


def end_every_stream_at(runner, frame_index: int, eos_code: int) -> None:
    """The runner reports EOS for every frame `frame_index` a decode makes (the device made another frame)."""
    start_step = runner.start_step

    def step_with_ends(step: StepInput):
        pending = start_step(step)
        ending_rows = [row for row, item in enumerate(step.decodes) if item.frame_index == frame_index]
        result = pending.result

        def result_with_ends():
            output = result()
            output.decode_frames[ending_rows, 0] = eos_code
            return output

        pending.result = result_with_ends
        return pending

    runner.start_step = step_with_ends
