"""A small, strictly typed client of megafuse's public API.

tests/project/test_typing.py type-checks it with ``mypy --strict`` against the stubs
(megafuse/__init__.pyi, megafuse/py.typed) and also runs it, so the stubs and the run-time
API cannot drift apart unnoticed.  Not a test module itself (pytest does not collect it).
"""
from __future__ import annotations

import io
from typing import Dict, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

import megafuse
from megafuse import CKDataType, DecoderLayer

F32 = npt.NDArray[np.float32]
E, H, G, D, I = 256, 4, 2, 64, 512


def weights(rng: np.random.Generator) -> Dict[str, F32]:
    def w(rows: int, cols: int) -> F32:
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(cols ** 0.5)

    return {"wq": w(H * D, E), "wk": w(G * D, E), "wv": w(G * D, E), "wo": w(E, H * D),
            "w1": w(2 * I, E), "w2": w(E, I)}


def decoder_layer() -> Tuple[F32, F32]:
    rng = np.random.default_rng(0)
    w = weights(rng)
    gamma = np.ones(E, dtype=np.float32)
    layer = DecoderLayer.from_arrays(
        ln1_gamma=gamma, ln2_gamma=gamma, wq=w["wq"], wk=w["wk"], wv=w["wv"], wo=w["wo"],
        w1=w["w1"], w2=w["w2"], dtype="Q8_0", dtypes={"w2": CKDataType.Q6_K, "wo": 0},
        num_heads=H, num_kv_heads=G, head_dim=D, intermediate_dim=I, eps=1e-6,
        rope_theta=1e6, cache_capacity=32, max_tokens=8)
    x = rng.standard_normal((8, E), dtype=np.float32)
    hidden: F32 = layer.prefill(x)
    token: F32 = layer.decode(hidden[-1])
    position: int = layer.position
    formats: Dict[str, CKDataType] = layer.dtypes
    assert position == 9 and formats["w2"] == CKDataType.Q6_K and layer.int8_path
    layer.reset()
    return hidden, token


def header_functions() -> float:
    rng = np.random.default_rng(1)
    w = weights(rng)
    cos, sin = megafuse.rope_tables(D, 16, theta=10000.0)
    x = rng.standard_normal(E, dtype=np.float32)
    out = np.zeros(E, dtype=np.float32)
    cache_k = np.zeros((G, 16, D), dtype=np.float32)
    cache_v = np.zeros((G, 16, D), dtype=np.float32)
    gamma = np.ones(E, dtype=np.float32)
    bias: Optional[F32] = None
    megafuse.mega_fused_attention_decode(
        out, x, x, gamma, w["wq"], bias, w["wk"], None, w["wv"], None, w["wo"], None,
        cache_k, cache_v, cos, sin, 3, E, E, H, G, D, D, 16, 1e-6)
    tiles: Tuple[int, int] = megafuse.mega_fuse_get_optimal_tiles(D)
    need: int = megafuse.mega_fused_mlp_prefill_scratch_size(4, E, I)
    scratch = np.zeros(need, dtype=np.uint8)
    h = rng.standard_normal((4, E), dtype=np.float32)
    w1 = megafuse.quantize(w["w1"], megafuse.CK_DT_Q8_0)
    megafuse.mega_fused_mlp_prefill(h, h, h, gamma, w1, None, CKDataType.Q8_0, w["w2"], None,
                                    megafuse.CK_DT_FP32, 4, E, E, I, I, 1e-6, scratch)
    back: F32 = megafuse.dequantize(w1, CKDataType.Q8_0, (2 * I, E))
    row_bytes: int = megafuse.ck_dtype_row_bytes(CKDataType.Q4_K, 256)
    quantized: bool = megafuse.ck_dtype_is_quantized(9)
    stats: Dict[str, Union[int, float]] = megafuse.mega_fuse_report_stats(E, 2, 16)
    config = megafuse.show_config(file=io.StringIO())
    threads: int = megafuse.get_num_threads()
    megafuse.set_num_threads(threads)
    level: str = megafuse.simd_level()
    include: str = megafuse.get_include()
    fmt: CKDataType = megafuse.gguf.ck_dtype("Q4_K", "blk.0.attn_q.weight")
    assert tiles[0] > 0 and row_bytes == 144 and quantized and level and include
    assert fmt == CKDataType.Q4_K and "reduction" in stats and "simd_level" in config
    return float(np.abs(back).max() + np.abs(out).max())


if __name__ == "__main__":
    decoder_layer()
    print(f"ok {header_functions():.3f}")
