"""The attention block (RMSNorm, Q/K/V, RoPE, KV-cache write, flash attention, out-projection,
residual) on the SmolLM2-135M, Llama-3.2-1B and Qwen2-0.5B shapes, megafuse against its peers.

    pytest benchmarks/bench_attention.py --benchmark-only [-k "llama and T1- and Q4_K"]

- T=1 (decode): one token at position 511 of a 1024-slot KV cache, weights cycled through
  distinct copies (>= 3x the L3) so DRAM serves them: FP32 by mega_fused_attention_decode; block
  formats by mega_fused_attention_prefill_q8_0 ("int8") and mega_fused_attention_prefill
  ("float": float activations), tokens=1;
- T=128 (prefill) from position 0: FP32 by mega_fused_attention_prefill, block formats by
  mega_fused_attention_prefill_q8_0.
Peers: PyTorch (FP32 rows), ggml (every format, same weight bytes), the NumPy reference (small
FP32 cases).  See README.md.
"""
import pytest

import _cases
import _run


@pytest.mark.parametrize("case,impl", _cases.params("attention"))
def test_attention(benchmark, machine, case, impl):
    _run.run_case(benchmark, case, impl)
