"""Prove a SIMD level before using it: a known-answer self-test of every kernel family.

megafuse builds its kernels once per SIMD level (megafuse/kernels/simd.py).  Before a level above
``generic`` is used, ``select_level()`` runs small cases of every kernel family (FAMILIES) at that
level and compares them with the ``generic`` level's results -- the portable C build is the known
answer -- within the tolerances the test suite uses between levels (TOL).  A level that disagrees
is not used: a RuntimeWarning names the level and the families, and the next level down is tried
(amx -> avx512 -> avx2 -> generic).

- megafuse/__init__.py calls ``select_level()`` as soon as megafuse._kernels is imported (that
  module runs the generic kernels until then), so no kernel above generic runs unproven.
- ``MEGAFUSE_SIMD=<level>`` still forces a level.  The self-test runs for a forced level too, and a
  forced level that fails it is kept, with the warning: the user asked for exactly that level
  (to debug it, or to run the test suite at it).
- ``generic`` is the reference and is not tested against itself; one tiny decode is checked
  against its float64 closed form (a warning if it disagrees: the build itself is broken).
- The cases run on one thread (the user's thread count is restored after), on about 1 MiB of
  arrays at the peak, in a few milliseconds.  ``RESULTS`` keeps what happened, for
  ``megafuse.show_config()`` (``megafuse info``).
- Test hook: ``MEGAFUSE_SELFTEST_FAULT="avx2:attention_decode,generic:known_answer"`` perturbs the
  results of one family of one level before the comparison, as a broken kernel would
  (tests/kernels/test_selftest.py); ``run_level(level, faults=..., kernels=...)`` does the same
  in process.

Dimension letters as everywhere: E / Ea embed dim (aligned), H / G heads / kv heads, D / Da head
dim (aligned), T tokens, C cache capacity, I intermediate dim, V vocabulary, R rows, n columns.
"""
import dataclasses
import math
import os
import time
import warnings

import numpy as np

from megafuse import _kernels
from megafuse.kernels import simd as _simd
from megafuse.kernels.dtype import CKDataType as DT

# The kernel families, in the order they run.  Each is a function _family_<name>(cases) below.
FAMILIES = (
    "quantize",           # megafuse.quantize, every weight format (bit for bit)
    "dequantize",         # megafuse.dequantize, every weight format (bit for bit)
    "float_dot",          # _kernels._rows_dot, float activations, every weight format
    "int8_dot",           # _kernels._rows_dot, int8 activations, every block format
    "rmsnorm_qkv_rope",   # mega_fuse_rmsnorm_qkv_rope and mega_fuse_rmsnorm_qkv
    "attention_decode",   # mega_fused_attention_decode: padded dims, past one KV tile
    "attention_prefill",  # mega_fused_attention_prefill: 7 tokens straddling a KV tile
    "int8_tiles",         # mega_fused_attention_prefill_q8_0: the multi-token int8 tiles
    "mlp",                # mega_fused_mlp_prefill: FP32 (float) and Q5_0 / Q5_K (int8)
    "model_step",         # the model step (ModelRunner): a 1-layer model, int8 and float, prefill
                          # and decode
)

# Between levels, the tolerances of the test suite (keep in step: tests/kernels/test_selftest.py
# checks).
TOL = {
    "float": 1e-5,        # tests/helpers.py: float activations, max|got - want| / max|want|
    "q8_emulated": 1e-4,  # tests/helpers.py: int8 path, per token row (assert_q8_close's rule)
    "float_dot": 1e-5,    # tests/kernels/test_quant.py: float dot, relative to sum |w_i x_i|
    "int8_dot": 1e-6,     # tests/kernels/test_quant.py: int8 dot, relative to sum |w_i x_i|
    "q8_model": 5e-3,     # tests/llm/test_model.py: the int8 whole model
}
# quantize and dequantize are bit for bit at every level (tests/kernels/test_quant.py;
# -ffp-contract=off).

FAULT_ENV = "MEGAFUSE_SELFTEST_FAULT"

FLOAT_FORMATS = (DT.FP32, DT.FP16, DT.BF16)
BLOCK_FORMATS = (DT.Q4_0, DT.Q4_1, DT.Q5_0, DT.Q5_1, DT.Q8_0, DT.IQ4_NL, DT.Q2_K, DT.Q3_K,
                 DT.Q4_K, DT.Q5_K, DT.Q6_K, DT.IQ4_XS)
WEIGHT_FORMATS = FLOAT_FORMATS + BLOCK_FORMATS


