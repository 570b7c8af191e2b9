"""The post-attention MLP block (RMSNorm, SwiGLU, down projection, residual) of Qwen2-0.5B and
Llama-3.2-1B, megafuse's mega_fused_mlp_prefill (token-major) against its peers.

    pytest benchmarks/bench_mlp.py --benchmark-only

T = 1 (decode: weights cycled through distinct copies, >= 96 MiB, so DRAM serves them), 128 and
512 tokens, every weight format the shape allows (Qwen2-0.5B's gate/up rows are 896 long, so its
"Q4_K" / "Q6_K" cases are llama.cpp's Q4_K_M-style mixes: see README.md).
Peers: PyTorch fp32 (FP32 rows), ggml (same weight bytes), the NumPy reference (small cases).
"""
import pytest

import _layers


@pytest.mark.parametrize("case,impl", _layers.params("mlp"))
def test_mlp(benchmark, machine, case, impl):
    _layers.run_case(benchmark, case, impl)
