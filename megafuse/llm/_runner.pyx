# The boundary of the whole-model step (megafuse/kernels/levels/model_step.pxi): ModelRunner
# checks a model's arrays once, when it is built, and keeps them; each forward() then checks only
# its own arguments (token ids, positions, output arrays) before the one nogil call that runs
# every layer.  megafuse.Model and megafuse.DecoderLayer run on it.  Layout of the model:
# include/megafuse/mf_model.h.  Letters: L layers, E embed dim, H / G heads / kv heads, D head
# dim, I FFN dim, V vocabulary, C cache capacity, T tokens.
#
# The SIMD level in use and the thread count are megafuse._kernels' (read through its boundary
# capsule at every call); the argument checks are the header functions' own (kernels/checks.pxi).

cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

import numpy as np

from megafuse import _kernels
from megafuse._kernels cimport c_mega_fuse_get_optimal_tiles
from megafuse.kernels.kernel_table cimport (
    KernelTable, mf_boundary, mf_team, mf_team_create, mf_team_destroy, mf_team_run,
    mf_team_slot_acquire, mf_team_slot_release,
    mf_team_claim_gen, mf_team_wait_done, mf_team_chunk_done, mf_atomic_load32, mf_atomic_add32,
    mf_model, mf_model_layer, mf_step, mf_step_scratch, mf_step_scratch_layout, mf_phase,
    mf_step_max_phases, MF_STEP_SOLO_BYTES, MF_STEP_TOKENS, MF_ACT_SILU, MF_ACT_GELU_TANH,
    MF_ATT_MAX_HEAD_DIM, mf_segment, MF_STEP_MAX_SEGMENTS)
from megafuse.kernels.mf_quant cimport mf_activation_row_bytes
from megafuse cimport _ckernel_dtype as ckdt

cnp.import_array()

include "kernels/dtype_args.pxi"
include "kernels/checks.pxi"

# megafuse._kernels' level table and thread count, as they are when a call reads them
cdef const mf_boundary *_boundary = <const mf_boundary *>PyCapsule_GetPointer(
    _kernels._boundary_capsule(), b"megafuse.boundary")

# a layer's matrices and biases, by the roles of megafuse.llm.arch
from megafuse.llm.arch import BIAS_ROLES as _LAYER_BIASES, MATRIX_ROLES as _LAYER_WEIGHTS


# The thread team every runner uses is megafuse._kernels' (one per process, remade when the
# thread count changes; the header functions run on it too: _boundary.team_slot), so that the
# steps of many runners -- a chain of DecoderLayers, several models -- and header calls between
# them find the same threads awake.  With a team per runner, each of them kept its own threads
# spinning for a while after its step (MF_TEAM_IDLE_SPIN_NS), on the cores the next runner's
# step needed, and woke its own sleeping threads at its next call: a chain of runners could run
# slower on two threads than on one.  A runner whose step starts while another call holds it
# runs on a team of its own (ModelRunner.team).
# float16 caches are read by mf_attend_range_f16 (include/megafuse/mf_attention.h), which takes
# head dims up to MF_ATT_MAX_HEAD_DIM
_KV_F16_MAX_HEAD_DIM = 256
# tokens one native step runs (a sliding-window layer's ring cache holds its window and these)
STEP_TOKENS = MF_STEP_TOKENS
MAX_STEP_SEQUENCES = MF_STEP_MAX_SEGMENTS     # sequences one forward_batch call may hold
# the gate activations, in the order of mf_model.activation's values (MF_ACT_SILU = 0, ...)
_GATES = ("silu", "gelu_tanh")
assert MF_ACT_SILU == 0 and MF_ACT_GELU_TANH == 1


cdef mf_team *_team_sized(mf_team **slot, int n_threads) except NULL:
    """The team at *slot, (re)made with n_threads threads if it has another count or none."""
    if slot[0] == NULL or slot[0].n_threads != n_threads:
        mf_team_destroy(slot[0])
        slot[0] = mf_team_create(n_threads)
        if slot[0] == NULL:
            raise MemoryError()
    return slot[0]


