"""The model runner: owns the device. KV memory, per-slot state, CUDA graphs, the frame step and sampling."""
