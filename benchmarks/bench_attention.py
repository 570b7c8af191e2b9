"""The attention block of Qwen2-0.5B and Llama-3.2-1B, megafuse against its peers.

    pytest benchmarks/bench_attention.py --benchmark-only

Cases (every weight format the shape allows; see README.md):
- decode: one token at position 511 of a 1024-slot KV cache, weights cycled through distinct
  copies (>= 96 MiB) so DRAM serves them: FP32 by mega_fused_attention_decode; block formats by
  mega_fused_attention_prefill_q8_0 (int8 path) and mega_fused_attention_prefill (float
  activations), tokens=1;
- prefill: T = 128 and 512 tokens from position 0: FP32 by mega_fused_attention_prefill, block
  formats by mega_fused_attention_prefill_q8_0;
- attention core: attention of one token over 512 cached keys (megafuse: decode at 511 minus
  decode at 0; peers: SDPA / flash_attn_ext alone).
Peers: PyTorch fp32 (FP32 rows), ggml (same weight bytes), the NumPy reference (small cases).
"""
import pytest

import _layers


@pytest.mark.parametrize("case,impl", _layers.params("attention"))
def test_attention(benchmark, machine, case, impl):
    _layers.run_case(benchmark, case, impl)
