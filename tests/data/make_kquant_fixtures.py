"""Make tests/data/kquant_fixtures.npz: blocks of the formats gguf cannot quantize, as ggml itself
writes them: the K-quants Q2_K ... Q6_K, IQ4_NL and IQ4_XS.

The inputs are a few dozen 256-weight rows (one super-block each) chosen for the corners of
GGML's quantizers: all-zero and -0 blocks, tiny (1e-30), subnormal and huge (1e30, 3e38)
values, one sign only, mixed signs, constant blocks, random normal, outliers, sparse rows
(mostly zeros: near-degenerate fits, where the order of float operations shows), sub-blocks of
very different magnitudes, sub-blocks that are zero inside a non-zero block, NaN / Inf (NaN
without payload, as np.nan); and, appended later for the 2-, 3-bit and IQ4 formats, values on
their grids (ties of their roundings), two-level and heavy-tailed rows, magnitudes by 32 and
by 16.  ggml quantizes them through ggml_quantize_chunk with no importance matrix, which runs
quantize_row_q{2,3,4,5,6}_K_ref and quantize_iq4_nl / quantize_iq4_xs (7 trial scales a side:
not quantize_row_iq4_nl_ref, which tries none).  Rows only ever get appended, so the bytes of
the earlier rows stay what they were.

Run once, with ggml-python in a virtual environment outside the tree (it builds ggml from
source in about a minute), from the repository root:

    python3 -m venv /work/peers/ggml
    /work/peers/ggml/bin/pip install ggml-python==0.0.45 numpy
    /work/peers/ggml/bin/python tests/data/make_kquant_fixtures.py

The .npz holds: ``x`` float32 [rows, 256], ``case`` (a name per row), one uint8 array [rows,
bytes of 256 weights] per format (``Q2_K`` ... ``IQ4_XS``), and ``ggml_python_version`` /
``numpy_version``.  tests/kernels/test_quant.py checks megafuse.quantize (and megafuse.reference's
port of Q4_K / Q5_K / Q6_K) against it byte for byte.  This script imports nothing of megafuse
(ggml-python and megafuse need not share an environment).
"""
import ctypes
import importlib.metadata
import os

import ggml
import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kquant_fixtures.npz")
QK_K = 256
# ggml's enum ggml_type values and bytes per 256 weights.
FORMATS = {"Q4_K": (12, 144), "Q5_K": (13, 176), "Q6_K": (14, 210), "Q2_K": (10, 84),
           "Q3_K": (11, 110), "IQ4_NL": (20, 8 * 18), "IQ4_XS": (23, 136)}
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                          113], dtype=np.float64)


def cases():
    rng = np.random.default_rng(20261201)
    n = QK_K
    i = np.arange(n)
    normal = rng.standard_normal(n)
    rows = {
        "zeros": np.zeros(n),
        "negative_zeros": -np.zeros(n),
        "tiny_1e-30": rng.standard_normal(n) * 1e-30,
        "subnormal": rng.standard_normal(n) * 1e-40,
        "huge_1e30": rng.standard_normal(n) * 1e30,
        "near_float_max": np.sign(normal) * 3e38,
        "positive_only": rng.uniform(0.5, 2.0, n),
        "negative_only": -rng.uniform(0.5, 2.0, n),
        "mixed_signs": rng.uniform(-1, 1, n) * np.where(i % 3 == 0, 4.0, 1.0),
        "constant_positive": np.full(n, 2.5),
        "constant_negative": np.full(n, -2.5),
        "normal": normal,
        "normal_scaled": rng.standard_normal(n) * 0.02,
        "one_outlier": np.where(i == 77, 100.0, rng.standard_normal(n)),
        "outliers_1": np.where(rng.random(n) < 1 / 64, 1e3, 1.0) * rng.standard_normal(n),
        "outliers_2": np.where(rng.random(n) < 1 / 64, 1e3, 1.0) * rng.standard_normal(n),
        "sparse_1": np.where(rng.random(n) < 0.9, 0.0, rng.standard_normal(n)),
        "sparse_2": np.where(rng.random(n) < 0.9, 0.0, rng.standard_normal(n)),
        "sub_block_magnitudes": rng.standard_normal(n) * np.repeat(
            np.exp2(rng.uniform(-12, 12, n // 16)), 16),
        "zero_sub_blocks": np.where((i // 16) % 3 == 1, 0.0, rng.standard_normal(n)),
        "llama_cosine": 0.1 + 2.0 * np.cos(i.astype(np.float32)).astype(np.float64),
        "nan_inf": np.where(i == 5, np.nan, np.where(i == 100, np.inf, np.where(
            i == 200, -np.inf, rng.standard_normal(n)))),
        "nan_first": np.where(i % 32 == 0, np.nan, rng.standard_normal(n)),
    }
    # appended with Q2_K, Q3_K, IQ4_NL, IQ4_XS (the rows above keep their values)
    rng = np.random.default_rng(20261205)
    rows.update({
        "iq4_grid": KVALUES_IQ4NL[rng.integers(0, 16, n)] * 0.01,
        "iq4_grid_midpoints": (KVALUES_IQ4NL[rng.integers(0, 15, n)] / 2
                               + KVALUES_IQ4NL[rng.integers(1, 16, n)] / 2) * 0.5,
        "grid_2bit": rng.integers(0, 4, n) * 0.25 - 0.4,
        "grid_3bit": rng.integers(-4, 4, n) * 0.5,
        "grid_halves": rng.integers(-16, 16, n) / 2.0,
        "two_level": np.where(rng.random(n) < 0.5, -1.0, 1.0),
        "laplace": rng.laplace(size=n),
        "student_t_1": rng.standard_t(1, n),
        "uniform_positive": rng.uniform(0, 1, n),
        "magnitude_per_32": rng.standard_normal(n) * np.repeat(
            np.exp2(rng.uniform(-16, 16, n // 32)), 32),
        "magnitude_per_16": rng.standard_normal(n) * np.repeat(
            np.exp2(rng.uniform(-8, 8, n // 16)), 16),
        "zero_sub_blocks_32": np.where((i // 32) % 2 == 1, 0.0, rng.standard_normal(n)),
        "one_nonzero": np.where(i == 200, -3.0, 0.0),
        "nan_sub_block": np.where(i // 32 == 3, np.nan, rng.standard_normal(n)),
        "inf_only": np.where(i == 17, np.inf, 0.0),
        "normal_2": rng.standard_normal(n),
        "normal_3": rng.standard_normal(n) * 1e-3,
        "normal_4": rng.standard_normal(n) * 40.0,
    })
    names = list(rows)
    x = np.stack([rows[k] for k in names]).astype(np.float32)
    return names, x


def ggml_quantize(x, type_id, row_bytes):
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    out = np.zeros((rows, cols // QK_K * row_bytes), dtype=np.uint8)
    written = ggml.ggml_quantize_chunk(type_id, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                       out.ctypes.data, 0, rows, cols, None)
    assert written == out.size, (written, out.size)
    return out


def main():
    names, x = cases()
    arrays = {"x": x, "case": np.array(names)}
    for fmt, (type_id, row_bytes) in FORMATS.items():
        arrays[fmt] = ggml_quantize(x, type_id, row_bytes)
    arrays["ggml_python_version"] = np.array(importlib.metadata.version("ggml-python"))
    arrays["numpy_version"] = np.array(np.__version__)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT}: {len(names)} rows, ggml-python {arrays['ggml_python_version']}")


if __name__ == "__main__":
    main()