cdef float _finite(object value, str name, double minimum=-1.0):
    """A model-wide scalar: a finite float (> 0; >= 0 where minimum is 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    v = float(value)
    if not (np.isfinite(v) and np.isfinite(np.float32(v))) or v < minimum or \
            (minimum < 0 and v <= 0):
        raise ValueError(f"{name}: expected a finite float32 value "
                         f"{'>= 0' if minimum == 0 else '> 0'}, got {v!r}")
    return v


cdef Py_ssize_t _activation_row(tuple formats, Py_ssize_t n, Py_ssize_t block):
    """Bytes of the largest activation row of n values that weights of these formats (those of
    the given block size) read on the int8 path; 0 if none does."""
    cdef Py_ssize_t best = 0
    for dt in formats:
        if ckdt.ck_dtype_block_size(dt) == block and n % block == 0:
            best = max(best, <Py_ssize_t>mf_activation_row_bytes(dt, n))
    return best


cdef class ModelRunner:
    """A decoder-only model ready for the native step: every weight in its own format, the KV
    caches, the RoPE tables, the layer features of its architecture.  All arrays are checked
    here, once, and kept alive; `forward` runs tokens (or hidden states) through all layers in
    one call without the GIL, on a team of ``megafuse.get_num_threads()`` threads kept between
    calls.

    layers: one mapping a layer with ln1_gamma, ln2_gamma [E]; wq [H*D, E], wk, wv [G*D, E],
    wo [E, H*D], w1 [2*I, E] (gate rows, then up rows), w2 [E, I], each stored in its format
    (wq_dt ... w2_dt); biases bq ... b2 or None; k_cache, v_cache [G, C, D] (written), float32
    or float16 (every cache of the model alike; float16: k and v rounded as they are written,
    head_dim <= 256).
    embedding [V, E] in embedding_dt (None: forward takes hidden states), out_norm [E] and head
    [V, E] in head_dt (None: forward returns hidden states).  rope_cos / rope_sin [C, D/2] or
    None.  activations: "int8" (activations quantized for block-format weights, llama.cpp's
    scheme) or "float" (float32 throughout).

    Layer features (megafuse/llm/arch.py), each optional in a layer's mapping: q_norm, k_norm
    [D] (RMSNorm of each q / k head before RoPE); post_attn_norm, post_ffn_norm [E] (sandwich
    norms); window (sliding-window attention over that many positions) with caches of fewer
    rows than cache_capacity (a ring: at least window + MF_STEP_TOKENS rows); rope_cos /
    rope_sin (the layer's own tables, else the model's).  Model-wide: embed_scale,
    attn_scale (default 1/sqrt(head_dim)), attn_softcap, final_softcap (0: none), gate
    ("silu" or "gelu_tanh").

    Kernel: kernels/levels/model_step.pxi (model_forward_kernel), include/megafuse/mf_model.h,
    include/megafuse/mf_team.h.
    """
    cdef mf_model m
    cdef mf_model_layer *layers
    cdef mf_step st
    cdef mf_segment *segs      # [max_sequences]: the sequences of a step
    cdef void **k_caches       # [L]: this runner's caches, for a batch it joins
    cdef void **v_caches
    cdef mf_team *team         # its own, for a step that starts while the shared team is busy
    cdef char *scratch_raw
    cdef list keep
    cdef list spans            # the model's arrays as sorted, disjoint (start, end) addresses
    cdef bint busy
    cdef int last_team_threads
    cdef bint last_on_own_team
    cdef readonly int n_layers, embed_dim, num_heads, num_kv_heads, head_dim
    cdef readonly int intermediate_dim, vocab_size, cache_capacity
    cdef readonly str activations
    cdef readonly str kv_dtype        # "float32" or "float16": what the KV caches hold
    cdef readonly int max_sequences   # sequences a step of forward_batch may hold

    def __cinit__(self):
        self.layers = NULL
        self.team = NULL
        self.scratch_raw = NULL
        self.st.phases = NULL
        self.segs = NULL
        self.k_caches = self.v_caches = NULL

    def __dealloc__(self):
        mf_team_destroy(self.team)
        free(self.layers)
        free(self.st.phases)
        free(self.segs)
        free(self.k_caches)
        free(self.v_caches)
        free(self.scratch_raw)

    def __init__(self, *, layers, embed_dim, num_heads, num_kv_heads, head_dim,
                 intermediate_dim, cache_capacity, eps, vocab_size=0, embedding=None,
                 embedding_dt=None, out_norm=None, head=None, head_dt=None, rope_cos=None,
                 rope_sin=None, activations="int8", embed_scale=1.0, attn_scale=None,
                 attn_softcap=0.0, final_softcap=0.0, gate="silu", max_sequences=1):
        cdef mf_model_layer *ly
        cdef mf_step_scratch layout
        if self.layers != NULL:
            raise RuntimeError("ModelRunner: already initialised")
        E = _int_arg(embed_dim, "embed_dim")
        H = _int_arg(num_heads, "num_heads")
        G = _int_arg(num_kv_heads, "num_kv_heads")
        D = _int_arg(head_dim, "head_dim")
        I = _int_arg(intermediate_dim, "intermediate_dim")
        C = _int_arg(cache_capacity, "cache_capacity")
        V = _int_arg(vocab_size, "vocab_size")
        for name, value in (("embed_dim", E), ("head_dim", D), ("intermediate_dim", I),
                            ("cache_capacity", C)):
            _positive(value, name)
        _check_heads(H, G)
        if activations not in ("int8", "float"):
            raise ValueError(f"activations: expected 'int8' or 'float', got {activations!r}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)):
            raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
        S_max = _int_arg(max_sequences, "max_sequences")
        if not 1 <= S_max <= MF_STEP_MAX_SEGMENTS:
            raise ValueError(f"max_sequences: expected 1..{MF_STEP_MAX_SEGMENTS}, got {S_max}")
        if gate not in _GATES:
            raise ValueError(f"gate: expected one of {', '.join(_GATES)}, got {gate!r}")
        if attn_scale is None:
            attn_scale = 1.0 / float(np.sqrt(np.float32(D)))
        scalars = {"embed_scale": _finite(embed_scale, "embed_scale"),
                   "attn_scale": _finite(attn_scale, "attn_scale"),
                   "attn_softcap": _finite(attn_softcap, "attn_softcap", 0.0),
                   "final_softcap": _finite(final_softcap, "final_softcap", 0.0)}
        layer_list = list(layers)
        L = len(layer_list)
        if L < 1:
            raise ValueError("layers: expected at least one layer, got none")
        if (embedding is None) != (embedding_dt is None):
            raise ValueError("embedding, embedding_dt: expected both or neither")
        if (head is None) != (head_dt is None) or (head is None) != (out_norm is None):
            raise ValueError("out_norm, head, head_dt: expected all three or none")
        if (embedding is not None or head is not None):
            _positive(V, "vocab_size")
        # sizes as Python ints: no product here can overflow
        if H * D > 2**31 - 1 or 2 * I > 2**31 - 1 or G * C * D > 2**62 or V * E > 2**62:
            raise ValueError(f"embed_dim, num_heads, head_dim, intermediate_dim, cache_capacity,"
                             f" vocab_size: dimensions too large ({E}, {H}, {D}, {I}, {C}, {V})")

        keep = []
        written = []                       # (name, array) of every buffer the step writes
        read = []
        formats = {"xq": [], "attn": [], "act": []}
        windows = set()
        ring = post_norms = False
        self.layers = <mf_model_layer *>calloc(L, sizeof(mf_model_layer))
        if self.layers == NULL:
            raise MemoryError()
        for l, spec in enumerate(layer_list):
            p = f"layers[{l}]."
            try:
                get = spec.__getitem__
            except AttributeError:
                raise TypeError(f"layers[{l}]: expected a mapping of the layer's arrays, got "
                                f"{type(spec).__name__}") from None
            shapes = {"wq": (H * D, E, "[H*D, E]"), "wk": (G * D, E, "[G*D, E]"),
                      "wv": (G * D, E, "[G*D, E]"), "wo": (E, H * D, "[E, H*D]"),
                      "w1": (2 * I, E, "[2*I, E]"), "w2": (E, I, "[E, I]")}
            dts = {}
            for name in _LAYER_WEIGHTS:
                rows, cols, shape = shapes[name]
                arr = get(name)
                dts[name] = _weight(arr, p + name, get(name + "_dt"), rows, cols, shape)
                keep.append(arr)
                read.append((p + name, arr))
            bias_sizes = {"bq": (H * D, "[H*D]"), "bk": (G * D, "[G*D]"), "bv": (G * D, "[G*D]"),
                          "bo": (E, "[E]"), "b1": (2 * I, "[2*I]"), "b2": (E, "[E]")}
            biases = {}
            for name in _LAYER_BIASES:
                arr = spec.get(name) if hasattr(spec, "get") else get(name)
                biases[name] = _optional(arr, p + name, _F32, bias_sizes[name][0],
                                         bias_sizes[name][1])
                keep.append(arr)
                read.append((p + name, arr))
            g1 = _array(get("ln1_gamma"), p + "ln1_gamma", _F32, E, "[E]")
            g2 = _array(get("ln2_gamma"), p + "ln2_gamma", _F32, E, "[E]")
            window = _int_arg(spec.get("window", 0) or 0, p + "window")
            if window < 0:
                raise ValueError(f"{p}window: expected a window >= 0 (0: none), got {window}")
            rows = C
            if window > 0:
                windows.add(window)
                if window < C:             # a ring of the window and one step's rows
                    rows = min(C, window + MF_STEP_TOKENS)
                    ring = ring or rows < C
            kc = _array(get("k_cache"), p + "k_cache", _KV_CACHE, G * rows * D,
                        "[G, C, D]" if rows == C else f"[G, {rows}, D] (a ring)", True)
            vc = _array(get("v_cache"), p + "v_cache", _KV_CACHE, G * rows * D,
                        "[G, C, D]" if rows == C else f"[G, {rows}, D] (a ring)", True)
            norms = {}
            for name, n, shape in (("q_norm", D, "[D]"), ("k_norm", D, "[D]"),
                                   ("post_attn_norm", E, "[E]"), ("post_ffn_norm", E, "[E]")):
                arr = spec.get(name) if hasattr(spec, "get") else None
                norms[name] = _optional(arr, p + name, _F32, n, shape)
                keep.append(arr)
                read.append((p + name, arr))
            post_norms = post_norms or norms["post_attn_norm"] is not None \
                or norms["post_ffn_norm"] is not None
            cos_l = spec.get("rope_cos", rope_cos) if hasattr(spec, "get") else rope_cos
            sin_l = spec.get("rope_sin", rope_sin) if hasattr(spec, "get") else rope_sin
            _rope_tables(cos_l, sin_l, D, C - 1)
            if cos_l is not None:
                _array(cos_l, p + "rope_cos", _F32, C * (D // 2), "[C, D/2]")
                _array(sin_l, p + "rope_sin", _F32, C * (D // 2), "[C, D/2]")
                keep.extend((cos_l, sin_l))
                read.extend(((p + "rope_cos", cos_l), (p + "rope_sin", sin_l)))
            if l == 0:
                kv_dt = kc.dtype
            for name, arr in (("k_cache", kc), ("v_cache", vc)):
                if arr.dtype != kv_dt:
                    raise TypeError(f"{p}{name}: expected dtype {kv_dt} like layers[0].k_cache "
                                    f"(every cache of a model holds one dtype), got {arr.dtype}")
            keep.extend((g1, g2, kc, vc))
            read.extend(((p + "ln1_gamma", g1), (p + "ln2_gamma", g2)))
            written.extend(((p + "k_cache", kc), (p + "v_cache", vc)))
            ly = &self.layers[l]
            ly.ln1_gamma, ly.ln2_gamma = _fp(g1), _fp(g2)
            ly.wq = cnp.PyArray_DATA(<cnp.ndarray>get("wq"))
            ly.wk = cnp.PyArray_DATA(<cnp.ndarray>get("wk"))
            ly.wv = cnp.PyArray_DATA(<cnp.ndarray>get("wv"))
            ly.wo = cnp.PyArray_DATA(<cnp.ndarray>get("wo"))
            ly.w1 = cnp.PyArray_DATA(<cnp.ndarray>get("w1"))
            ly.w2 = cnp.PyArray_DATA(<cnp.ndarray>get("w2"))
            ly.wq_dt, ly.wk_dt, ly.wv_dt = dts["wq"], dts["wk"], dts["wv"]
            ly.wo_dt, ly.w1_dt, ly.w2_dt = dts["wo"], dts["w1"], dts["w2"]
            ly.bq, ly.bk, ly.bv = _fp(biases["bq"]), _fp(biases["bk"]), _fp(biases["bv"])
            ly.bo, ly.b1, ly.b2 = _fp(biases["bo"]), _fp(biases["b1"]), _fp(biases["b2"])
            ly.k_cache = cnp.PyArray_DATA(<cnp.ndarray>kc)
            ly.v_cache = cnp.PyArray_DATA(<cnp.ndarray>vc)
            ly.cache_rows, ly.window = rows, window
            ly.rope_cos, ly.rope_sin = _fp(cos_l), _fp(sin_l)
            ly.q_norm, ly.k_norm = _fp(norms["q_norm"]), _fp(norms["k_norm"])
            ly.post_attn_norm = _fp(norms["post_attn_norm"])
            ly.post_ffn_norm = _fp(norms["post_ffn_norm"])
            formats["xq"] += [dts["wq"], dts["wk"], dts["wv"], dts["w1"]]
            formats["attn"].append(dts["wo"])
            formats["act"].append(dts["w2"])

        self.m.embedding = NULL
        self.m.head = NULL
        self.m.out_norm = NULL
        self.m.embedding_dt = self.m.head_dt = 0
        if embedding is not None:
            self.m.embedding_dt = _weight(embedding, "embedding", embedding_dt, V, E, "[V, E]")
            self.m.embedding = cnp.PyArray_DATA(<cnp.ndarray>embedding)
            keep.append(embedding)
            read.append(("embedding", embedding))
        if head is not None:
            self.m.head_dt = _weight(head, "head", head_dt, V, E, "[V, E]")
            self.m.head = cnp.PyArray_DATA(<cnp.ndarray>head)
            norm = _array(out_norm, "out_norm", _F32, E, "[E]")
            self.m.out_norm = _fp(norm)
            keep.extend((head, norm))
            read.extend((("head", head), ("out_norm", norm)))
            formats["xq"].append(self.m.head_dt)
        if len(windows) > 1:
            raise NotImplementedError(f"layers[].window: every sliding-window layer of a model "
                                      f"has one window, got {sorted(windows)}")
        if (windows or scalars["attn_softcap"]) and D > MF_ATT_MAX_HEAD_DIM:
            raise NotImplementedError(f"head_dim = {D}: sliding windows and attention capping "
                                      f"take head_dim <= {MF_ATT_MAX_HEAD_DIM}")
        _check_separate(written, read)

        kv_f16 = kv_dt == np.float16
        if kv_f16 and D > _KV_F16_MAX_HEAD_DIM:
            raise ValueError(f"k_cache, v_cache: float16 caches take head_dim <= "
                             f"{_KV_F16_MAX_HEAD_DIM}, got {D} (use float32 caches)")
        int8 = activations == "int8"
        self.m.kv_f16 = kv_f16
        self.m.n_layers, self.m.E, self.m.H, self.m.G = L, E, H, G
        self.m.D, self.m.F, self.m.V, self.m.C = D, I, V, C
        self.m.eps = eps
        self.m.int8 = int8
        self.m.layers = self.layers
        self.m.embed_scale = scalars["embed_scale"]
        self.m.attn_scale = scalars["attn_scale"]
        self.m.attn_softcap = scalars["attn_softcap"]
        self.m.final_softcap = scalars["final_softcap"]
        self.m.activation = _GATES.index(gate)
        xq = tuple(formats["xq"]) if int8 else ()
        layout = mf_step_scratch_layout(
            E, H * D, I, _activation_row(xq, E, 32), _activation_row(xq, E, 256),
            max(_activation_row(tuple(formats["attn"]) if int8 else (), H * D, 32),
                _activation_row(tuple(formats["attn"]) if int8 else (), H * D, 256)),
            max(_activation_row(tuple(formats["act"]) if int8 else (), I, 32),
                _activation_row(tuple(formats["act"]) if int8 else (), I, 256)),
            2 * G * D if kv_f16 or ring or S_max > 1 else 0, E if post_norms else 0, S_max)
        self.scratch_raw = <char *>malloc(layout.total + 64)
        self.st.phases = <mf_phase *>malloc(mf_step_max_phases(L) * sizeof(mf_phase))
        self.segs = <mf_segment *>calloc(S_max, sizeof(mf_segment))
        self.k_caches = <void **>calloc(L, sizeof(void *))
        self.v_caches = <void **>calloc(L, sizeof(void *))
        if (self.scratch_raw == NULL or self.st.phases == NULL or self.segs == NULL
                or self.k_caches == NULL or self.v_caches == NULL):
            raise MemoryError()
        for l in range(L):
            self.k_caches[l] = self.layers[l].k_cache
            self.v_caches[l] = self.layers[l].v_cache
        self.st.segs = self.segs
        self.max_sequences = S_max
        memset(self.scratch_raw, 0, layout.total + 64)
        self.st.m = &self.m
        self.st.layout = layout
        self.st.scratch = <char *>((<size_t>self.scratch_raw + 63) & ~(<size_t>63))
        self.st.solo_bytes = MF_STEP_SOLO_BYTES
        self.keep = keep
        self.spans = _union_of_spans(keep)
        self.n_layers, self.embed_dim, self.num_heads, self.num_kv_heads = L, E, H, G
        self.head_dim, self.intermediate_dim, self.vocab_size = D, I, V
        self.cache_capacity = C
        self.activations = activations
        self.kv_dtype = "float16" if kv_f16 else "float32"

    @property
    def scratch_bytes(self):
        """Bytes of the step's scratch (one step of up to MF_STEP_TOKENS tokens)."""
        return self.st.layout.total

    @property
    def solo_bytes(self):
        """A step reading fewer weight bytes x tokens than this runs on the calling thread alone
        (include/megafuse/mf_model.h, MF_STEP_SOLO_BYTES); 0: every step on the team (the tests
        set it to run small models on the team)."""
        return self.st.solo_bytes

    @solo_bytes.setter
    def solo_bytes(self, value):
        if self.busy:
            raise RuntimeError("ModelRunner.solo_bytes: the model is running in another thread")
        v = _int_arg(value, "solo_bytes")
        if v < 0:
            raise ValueError(f"solo_bytes: expected a byte count >= 0, got {v}")
        self.st.solo_bytes = <size_t>v

    @property
    def team_threads(self):
        """Threads of the team the last forward ran on (0 before the first)."""
        return self.last_team_threads

    @property
    def ran_on_own_team(self):
        """Whether the last forward ran on this runner's own team (another Python thread's step
        held the shared one) rather than the shared team."""
        return self.last_on_own_team

    def forward(self, tokens=None, x=None, *, start_pos, logits=None, bint all_logits=False,
                x_out=None, hidden=None):
        """Run T tokens (int32 ids [T], through the embedding) or hidden states x (float32
        [T, E]) at positions start_pos .. start_pos+T-1 through every layer; their k and v are
        written to the caches.  Outputs (each optional, each written whole):
          logits  float32 [T, V] (all_logits) or [V] (the last token's): the head's output
          x_out   float32 [T, E]: the last layer's output (hidden states)
          hidden  float32 [L, T, E]: every layer's output
        Everything is checked before anything is written: a bad id, a position past the
        cache, a wrong output is a ValueError / TypeError and leaves the caches as they were.
        (The checks run in C; messages are built only on a failure.)
        """
        cdef const int32_t *tok_p = NULL
        cdef const float *x_p = NULL
        cdef float *logits_p = NULL
        cdef float *x_out_p = NULL
        cdef float *hidden_p = NULL
        cdef Py_ssize_t T, E = self.embed_dim, V = self.vocab_size, L = self.n_layers
        cdef int S, q_tile = 0, kv_tile = 0, n_threads
        cdef const KernelTable *table = _boundary.table[0]
        cdef mf_team *team
        cdef bint shared
        if self.layers == NULL:
            raise RuntimeError("ModelRunner: not initialised")
        if (tokens is None) == (x is None):
            raise ValueError("tokens, x: expected exactly one of them")
        S = _int_arg(start_pos, "start_pos")
        if S < 0:
            raise ValueError(f"start_pos: expected a position >= 0, got {S}")
        if tokens is not None:
            if self.m.embedding == NULL:
                raise ValueError("tokens: this model has no embedding; pass hidden states x")
            T = _token_ids(tokens, V, "tokens")
            tok_p = <const int32_t *>cnp.PyArray_DATA(<cnp.ndarray>tokens)
            first_in, first_name = tokens, "tokens"
        else:
            if not cnp.PyArray_Check(x):
                raise TypeError(f"x: expected a float32 numpy.ndarray [T, {E}], got "
                                f"{type(x).__name__}")
            T = cnp.PyArray_SIZE(<cnp.ndarray>x) // E
            if T < 1 or T * E != cnp.PyArray_SIZE(<cnp.ndarray>x):
                raise ValueError(f"x: expected [T, embed_dim = {E}] values, got shape {x.shape}")
            _array(x, "x", _F32, T * E, "[T, E]")
            x_p = _fp(x)
            first_in, first_name = x, "x"
        if S + T > self.cache_capacity:
            raise ValueError(f"tokens: {T} token{'s' if T != 1 else ''} at position {S} would "
                             f"need cache positions up to {S + T - 1}, but cache_capacity is "
                             f"{self.cache_capacity}; nothing was written")
        if logits is not None:
            if self.m.head == NULL:
                raise ValueError("logits: this model has no output head")
            _array(logits, "logits", _F32, (T if all_logits else 1) * V,
                   "[T, V]" if all_logits else "[V]", True)
            logits_p = _wp(logits)
        if x_out is not None:
            _array(x_out, "x_out", _F32, T * E, "[T, E]", True)
            x_out_p = _wp(x_out)
        if hidden is not None:
            _array(hidden, "hidden", _F32, L * T * E, "[L, T, E]", True)
            hidden_p = _wp(hidden)
        if logits is not None or x_out is not None or hidden is not None:
            _no_overlap((("logits", logits), ("x_out", x_out), ("hidden", hidden)),
                        ((first_name, first_in),))
            for name, arr in (("logits", logits), ("x_out", x_out), ("hidden", hidden)):
                if arr is not None and _overlaps(self.spans, arr):
                    raise ValueError(f"{name}: expected memory of its own, got an array that "
                                     f"overlaps the model's weights or caches")
        if self.busy:
            raise RuntimeError("ModelRunner.forward: the model is running in another thread "
                               "(a model holds one sequence: use one per thread)")
        n_threads = _boundary.num_threads[0]
        team = mf_team_slot_acquire(_boundary.team_slot, n_threads)
        shared = team != NULL                 # else another call holds it: our own
        if not shared:
            team = _team_sized(&self.team, n_threads)
        self.last_team_threads = n_threads
        self.last_on_own_team = not shared
        c_mega_fuse_get_optimal_tiles(&q_tile, &kv_tile, self.head_dim)
        self.m.q_tile, self.m.kv_tile = q_tile, kv_tile
        self.busy = True
        try:
            with nogil:
                table.model_forward(&self.st, team, tok_p, x_p, <int>T, S, logits_p,
                                    all_logits, x_out_p, hidden_p, n_threads)
        finally:
            self.busy = False
            if shared:
                mf_team_slot_release(_boundary.team_slot)

    def forward_batch(self, items):
        """One step of several sequences' tokens, the weights read once for all of them.

        items: (runner, tokens, start_pos, logits, all_logits, x_out) a sequence, each runner a
        ModelRunner on this model's weights with caches of its own (one sequence; this runner
        may be one of them), tokens int32 [n] at positions start_pos .. start_pos+n-1 of its
        caches, logits float32 [n, V] (all_logits) or [V] (the last token's) or None, x_out
        float32 [n, E] (the last layer's output) or None.  At most max_sequences items and
        MF_STEP_TOKENS tokens in all, each runner once.  Every sequence gets the bits of its
        own runner.forward (contract §7).  Everything is checked before anything is written:
        a mistake is a ValueError / TypeError and leaves every cache as it was.
        """
        cdef ModelRunner r
        cdef mf_segment *sg
        cdef const KernelTable *table = _boundary.table[0]
        cdef cnp.ndarray tok_all
        cdef mf_team *team
        cdef Py_ssize_t n, T = 0, E = self.embed_dim, V = self.vocab_size
        cdef const int32_t *tok_p
        cdef int s, S, n_threads, n_segs
        cdef bint shared
        if self.layers == NULL:
            raise RuntimeError("ModelRunner: not initialised")
        batch = list(items)
        if not 1 <= len(batch) <= self.max_sequences:
            raise ValueError(f"items: expected 1..{self.max_sequences} sequences (max_sequences),"
                             f" got {len(batch)}")
        runners, outputs, parts = [], [], []
        for s, item in enumerate(batch):
            try:
                runner, tokens, start_pos, logits, all_logits, x_out = item
            except (TypeError, ValueError):
                raise TypeError(f"items[{s}]: expected (runner, tokens, start_pos, logits, "
                                f"all_logits, x_out)") from None
            if not isinstance(runner, ModelRunner):
                raise TypeError(f"items[{s}]: expected a ModelRunner, got "
                                f"{type(runner).__name__}")
            r = <ModelRunner>runner
            if not self._shares_weights(r):
                raise ValueError(f"items[{s}]: a runner of another model (a batch runs the "
                                 f"sequences of one model's weights, cache dtype and capacity)")
            if any(r is other for other in runners):
                raise ValueError(f"items[{s}]: the same sequence twice in one step")
            if r.busy:
                raise RuntimeError(f"items[{s}]: the sequence is running in another thread")
            n = _token_ids(tokens, V, f"items[{s}].tokens")
            S = _int_arg(start_pos, f"items[{s}].start_pos")
            if S < 0 or S + n > self.cache_capacity:
                raise ValueError(f"items[{s}]: {n} tokens at position {S} need cache positions "
                                 f"0 .. {self.cache_capacity - 1}; nothing was written")
            if logits is not None:
                if self.m.head == NULL:
                    raise ValueError("logits: this model has no output head")
                _array(logits, f"items[{s}].logits", _F32, (n if all_logits else 1) * V,
                       "[n, V]" if all_logits else "[V]", True)
                outputs.append((f"items[{s}].logits", logits))
            if x_out is not None:
                _array(x_out, f"items[{s}].x_out", _F32, n * E, "[n, E]", True)
                outputs.append((f"items[{s}].x_out", x_out))
            T += n
            runners.append(r)
            parts.append((tokens, S, logits, bool(all_logits), x_out))
        if T > MF_STEP_TOKENS:
            raise ValueError(f"items: {T} tokens in all; a step takes at most {MF_STEP_TOKENS}")
        if self.busy and not any(r is self for r in runners):
            raise RuntimeError("ModelRunner.forward_batch: the runner is running in another "
                               "thread")
        _no_overlap(tuple(outputs), tuple((f"items[{s}].tokens", parts[s][0])
                                          for s in range(len(parts))))
        for name, arr in outputs:
            for rr in runners + [self]:
                if _overlaps((<ModelRunner>rr).spans, arr):
                    raise ValueError(f"{name}: expected memory of its own, got an array that "
                                     f"overlaps the model's weights or caches")
        tok_all = np.concatenate([np.asarray(p[0]) for p in parts]).astype(np.int32)
        for s in range(len(batch)):
            r = <ModelRunner>runners[s]
            tokens, S, logits, all_logits, x_out = parts[s]
            sg = &self.segs[s]
            sg.n = <int>cnp.PyArray_SIZE(<cnp.ndarray>tokens)
            sg.pos = S
            sg.k_cache, sg.v_cache = r.k_caches, r.v_caches
            sg.logits = _wp(logits) if logits is not None else NULL
            sg.all_logits = all_logits
            sg.x_out = _wp(x_out) if x_out is not None else NULL
        n_threads = _boundary.num_threads[0]
        team = mf_team_slot_acquire(_boundary.team_slot, n_threads)
        shared = team != NULL
        if not shared:
            team = _team_sized(&self.team, n_threads)
        self.last_team_threads = n_threads
        self.last_on_own_team = not shared
        c_mega_fuse_get_optimal_tiles(&self.m.q_tile, &self.m.kv_tile, self.head_dim)
        for rr in runners + [self]:
            (<ModelRunner>rr).busy = True
        tok_p = <const int32_t *>cnp.PyArray_DATA(tok_all)
        n_segs = <int>len(batch)
        try:
            with nogil:
                table.model_batch(&self.st, team, tok_p, n_segs, n_threads)
        finally:
            for rr in runners + [self]:
                (<ModelRunner>rr).busy = False
            if shared:
                mf_team_slot_release(_boundary.team_slot)

    cdef bint _shares_weights(self, ModelRunner r):
        """r runs this model's weights and features, with caches of the same dtype and rows."""
        cdef int l
        cdef mf_model_layer *a
        cdef mf_model_layer *b
        if (r is self) or (r.n_layers == self.n_layers and r.kv_dtype == self.kv_dtype
                           and r.cache_capacity == self.cache_capacity
                           and r.activations == self.activations
                           and r.m.head == self.m.head and r.m.embedding == self.m.embedding
                           and r.m.embed_scale == self.m.embed_scale
                           and r.m.attn_scale == self.m.attn_scale
                           and r.m.attn_softcap == self.m.attn_softcap
                           and r.m.final_softcap == self.m.final_softcap
                           and r.m.activation == self.m.activation and r.m.eps == self.m.eps):
            if r is self:
                return True
            for l in range(self.n_layers):
                a, b = &self.layers[l], &r.layers[l]
                if (a.wq != b.wq or a.wk != b.wk or a.wv != b.wv or a.wo != b.wo
                        or a.w1 != b.w1 or a.w2 != b.w2 or a.ln1_gamma != b.ln1_gamma
                        or a.ln2_gamma != b.ln2_gamma or a.bq != b.bq or a.bk != b.bk
                        or a.bv != b.bv or a.bo != b.bo or a.b1 != b.b1 or a.b2 != b.b2
                        or a.q_norm != b.q_norm or a.k_norm != b.k_norm
                        or a.post_attn_norm != b.post_attn_norm
                        or a.post_ffn_norm != b.post_ffn_norm or a.window != b.window
                        or a.cache_rows != b.cache_rows or a.rope_cos != b.rope_cos
                        or a.rope_sin != b.rope_sin):
                    return False
            return True
        return False