@dataclasses.dataclass
class LevelResult:
    """What the self-test found for one level."""
    level: str
    status: str                # passed / failed / reference / not run / not supported / not built
    failures: tuple = ()       # ((family, what went wrong), ...)
    seconds: float = 0.0       # this level's cases and comparisons (generic: its known answer
                               # and the results the other levels are compared with)
    worst: float = 0.0         # the largest error of a passing family, as a fraction of its TOL
    ratios: dict = dataclasses.field(default_factory=dict)   # family -> its largest error / TOL
    note: str = ""

    def failed_families(self):
        return ", ".join(family for family, _ in self.failures)

    def details(self):
        return "; ".join(f"{family}: {detail}" for family, detail in self.failures)

    def summary(self):
        ms = f"{self.seconds * 1e3:.1f} ms"
        note = f" ({self.note})" if self.note else ""
        if self.status == "passed":
            return f"passed in {ms} (largest error {self.worst:.0%} of its tolerance){note}"
        if self.status == "failed":
            return f"failed in {ms}: {self.details()}{note}"
        if self.status == "reference":
            return f"the reference, not tested against itself{note}"
        return self.status + note


# level -> LevelResult of the last select_level(), and its whole time (megafuse.show_config())
RESULTS = {}
TOTAL_SECONDS = 0.0


def summary():
    """{level: one line on its self-test, ..., "total": the time} for megafuse.show_config()."""
    lines = {level: RESULTS[level].summary() for level in _simd.LEVELS if level in RESULTS}
    if RESULTS:
        lines["total"] = f"{TOTAL_SECONDS * 1e3:.1f} ms, on one thread"
    return lines


# ---- choosing the level ---------------------------------------------------------------------

def select_level(*, stand_in=None):
    """Choose the SIMD level this process runs, prove it, load it; return its name.

    The best level the CPU supports (or MEGAFUSE_SIMD's, which raises ImportError for a level
    the CPU or the build cannot run) runs the self-test against generic; a level that fails is
    replaced by the next supported one down, with a RuntimeWarning.  The thread count is
    restored; RESULTS tells what happened.  stand_in ({level: level whose kernels run in its
    place}) is for tests only: with a patched _simd.supported_levels it walks the avx512 path
    on a CPU without AVX-512."""
    global TOTAL_SECONDS
    stand_in = stand_in or {}
    t0 = time.perf_counter()
    target = _simd.choose_level()
    forced = _simd.forced_level()
    built, supported = _simd.built_levels(), _simd.supported_levels()
    faults = parse_faults(os.environ.get(FAULT_ENV, ""))
    RESULTS.clear()
    for level in _simd.LEVELS:
        if level not in built:
            RESULTS[level] = LevelResult(level, "not built")
        elif level not in supported:
            lacks = ", ".join(_simd.missing_features(level))
            RESULTS[level] = LevelResult(level, "not supported by this CPU",
                                         note=f"it lacks {lacks}" if lacks else "")
        else:
            RESULTS[level] = LevelResult(level, "not run")
    threads = _kernels.get_num_threads()
    _kernels.set_num_threads(1)
    try:
        chosen = _prove(target, forced, supported, faults, stand_in)
    finally:
        _kernels.set_num_threads(threads)
    _kernels._load_level(stand_in.get(chosen, chosen))
    TOTAL_SECONDS = time.perf_counter() - t0
    return chosen


def _prove(target, forced, supported, faults, stand_in):
    """The level to load: `target` if it passes, else the best lower one that does."""
    _kernels._load_level("generic")
    generic = RESULTS["generic"]
    generic.status = "reference"
    t0 = time.perf_counter()
    problem = _known_answer(faults)
    generic.seconds = time.perf_counter() - t0
    generic.note = (f"float64 known answer {'FAILED: ' + problem if problem else 'passed'} "
                    f"in {generic.seconds * 1e3:.1f} ms")
    if problem:
        generic.failures = (("known_answer", problem),)
        warnings.warn(f"megafuse: the generic kernels disagree with a float64 known answer "
                      f"({problem}): this build of megafuse is broken", RuntimeWarning,
                      stacklevel=3)
    if target == "generic":
        for level in supported[1:]:
            RESULTS[level].note = "MEGAFUSE_SIMD=generic"
        return "generic"
    # the forced level alone, or the best first, down to the one above generic
    candidates = [target] if forced else [lv for lv in reversed(supported) if lv != "generic"]
    try:
        t1 = time.perf_counter()
        cases = _Cases()
        want = _run_families(cases, "generic", ())
        ms = (time.perf_counter() - t1) * 1e3
        generic.seconds = time.perf_counter() - t0
        generic.note += f"; its results for the other levels {ms:.1f} ms"
    except Exception as exc:  # noqa: BLE001 -- a bug here must not make import fail
        warnings.warn(f"megafuse: the SIMD self-test could not run ({type(exc).__name__}: "
                      f"{exc}); using the {target if forced else 'generic'} kernels unproven",
                      RuntimeWarning, stacklevel=3)
        return target if forced else "generic"
    for i, level in enumerate(candidates):
        result = _check_level(level, cases, want, faults, stand_in.get(level, level))
        RESULTS[level] = result
        if result.status == "passed":
            for lower in candidates[i + 1:]:
                RESULTS[lower].note = f"{level} passed"
            return level
        if forced:
            result.note = f"kept: MEGAFUSE_SIMD={level}"
            warnings.warn(f"megafuse: the {level} kernels fail their self-test against generic "
                          f"in {result.failed_families()} ({result.details()}); "
                          f"MEGAFUSE_SIMD={level} keeps them (unset it to fall back to a level "
                          f"that passes)", RuntimeWarning, stacklevel=3)
            return level
        below = candidates[i + 1] if i + 1 < len(candidates) else "generic"
        result.note = f"{below} used instead"
        warnings.warn(f"megafuse: the {level} kernels fail their self-test against generic in "
                      f"{result.failed_families()} ({result.details()}); using {below} instead",
                      RuntimeWarning, stacklevel=3)
    return "generic"


