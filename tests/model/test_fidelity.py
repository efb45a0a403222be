"""The teacher-forced bf16 fidelity check runs end to end against the reference on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import fidelity as bench_fidelity
from tests.reference import import_reference
from tts_service.model.random_checkpoint import write_random_checkpoint

pytestmark = pytest.mark.parity


def test_engine_path_bf16_logits_are_as_close_to_fp32_as_the_reference_in_bf16(tmp_path: Path) -> None:
    import_reference()
    checkpoint = tmp_path / "tiny"
    write_random_checkpoint(checkpoint, "tiny-custom_voice", seed=3)
    out = tmp_path / "fidelity.json"
    assert bench_fidelity.main(["--checkpoint", str(checkpoint), "--device", "cpu", "--positions", "24",
                                "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    errors = report["errors_vs_reference_fp32"]
    # bf16 really differs from fp32 (the comparison can see a difference) ...
    assert errors["reference_bf16"]["codebook0"]["mean_abs"] > 0
    # ... and the engine's path stays within the reference's own bf16 error.
    assert report["within_reference_bf16"] == {"engine_bf16_fused": True, "engine_bf16_eager_chain": True}