cdef Py_ssize_t _token_ids(object tokens, Py_ssize_t V, str name) except -1:
    """The count of token ids in tokens: a C-contiguous 1-D int32 array of ids in 0..V-1."""
    cdef const int32_t *tok_p
    cdef Py_ssize_t T, i, bad = -1
    if not (cnp.PyArray_Check(tokens) and cnp.PyArray_TYPE(<cnp.ndarray>tokens) ==
            cnp.NPY_INT32 and cnp.PyArray_NDIM(<cnp.ndarray>tokens) == 1 and
            cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>tokens) and
            cnp.PyArray_ISALIGNED(<cnp.ndarray>tokens) and
            not cnp.PyArray_ISBYTESWAPPED(<cnp.ndarray>tokens)):
        raise TypeError(f"{name}: expected a C-contiguous 1-D numpy.ndarray of int32")
    T = cnp.PyArray_SIZE(<cnp.ndarray>tokens)
    if T < 1:
        raise ValueError(f"{name}: expected at least one token, got none")
    tok_p = <const int32_t *>cnp.PyArray_DATA(<cnp.ndarray>tokens)
    for i in range(T):
        if tok_p[i] < 0 or tok_p[i] >= V:
            bad = i
            break
    if bad >= 0:
        raise ValueError(f"{name}: expected token ids in 0..{V - 1} (the vocabulary), got "
                         f"{tok_p[bad]} (at index {bad})")
    return T