def run_level(level, *, faults=(), kernels=None):
    """Run the self-test of `level` now (generic's results computed afresh) and return its
    LevelResult; the loaded level and the thread count are left as they were.

    faults: (level, family) pairs to perturb (the test hook); kernels: the level whose kernels
    stand in for `level` (tests exercise the avx512 path on a CPU without AVX-512 this way)."""
    before, threads = _kernels.simd_level(), _kernels.get_num_threads()
    _kernels.set_num_threads(1)
    try:
        _kernels._load_level("generic")
        cases = _Cases()
        want = _run_families(cases, "generic", ())
        return _check_level(level, cases, want, set(faults), kernels or level)
    finally:
        _kernels._load_level(before)
        _kernels.set_num_threads(threads)


def parse_faults(text):
    """'avx2:mlp, avx512:int8_dot' -> {('avx2', 'mlp'), ('avx512', 'int8_dot')}."""
    faults = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        level, _, family = item.partition(":")
        if level not in _simd.LEVELS or family not in FAMILIES + ("known_answer",):
            raise ImportError(f"{FAULT_ENV}: expected level:family items (levels "
                              f"{', '.join(_simd.LEVELS)}; families {', '.join(FAMILIES)}, "
                              f"known_answer), got {item!r}")
        faults.add((level, family))
    return faults


def _check_level(level, cases, want, faults, kernels):
    """Run every family with `kernels`' level loaded, label the results `level`, compare."""
    t0 = time.perf_counter()
    _kernels._load_level(kernels)
    try:
        got = _run_families(cases, level, faults)
    finally:
        _kernels._load_level("generic")
    failures, ratios = [], {}
    for family in FAMILIES:
        if isinstance(got[family], Exception):
            exc = got[family]
            failures.append((family, f"raised {type(exc).__name__}: {exc}"))
            continue
        family_worst, problem = 0.0, None
        for name, array in got[family].items():
            ratio, detail = _compare(family, name, array, want, cases)
            family_worst = max(family_worst, ratio)
            if not ratio <= 1.0 and problem is None:      # NaN fails too
                problem = f"{name}: {detail}"
        ratios[family] = family_worst
        if problem:
            failures.append((family, problem))
    worst = max((r for f, r in ratios.items() if f not in dict(failures)), default=0.0)
    return LevelResult(level, "failed" if failures else "passed", tuple(failures),
                       time.perf_counter() - t0, worst, ratios)


def _run_families(cases, level, faults):
    """{family: {name: result array} or the exception it raised} at the loaded level."""
    out = {}
    for family in FAMILIES:
        try:
            result = globals()[f"_family_{family}"](cases)
        except Exception as exc:  # noqa: BLE001 -- a kernel that raises fails its family
            out[family] = exc
            continue
        if (level, family) in faults:
            result = _perturb(result)
        out[family] = result
    return out


