"""Session 15: codec fidelity of the new kernels, against our own decoder in float64 (the reference's decoder equals
ours in exact arithmetic: the parity tests). Default decoder (fp32, TF32 convolutions, fp16 residual units, fused
kernels), streamed a frame a call, with and without the two new kernels (the codebook sum, the one-channel
convolution)."""
import json
import math
import sys

import torch

from tts_service.model.codec_decoder import CausalConv1d, CodecDecoder, _ResidualQuantizer
from tts_service.model.configs import SpeechTokenizerConfig
from tts_service.model.random_checkpoint import speech_tokenizer_config_dict


def snr(wave, exact):
    d = (wave.double() - exact).flatten()
    return {"max_abs": d.abs().max().item(), "rms": d.pow(2).mean().sqrt().item(),
            "snr_db": 10 * math.log10(exact.pow(2).sum().item() / d.pow(2).sum().item())}


config = SpeechTokenizerConfig.parse({"decoder_config": speech_tokenizer_config_dict("1.7b")["decoder_config"]}).decoder
decoder = CodecDecoder(config).eval()
decoder.randomize_(torch.Generator().manual_seed(0))
codes = torch.randint(0, config.codebook_size, (4, config.num_quantizers, 150),
                      generator=torch.Generator().manual_seed(1)).cuda()
with torch.no_grad():
    exact = decoder.to("cuda", torch.float64)(codes)[:, 0]
    decoder.to(torch.float32)
    decoder.use_fused_kernels(True)
    decoder.use_half_convolutions(True)
    report = {}
    for name, new_kernels in (("without_new_kernels", False), ("with_new_kernels", True)):
        for module in decoder.modules():
            if isinstance(module, CausalConv1d | _ResidualQuantizer):
                module.is_fused = new_kernels
        state = decoder.new_stream_state(4)
        streamed = torch.cat([decoder.decode_chunk(codes[:, :, f:f + 1], state) for f in range(150)], dim=-1)
        report[name] = {"streamed": snr(streamed, exact), "one_shot": snr(decoder(codes)[:, 0], exact)}
        print(name, report[name], flush=True)
json.dump(report, open(sys.argv[1], "w"), indent=1)
