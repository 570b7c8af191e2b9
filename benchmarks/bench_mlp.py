"""The post-attention MLP block (RMSNorm, gate/up, SiLU * up, down projection, residual) on the
SmolLM2-135M, Llama-3.2-1B and Qwen2-0.5B shapes: megafuse's mega_fused_mlp_prefill
(token-major) against its peers.

    pytest benchmarks/bench_mlp.py --benchmark-only [-k "smollm2 and T128- and ggml"]

T=1 (decode: weights cycled through distinct copies, >= 3x the L3, so DRAM serves them) and
T=128, every weight format the shape takes (SmolLM2's gate/up rows are 576 long, so its K-quant
cases are llama.cpp's mixes: see README.md).
Peers: PyTorch (FP32 rows), ggml (every format, same weight bytes), the NumPy reference (small
FP32 cases).
"""
import pytest

import _cases
import _run


@pytest.mark.parametrize("case,impl", _cases.params("mlp"))
def test_mlp(benchmark, machine, case, impl):
    _run.run_case(benchmark, case, impl)