def _perturb(result):
    """The results of a broken kernel: the first element of the first result changed."""
    result = dict(result)
    name = next(iter(result))
    a = result[name].copy()
    if a.dtype.kind == "f":
        a.flat[0] += 1.0 + float(np.max(np.abs(a)))
    else:
        a.view(np.uint8).flat[a.nbytes // 2] ^= 0x10
    result[name] = a
    return result


# ---- comparisons: each returns (error / tolerance, what it measured) --------------------------

def _compare(family, name, got, want, cases):
    ref = want[family][name]
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return np.inf, f"shape {got.shape} {got.dtype}, expected {ref.shape} {ref.dtype}"
    if family in ("quantize", "dequantize"):
        differ = int(np.count_nonzero(got.view(np.uint8) != ref.view(np.uint8)))
        return (np.inf if differ else 0.0), f"{differ} bytes differ"
    if family in ("float_dot", "int8_dot"):
        return _dot_error(got, ref, cases.dot_scale(want, name), TOL[family])
    if family == "int8_tiles":                    # pure float: the float prefill of the case
        return _q8_error(got, ref, want["attention_prefill"][name])
    if family == "mlp" and name.startswith("int8"):
        return _q8_error(got, ref, want["mlp"]["float" + name[len("int8"):]])
    if family == "model_step" and name.startswith("int8"):
        return _rel_error(got, ref, TOL["q8_model"])
    return _rel_error(got, ref, TOL["float"])


def _rel_error(got, want, tol):
    got, want = got.astype(np.float64), want.astype(np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-30)
    err = float(np.max(np.abs(got - want))) / scale
    return err / tol, f"relative error {err:.2e} (tolerance {tol:.0e})"


def _dot_error(got, want, scale, tol):
    """Each dot within tol of sum |w_i x_i| (the test suite's measure for dot products)."""
    err = np.abs(got.astype(np.float64) - want.astype(np.float64)) / (scale + 1e-30)
    worst = float(np.max(err))
    return worst / tol, f"error {worst:.2e} of sum |w x| (tolerance {tol:.0e})"


def _q8_error(got, want, pure):
    """tests/helpers.py assert_q8_close between two levels of the int8 path: an activation that
    sits within an ulp of an int8 rounding boundary may take the neighbouring code at another
    level (its float32 input is summed in another order), which moves its token row by about one
    quantization step.  So every row must be within TOL["q8_emulated"], except at most one in
    eight (at least one) that must stay within a third of the int8 path's own quantization error
    (|int8 - float|, `pure` being the float path's result)."""
    tol = TOL["q8_emulated"]
    got, want, pure = (np.asarray(a, np.float64) for a in (got, want, pure))
    scale = max(float(np.max(np.abs(want))), 1e-30)
    row_err = (np.abs(got - want) / scale).reshape(want.shape[0], -1).max(axis=1)
    allowance = max(tol, float(np.max(np.abs(want - pure))) / scale / 3)
    worst = float(np.max(row_err))
    flipped = int(np.sum(~(row_err < tol)))
    if flipped > max(1, len(row_err) // 8):
        return np.inf, f"{flipped} of {len(row_err)} rows beyond {tol:.0e} (worst {worst:.2e})"
    return worst / allowance, (f"relative error {worst:.2e} (allowance {allowance:.1e}, a third "
                               f"of the int8 path's own error)")


# ---- the generic level against a float64 known answer ----------------------------------------

def _known_answer(faults):
    """Decode at position 0 of an empty cache: attention over one key is that key's value, so
    output = residual + bo + wo @ v(rmsnorm(x)) exactly (float64 here).  Returns a problem or
    None."""
    E, Ea, H, G, D, Da = 24, 32, 2, 1, 8, 8
    rng = _Rng(120)
    f32 = lambda *shape: _f32(rng, *shape)  # noqa: E731
    x, res, gamma = f32(Ea), f32(Ea), 1 + 0.1 * f32(E)
    wq, wk, wv = f32(H * Da, Ea), f32(G * Da, Ea), f32(G * Da, Ea)
    for w in (wq, wk, wv):
        w[:, E:] = 0.0
    wo, bo = f32(Ea, H * Da), f32(Ea)
    wo[E:], bo[E:] = 0.0, 0.0
    out = np.empty(Ea, np.float32)
    kc, vc = np.zeros((G, 1, Da), np.float32), np.zeros((G, 1, Da), np.float32)
    try:
        _kernels.mega_fused_attention_decode(
            out, x, res, gamma, wq, None, wk, None, wv, None, wo, bo, kc, vc, None, None, 0,
            E, Ea, H, G, D, Da, 1, 1e-6)
    except Exception as exc:  # noqa: BLE001 -- reported as the problem it is
        return f"attention_decode raised {type(exc).__name__}: {exc}"
    if ("generic", "known_answer") in faults:
        out = _perturb({"output": out})["output"]
    xs = x[:E].astype(np.float64)
    xn = xs / np.sqrt(np.mean(xs * xs) + 1e-6) * gamma
    v = wv[:, :E].astype(np.float64) @ xn                        # [G*Da]
    attn = np.concatenate([v[(h // (H // G)) * Da:(h // (H // G) + 1) * Da] for h in range(H)])
    want = wo.astype(np.float64) @ attn + bo + res
    want[E:] = 0.0
    ratio, detail = _rel_error(out, want, TOL["float"])
    return None if ratio <= 1.0 else f"attention_decode: {detail}"


# ---- the cases -------------------------------------------------------------------------------

class _Rng:
    """Seeded pseudo-random numbers without numpy.random (importing it would cost more than the
    whole self-test): splitmix64 of a counter, in NumPy's wrapping uint64 arithmetic.  Values
    are cut from chunks of 16 Ki, so the many small arrays cost one generation."""

    CHUNK = 1 << 14

    def __init__(self, seed):
        self.seed, self.count = seed, 0
        self.pool = np.empty(0, np.float32)

    def bits(self, n):
        z = np.arange(self.count, self.count + n, dtype=np.uint64)
        self.count += n
        z += np.uint64(self.seed << 32)
        z *= np.uint64(0x9E3779B97F4A7C15)
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 1)):
            z ^= z >> np.uint64(shift)
            z *= np.uint64(factor)
        return z

    def values(self, shape):
        """float32 values of mean 0 and variance 1: uniform on +-sqrt(3) (the kernels care
        about no distribution, and a normal one would cost a logarithm and a cosine a value)."""
        n = math.prod(shape) if isinstance(shape, tuple) else shape
        if self.pool.size < n:
            m = max(n, self.CHUNK)
            u = (self.bits(m) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
            self.pool = (u - np.float32(0.5)) * np.float32(2 * 3 ** 0.5)       # [-sqrt 3, sqrt 3)
        out, self.pool = self.pool[:n].reshape(shape), self.pool[n:]
        return out

    def uniform(self, shape, lo, hi):
        return lo + (hi - lo) * (self.values(shape) / np.float32(2 * 3 ** 0.5) + np.float32(0.5))

    def bytes(self, n):
        return self.bits((n + 7) // 8).view(np.uint8)[:n]

    def integers(self, hi, n):
        """n integers in 0 .. hi-1."""
        return (self.bits(n) % np.uint64(hi)).astype(np.int64)


def _f32(rng, *shape, scale=1.0):
    return rng.values(shape) * np.float32(scale)


# Where the fp16 scale fields of each block format sit (GGML's layouts), and their values for
# weights of spread ~1 given random codes: (byte offset, scale) for d, then m / dmin as a
# multiple of d (Q6_K's and Q3_K's d are their last two bytes).
_BLOCK_SCALES = {
    DT.Q4_0: ((0, 1 / 4.6),),
    DT.Q4_1: ((0, 1 / 4.6), (2, -8.0)),
    DT.Q5_0: ((0, 1 / 9.2),),
    DT.Q5_1: ((0, 1 / 9.2), (2, -16.0)),
    DT.Q8_0: ((0, 1 / 74.0),),
    DT.Q4_K: ((0, 1 / 147.0), (2, 7.5)),
    DT.Q5_K: ((0, 1 / 294.0), (2, 15.5)),
    DT.Q6_K: ((-2, 1 / 1184.0),),
    DT.IQ4_NL: ((0, 1 / 62.0),),
    DT.Q2_K: ((80, 1 / 16.0), (82, 1.5)),
    DT.Q3_K: ((-2, 1 / 48.0),),
    DT.IQ4_XS: ((0, 1 / 1150.0),),
}


def _weights(rng, dt, rows, cols, scale):
    """A [rows, cols] weight in format dt with values of spread ~scale: random codes and a
    random scale per block (0.5x .. 1.5x) for the block formats -- every code occurs, which a
    quantizer's output does not promise, and no quantizer runs -- else the float values
    stored in dt."""
    if dt not in BLOCK_FORMATS:
        return _kernels.quantize(_f32(rng, rows, cols, scale=scale), dt)
    block, nbytes = _kernels.ck_dtype_block_size(dt), _kernels.ck_dtype_block_bytes(dt)
    nb = rows * cols // block
    blocks = rng.bytes(nb * nbytes).reshape(nb, nbytes)
    (offset, unit), *rest = _BLOCK_SCALES[dt]
    d = scale * unit * rng.uniform(nb, 0.5, 1.5).astype(np.float64)
    fields = [(offset % nbytes, d)] + [(off, d * factor) for off, factor in rest]
    for off, values in fields:
        blocks[:, off:off + 2] = values.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, -1)


def _padded(rng, heads, D, Da, cols, Ea, scale):
    """[heads*Da, Ea] float32 whose padding rows (d >= D) and columns (>= cols) are zero."""
    w = np.zeros((heads, Da, Ea), np.float32)
    w[:, :D, :cols] = _f32(rng, heads, D, cols, scale=scale)
    return w.reshape(heads * Da, Ea)


def _rope(D, rows):
    """cos, sin [rows, D/2] of rotate-half RoPE."""
    angles = np.arange(rows)[:, None] * 10000.0 ** (-np.arange(0, D, 2) / D)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _written_rows(cache, start, T):
    """[G, C, Da] cache -> the rows of positions start..start+T-1 as [T, G*Da]."""
    return np.ascontiguousarray(cache[:, start:start + T, :].transpose(1, 0, 2)).reshape(T, -1)


class _Cases:
    """The inputs of every family (seeded: the same on every run), made at the generic level."""

    def __init__(self):
        rng = _Rng(12)
        self._dots(rng)
        self._qkv(rng)
        self._decode(rng)
        self._prefill(rng)
        self._mlp(rng)
        self._model(rng)

    def _dots(self, rng):
        """Per weight format: float weights w [R, n] (two rows of them to quantize), a weight
        blob [R, row bytes] of random blocks to dequantize and dot, activations x [n].  R = 5:
        a group of four rows and one more; n: a tail past the vector width (float formats), an
        odd number of blocks (32-weight formats), two super-blocks (K-quants)."""
        self.fmt = {}
        for dt in WEIGHT_FORMATS:
            n = {1: 100, 32: 288, 256: 512}[_kernels.ck_dtype_block_size(dt)]
            w = rng.values((5, n)) * np.exp(rng.uniform((5, 1), -2, 2))
            self.fmt[dt] = (w, _weights(rng, dt, 5, n, 1.0), _f32(rng, n))
        self._scales = {}

    def dot_scale(self, want, name):
        """sum_i |w_i x_i| of each row (the generic level's dequantized weights)."""
        if name not in self._scales:
            x = self.fmt[DT[name]][2].astype(np.float64)
            self._scales[name] = np.abs(want["dequantize"][name].astype(np.float64) * x).sum(1)
        return self._scales[name]

    def _qkv(self, rng):
        hidden, H, G, D = 100, 2, 1, 20
        cos, sin = _rope(D, 8)
        self.qkv = dict(
            input=_f32(rng, hidden), gamma=1 + _f32(rng, hidden, scale=0.1),
            W_qkv=_f32(rng, (H + 2 * G) * D, hidden, scale=hidden ** -0.5),
            b_qkv=_f32(rng, (H + 2 * G) * D, scale=0.1), hidden=hidden, num_heads=H,
            num_kv_heads=G, head_dim=D, eps=1e-5)
        self.qkv_rope = dict(rope_cos=cos, rope_sin=sin, pos=5, max_seq=8)

    def _decode(self, rng):
        """FP32, padded dims (E 100 of 104, D 20 of 24), four query heads on one kv head, the
        token just past the first KV tile of a random history."""
        E, Ea, H, G, D, Da = 100, 104, 4, 1, 20, 24
        pos = _kernels.mega_fuse_get_optimal_tiles(D)[1] + 1
        C = pos + 1
        cache = np.zeros((2, G, C, Da), np.float32)                 # k, v: [G, C, Da] each
        cache[:, :, :pos, :D] = _f32(rng, 2, G, pos, D)
        wo = np.zeros((Ea, H, Da), np.float32)
        wo[:E, :, :D] = _f32(rng, E, H, D, scale=(H * D) ** -0.5)
        x = _f32(rng, Ea)
        x[E:] = 1e3                                                 # padding: ignored
        bias = {}
        for name, heads in (("bq", H), ("bk", G), ("bv", G)):
            bias[name] = np.zeros((heads, Da), np.float32)          # padding dims: 0
            bias[name][:, :D] = _f32(rng, heads, D, scale=0.1)
        cos, sin = _rope(D, C)
        self.dec = dict(
            input=x, residual=_f32(rng, Ea), ln1_gamma=1 + _f32(rng, E, scale=0.1),
            wq=_padded(rng, H, D, Da, E, Ea, E ** -0.5), bq=bias["bq"].reshape(-1),
            wk=_padded(rng, G, D, Da, E, Ea, E ** -0.5), bk=bias["bk"].reshape(-1),
            wv=_padded(rng, G, D, Da, E, Ea, E ** -0.5), bv=bias["bv"].reshape(-1),
            wo=wo.reshape(Ea, H * Da), bo=np.pad(_f32(rng, E, scale=0.1), (0, Ea - E)),
            rope_cos=cos, rope_sin=sin, pos=pos, embed_dim=E, aligned_embed_dim=Ea,
            num_heads=H, num_kv_heads=G, head_dim=D, aligned_head_dim=Da, cache_capacity=C,
            eps=1e-6)
        self.dec_cache = cache

    def _prefill(self, rng):
        """7 tokens at positions kv_tile-3 .. kv_tile+3 (they straddle a KV tile) over a random
        history, two query heads on one kv head; wq Q4_K, wk Q8_0, wv Q6_K (three kinds of
        int8 tile), wo BF16 (float); and the same layer with wq Q2_K, wk Q3_K, wv IQ4_XS, wo
        IQ4_NL (the tiles of the other formats), whose results carry the suffix "2"."""
        E, H, G, D, T = 256, 2, 1, 32, 7
        start = max(0, _kernels.mega_fuse_get_optimal_tiles(D)[1] - 3)
        C = start + T
        cache = np.zeros((2, G, C, D), np.float32)                  # k, v: [G, C, D] each
        cache[:, :, :start] = _f32(rng, 2, G, start, D)
        cos, sin = _rope(D, C)
        args = dict(input=_f32(rng, T, E), residual=_f32(rng, T, E),
                    ln1_gamma=1 + _f32(rng, E, scale=0.1),
                    bq=_f32(rng, H * D, scale=0.1), bk=_f32(rng, G * D, scale=0.1),
                    bv=_f32(rng, G * D, scale=0.1), bo=_f32(rng, E, scale=0.1),
                    rope_cos=cos, rope_sin=sin, start_pos=start, tokens=T, cache_capacity=C,
                    embed_dim=E, aligned_embed_dim=E, num_heads=H, num_kv_heads=G, head_dim=D,
                    aligned_head_dim=D, eps=1e-6)
        need = max(_kernels.mega_fused_attention_prefill_scratch_size(T, E, H, D),
                   _kernels.mega_fused_attention_prefill_q8_0_scratch_size(T, E, H, D))
        args["scratch"] = np.zeros(need, np.uint8)
        self.pre, self.pre_cache = {}, cache
        for suffix, formats in (("", (DT.Q4_K, DT.Q8_0, DT.Q6_K, DT.BF16)),
                                ("2", (DT.Q2_K, DT.Q3_K, DT.IQ4_XS, DT.IQ4_NL))):
            case = dict(args)
            for name, dt, rows, cols in zip(("wq", "wk", "wv", "wo"), formats,
                                            (H * D, G * D, G * D, E), (E, E, E, H * D)):
                case[name] = _weights(rng, dt, rows, cols, cols ** -0.5)
                case[name + "_dt"] = dt
            self.pre[suffix] = case

    def _mlp(self, rng):
        """7 tokens, E 32, I 256: w1 Q5_0, w2 Q5_K (the int8 path), and the same weights in
        FP32 (the float path: the int8 path's pure-float counterpart); then w1 IQ4_NL, w2
        IQ4_XS likewise (the results "int8_iq4", "float_iq4")."""
        T, E, I = 7, 32, 256
        w1 = _weights(rng, DT.Q5_0, 2 * I, E, E ** -0.5)
        w2 = _weights(rng, DT.Q5_K, E, I, I ** -0.5)
        v1 = _weights(rng, DT.IQ4_NL, 2 * I, E, E ** -0.5)
        v2 = _weights(rng, DT.IQ4_XS, E, I, I ** -0.5)
        self.mlp = dict(input=_f32(rng, T, E), residual=_f32(rng, T, E),
                        ln2_gamma=1 + _f32(rng, E, scale=0.1),
                        b1=_f32(rng, 2 * I, scale=0.1), b2=_f32(rng, E, scale=0.1),
                        tokens=T, embed_dim=E, aligned_embed_dim=E, intermediate_dim=I,
                        aligned_intermediate_dim=I, eps=1e-5,
                        scratch=np.zeros(_kernels.mega_fused_mlp_prefill_scratch_size(T, E, I),
                                         np.uint8))
        self.mlp_weights = {}
        for suffix, (a, a_dt), (b, b_dt) in (("", (w1, DT.Q5_0), (w2, DT.Q5_K)),
                                             ("_iq4", (v1, DT.IQ4_NL), (v2, DT.IQ4_XS))):
            self.mlp_weights["int8" + suffix] = dict(w1=a, w1_dt=a_dt, w2=b, w2_dt=b_dt)
            self.mlp_weights["float" + suffix] = dict(
                w1=_kernels.dequantize(a, a_dt, (2 * I, E)), w1_dt=DT.FP32,
                w2=_kernels.dequantize(b, b_dt, (E, I)), w2_dt=DT.FP32)

    def _model(self, rng):
        """One qwen2-style layer (biases on q, k, v) of E 64, H 2, G 1, D 32, I 64, V 32, C 8,
        its weights in six formats (the K-quants, whose rows would need E 256, run in the
        other families); one runner per activation mode, sharing the weights."""
        E, H, G, D, I, V, C = 64, 2, 1, 32, 64, 32, 8
        layer = dict(ln1_gamma=1 + _f32(rng, E, scale=0.1), ln2_gamma=1 + _f32(rng, E, scale=0.1),
                     bq=_f32(rng, H * D, scale=0.1), bk=_f32(rng, G * D, scale=0.1),
                     bv=_f32(rng, G * D, scale=0.1))
        for name, dt, rows, cols in (("wq", DT.Q5_1, H * D, E), ("wk", DT.Q4_1, G * D, E),
                                     ("wv", DT.Q4_0, G * D, E), ("wo", DT.FP16, E, H * D),
                                     ("w1", DT.Q8_0, 2 * I, E), ("w2", DT.Q5_0, E, I)):
            layer[name] = _weights(rng, dt, rows, cols, cols ** -0.5)
            layer[name + "_dt"] = dt
        cos, sin = _rope(D, C)
        shared = dict(embed_dim=E, num_heads=H, num_kv_heads=G, head_dim=D, intermediate_dim=I,
                      cache_capacity=C, eps=1e-5, vocab_size=V,
                      embedding=_weights(rng, DT.Q8_0, V, E, 1.0), embedding_dt=DT.Q8_0,
                      out_norm=1 + _f32(rng, E, scale=0.1),
                      head=_weights(rng, DT.BF16, V, E, E ** -0.5), head_dt=DT.BF16,
                      rope_cos=cos, rope_sin=sin)
        from megafuse.llm import _runner   # the step's boundary (needs megafuse._kernels only)
        self.runners = {}
        for mode in ("int8", "float"):
            own = dict(layer, k_cache=np.zeros((G, C, D), np.float32),
                       v_cache=np.zeros((G, C, D), np.float32))
            self.runners[mode] = _runner.ModelRunner(layers=[own], activations=mode, **shared)
        self.tokens = rng.integers(V, C).astype(np.int32)                 # [C]


# ---- the families: each runs its kernels at the loaded level and returns its results ---------

def _family_quantize(c):
    return {dt.name: _kernels.quantize(w[:2], dt) for dt, (w, _, _) in c.fmt.items()}


def _family_dequantize(c):
    return {dt.name: _kernels.dequantize(blob, dt, w.shape) for dt, (w, blob, _) in c.fmt.items()}


def _family_float_dot(c):
    return {dt.name: _kernels._rows_dot(blob, dt, x, False, w.shape[0])
            for dt, (w, blob, x) in c.fmt.items()}


def _family_int8_dot(c):
    return {dt.name: _kernels._rows_dot(blob, dt, x, True, w.shape[0])
            for dt, (w, blob, x) in c.fmt.items() if dt in BLOCK_FORMATS}


def _family_rmsnorm_qkv_rope(c):
    H, G, D = c.qkv["num_heads"], c.qkv["num_kv_heads"], c.qkv["head_dim"]
    out = {}
    for name, extra, fn in (("rope", c.qkv_rope, _kernels.mega_fuse_rmsnorm_qkv_rope),
                            ("plain", {}, _kernels.mega_fuse_rmsnorm_qkv)):
        q, k, v = (np.empty(n * D, np.float32) for n in (H, G, G))
        fn(q_out=q, k_out=k, v_out=v, **c.qkv, **extra)
        out.update({f"{name}_q": q, f"{name}_k": k, f"{name}_v": v})
    return out


def _family_attention_decode(c):
    a = c.dec
    out = np.empty(a["aligned_embed_dim"], np.float32)
    kc, vc = c.dec_cache[0].copy(), c.dec_cache[1].copy()
    _kernels.mega_fused_attention_decode(output=out, kv_cache_k=kc, kv_cache_v=vc, **a)
    return {"output": out, "k_cache": kc[:, a["pos"]], "v_cache": vc[:, a["pos"]]}


def _prefill(c, fn):
    res = {}
    for suffix, a in c.pre.items():
        out = np.empty((a["tokens"], a["aligned_embed_dim"]), np.float32)
        kc, vc = c.pre_cache[0].copy(), c.pre_cache[1].copy()
        fn(output=out, kv_cache_k=kc, kv_cache_v=vc, **a)
        res.update({"output" + suffix: out,
                    "k_cache" + suffix: _written_rows(kc, a["start_pos"], a["tokens"]),
                    "v_cache" + suffix: _written_rows(vc, a["start_pos"], a["tokens"])})
    return res


def _family_attention_prefill(c):
    return _prefill(c, _kernels.mega_fused_attention_prefill)


def _family_int8_tiles(c):
    return _prefill(c, _kernels.mega_fused_attention_prefill_q8_0)


def _family_mlp(c):
    out = {}
    for name, weights in c.mlp_weights.items():
        out[name] = np.empty((c.mlp["tokens"], c.mlp["aligned_embed_dim"]), np.float32)
        _kernels.mega_fused_mlp_prefill(output=out[name], **c.mlp, **weights)
    return out


def _family_model_step(c):
    out = {}
    T = len(c.tokens) - 1                               # a prefill of T tokens, then a decode
    for mode, runner in c.runners.items():
        V, E = runner.vocab_size, runner.embed_dim
        logits, x = np.empty((T, V), np.float32), np.empty((T, E), np.float32)
        runner.forward(c.tokens[:T], start_pos=0, logits=logits, all_logits=True, x_out=x)
        logits1, x1 = np.empty(V, np.float32), np.empty((1, E), np.float32)
        runner.forward(c.tokens[T:], start_pos=T, logits=logits1, x_out=x1)
        out.update({f"{mode}_prefill_logits": logits, f"{mode}_prefill_x": x,
                    f"{mode}_decode_logits": logits1, f"{mode}_decode_x": x1})
    return out
