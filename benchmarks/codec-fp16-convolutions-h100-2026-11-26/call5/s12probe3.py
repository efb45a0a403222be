"""Session 12 probe 3 (from probe 2, on the blocks-only code): which convolutions in fp16 cost the waveform its fidelity. Each variant keeps some layers in
fp32 (TF32) and the rest in fp16; waveform error against exact fp32 (our decoder, TF32 off, one shot), and the codec
call at 64 and 128 rows in the runner's graphs."""

import json
import statistics
import sys
import time

import torch

from benchmarks.codec import time_calls
from benchmarks.codec_fidelity import streamed, waveform_error
from tts_service.engine.config import EngineConfig
from tts_service.model import codec_decoder as cd
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner.runner import ModelRunner

model = load_model("random:1.7b-custom_voice", LoadOptions.default_for("cuda"))
decoder = model.codec_decoder
decoder.use_fused_kernels(True)
convs = [m for m in decoder.modules() if isinstance(m, cd._Convolution)]
transposed = [m for m in convs if isinstance(m, cd.CausalConvTranspose1d)]
units = [m for m in decoder.modules() if isinstance(m, cd.ResidualUnit)]
unit_conv2 = [u.conv2 for u in units]
unit_conv1 = [u.conv1 for u in units]
blocks = [m for m in decoder.modules() if isinstance(m, cd.DecoderBlock)]
block_transposed = [m for b in blocks for m in b.modules() if isinstance(m, cd.CausalConvTranspose1d)]
variants = {
    "blocks_fp16": [],
    "blocks_fp16_transposed_fp32": block_transposed,
    "blocks_fp16_first_block_fp32": [m for m in blocks[0].modules() if isinstance(m, cd._Convolution)],
    "blocks_fp16_transposed_and_conv2_fp32": block_transposed + unit_conv2,
}
generator = torch.Generator().manual_seed(1)
codes = torch.randint(0, 2048, (4, 16, 150), generator=generator).cuda()
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "variants": {}}
with torch.no_grad():
    torch.backends.cudnn.allow_tf32 = False
    exact = decoder(codes)[:, 0].float()
    torch.backends.cudnn.allow_tf32 = True
    tf32 = decoder(codes)[:, 0].float()
    report["tf32"] = waveform_error(tf32, exact)
    print("tf32", report["tf32"], flush=True)
    for name, kept in variants.items():
        decoder.use_half_convolutions(True)
        for m in kept:
            m.input_dtype = None
        one = waveform_error(decoder(codes)[:, 0].float(), exact)
        config = EngineConfig(max_running=128, num_kv_blocks=64, max_positions_per_request=256,
                              graph_batch_sizes=(64, 128), codec_chunk_schedule=(1,),
                              prefill_graph_batch_sizes=(), prefill_graph_lengths=())
        runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
        times = {b: statistics.median(time_calls(runner, b, 1, 30)) * 1e3 for b in (64, 128)}
        del runner
        torch.cuda.empty_cache()
        report["variants"][name] = {"kept_fp32": len(kept), "one_shot": one, "call_ms": times}
        print(name, len(kept), f"{one['snr_db']:.2f} dB", {b: round(t, 3) for b, t in times.items()}, flush=True)
    decoder.use_half_convolutions(False)
with open(sys.argv[1], "w") as f:
    json.dump(report, f, indent=1)