def _union_of_spans(arrays):
    """The bytes of these arrays as sorted, disjoint [start, end) address ranges."""
    spans = sorted((a.__array_interface__["data"][0],
                    a.__array_interface__["data"][0] + a.nbytes)
                   for a in arrays if a is not None and a.nbytes)
    merged = []
    for lo, hi in spans:
        last = len(merged) - 1            # (no negative indices: wraparound is off)
        if last >= 0 and lo <= merged[last][1]:
            merged[last] = (merged[last][0], max(merged[last][1], hi))
        else:
            merged.append((lo, hi))
    return merged


cdef bint _overlaps(list spans, object arr):
    """True if arr's bytes overlap one of the sorted, disjoint (start, end) spans (binary
    search: the last span starting before arr's end)."""
    cdef Py_ssize_t lo = _addr(arr), hi = lo + cnp.PyArray_NBYTES(<cnp.ndarray>arr)
    cdef Py_ssize_t a = 0, b = len(spans), mid
    while a < b:                                  # first span starting at or after hi
        mid = (a + b) // 2
        if <Py_ssize_t>(<tuple>spans[mid])[0] < hi:
            a = mid + 1
        else:
            b = mid
    return hi > lo and a > 0 and <Py_ssize_t>(<tuple>spans[a - 1])[1] > lo


def _check_separate(written, read):
    """No buffer in `written` ((name, array) pairs) overlaps another written or read buffer
    (read buffers may overlap each other: a tied head is the embedding itself)."""
    spans = []
    for k, (name, arr) in enumerate(list(written) + list(read)):
        if arr is None:
            continue
        lo = arr.__array_interface__["data"][0]
        spans.append((lo, lo + arr.nbytes, name, k < len(written)))
    spans.sort()
    for i, (lo, hi, name, w) in enumerate(spans):
        for lo2, hi2, name2, w2 in spans[i + 1:]:
            if lo2 >= hi:
                break
            if (w or w2) and hi2 > lo and hi > lo:
                raise ValueError(f"{name2}: expected memory of its own, got an array that "
                                 f"overlaps {name}")


# ---- a test hook of the thread team (tests/llm/test_model.py) ---------------------------------

cdef struct _TeamProbe:
    int n_phases
    int per_phase                 # chunks of each phase
    uint32_t *runs                # [n_phases * per_phase]: times each chunk ran
    uint32_t bad_order            # chunks that started before an earlier phase was complete
    int spin                      # busy-work iterations per chunk (to interleave threads)


cdef void _team_probe_job(void *ctx, mf_team *team, int thread_id, uint32_t gen) noexcept nogil:
    cdef _TeamProbe *p
    cdef int64_t c
    cdef int phase, j, k
    cdef volatile int sink = 0
    while True:
        c = mf_team_claim_gen(team, gen)
        if c < 0:
            return
        p = <_TeamProbe *>ctx
        phase = <int>(c // p.per_phase)
        mf_team_wait_done(team, <uint32_t>(phase * p.per_phase))
        for j in range(phase * p.per_phase):            # every earlier chunk must have run
            if mf_atomic_load32(&p.runs[j]) == 0:
                mf_atomic_add32(&p.bad_order, 1)
                break
        for k in range(p.spin):
            sink = sink + k
        mf_atomic_add32(&p.runs[c], 1)
        mf_team_chunk_done(team)


def _team_probe(int n_threads, int jobs, int n_phases, int per_phase, int spin=0,
                bint new_team_each_job=False):
    """Run `jobs` jobs of n_phases x per_phase chunks on a team of n_threads; return
    (chunks that ran a number of times other than once, chunks that started early)."""
    cdef _TeamProbe p
    cdef mf_team *team = NULL
    cdef int i, wrong = 0, early = 0
    cdef int total = n_phases * per_phase
    if n_threads < 1 or jobs < 0 or n_phases < 1 or per_phase < 1:
        raise ValueError("_team_probe: expected positive counts")
    p.runs = <uint32_t *>calloc(total, sizeof(uint32_t))
    if p.runs == NULL:
        raise MemoryError()
    p.n_phases, p.per_phase, p.spin = n_phases, per_phase, spin
    try:
        with nogil:
            for _job in range(jobs):
                if team == NULL:
                    team = mf_team_create(n_threads)
                memset(p.runs, 0, total * sizeof(uint32_t))
                p.bad_order = 0
                mf_team_run(team, <uint32_t>total, _team_probe_job, &p)
                for i in range(total):
                    if p.runs[i] != 1:
                        wrong += 1
                early += p.bad_order
                if new_team_each_job:
                    mf_team_destroy(team)
                    team = NULL
    finally:
        mf_team_destroy(team)
        free(p.runs)
    return wrong, early
