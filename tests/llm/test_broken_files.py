"""A loader that rejects every broken file the same way (issue 36, item 6): each defect of a model
file is a ValueError naming the file and the key or tensor, raised by Model.from_gguf and
DecoderLayer.from_gguf before anything is copied or allocated; NotImplementedError is kept for a
valid file that uses what megafuse does not run.  Also the rules of ``cache_capacity``.

The files are one small valid llama model (tests/llm/test_model.py's write_model) edited byte by
byte (tests/llm/gguf_edit.py).  The fuzz over hundreds of such variants is
tests/llm/test_loader_fuzz.py."""
import re

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from megafuse import DecoderLayer  # noqa: E402
from megafuse.llm import gguf as mf_gguf  # noqa: E402
from megafuse.llm import model as mf_model  # noqa: E402
from megafuse.llm.model import Model  # noqa: E402
from gguf_edit import GGUFDoc, V  # noqa: E402
from test_model import write_model  # noqa: E402

SMALL = (64, 4, 2, 16, 128)           # (E, H, G, D, I)
VOCAB = 320


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid 2-layer llama file (Q8_0 layers, a tied Q8_0 embedding) with the
    rope.dimension_count that llama.cpp's converter writes."""
    path = tmp_path_factory.mktemp("broken") / "base.gguf"
    write_model(path, "llama", "Q8_0", shape=SMALL, bias=False, vocab=VOCAB)
    doc = GGUFDoc(path).set("llama.rope.dimension_count", SMALL[3], V.UINT32)
    doc.write(path)
    Model.from_gguf(path, cache_capacity=8).forward([1, 2, 3])        # (it loads and runs)
    return path


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    path = tmp_path_factory.mktemp("broken") / "untied.gguf"
    return write_model(path, "llama", "Q8_0", shape=SMALL, bias=False, vocab=VOCAB, tied=False,
                       head_format="Q8_0")


def edited(src, dst, edit, **counts):
    doc = GGUFDoc(src)
    edit(doc)
    return str(doc.write(dst, **counts))


def refused(path, match, *, layer=True, kind=ValueError):
    """Model.from_gguf(path) (and DecoderLayer.from_gguf(path, 0) unless layer=False) raise
    `kind` with a message that starts with the file's path and matches `match` after it."""
    pattern = "^" + re.escape(str(path)) + ": " + match
    with pytest.raises(kind, match=pattern):
        Model.from_gguf(path, cache_capacity=8)
    if layer:
        with pytest.raises(kind, match=pattern):
            DecoderLayer.from_gguf(path, 0, cache_capacity=8)


# ---- tensors: missing, extra, misplaced, misshapen -----------------------------------------

def test_a_missing_layer_tensor_names_the_file(base, tmp_path):
    """Was a ValueError naming the tensor only (and, before issue 35, a KeyError)."""
    path = edited(base, tmp_path / "m.gguf", lambda d: d.drop_tensor("blk.1.ffn_down.weight"))
    refused(path, r"blk\.1\.ffn_down\.weight: a llama layer needs this tensor; the file has "
                  r"none \(llama\.block_count = 2; it has tensors of layers 0\.\.1\)$")
    # through gguf's own reader too
    with pytest.raises(ValueError, match=re.escape(path) + r": blk\.1\.ffn_down\.weight"):
        Model.from_gguf(gguf.GGUFReader(path), cache_capacity=8)


def test_a_missing_model_tensor_names_the_file(base, tmp_path):
    path = edited(base, tmp_path / "m.gguf", lambda d: d.drop_tensor("output_norm.weight"))
    refused(path, r"output_norm\.weight: a llama model needs this tensor; the file has none$",
            layer=False)


@pytest.mark.parametrize("name,new,match", [
    ("blk.0.ffn_down.weight", "blk.0.ffn_dowm.weight",
     r"blk\.0\.ffn_dowm\.weight: not a tensor of a llama layer \(a layer has attn_k\.bias, "),
    ("blk.1.attn_q.weight", "blk.2.attn_q.weight",
     (r"blk\.2\.attn_q\.weight: a tensor of layer 2, but llama\.block_count = 2 "
      r"\(layers 0\.\.1\)$")),
    ("blk.1.attn_q.weight", "blk.01.attn_q.weight",
     r"blk\.01\.attn_q\.weight: not a tensor of a llama model"),
    ("blk.1.attn_q.weight", "blk." + "9" * 5000 + ".attn_q.weight",
     r"blk\.9{5000}\.attn_q\.weight: a tensor of layer 9{5000}, but"),
    # a renamed head would otherwise load, silently tied to the embedding
    ("output_norm.weight", "output_nrom.weight",
     r"output_nrom\.weight: not a tensor of a llama model \(it has output\.weight, "),
])
def test_a_tensor_the_architecture_does_not_list_is_refused(base, tmp_path, name, new, match):
    path = edited(base, tmp_path / "m.gguf", lambda d: d.rename_tensor(name, new))
    refused(path, match)


def test_an_extra_tensor_is_refused_even_beside_every_needed_one(base, tmp_path):
    path = edited(base, tmp_path / "m.gguf",
                  lambda d: d.copy_tensor("blk.0.attn_q.weight", "blk.0.attn_q2.weight"))
    refused(path, r"blk\.0\.attn_q2\.weight: not a tensor of a llama layer")
    path = edited(base, tmp_path / "n.gguf",
                  lambda d: d.copy_tensor("blk.1.attn_q.weight", "blk.5.attn_q.weight"))
    refused(path, r"blk\.5\.attn_q\.weight: a tensor of layer 5, but llama\.block_count = 2")


@pytest.mark.parametrize("count,match", [
    (3, (r"blk\.2\.attn_norm\.weight: a llama layer needs this tensor; the file has none "
         r"\(llama\.block_count = 3; it has tensors of layers 0\.\.1\)$")),
    (512, r"blk\.2\.attn_norm\.weight: a llama layer needs this tensor"),
    (513, (r"llama\.block_count: expected an integer <= 512 \(llama\.cpp's LLAMA_MAX_LAYERS\), "
           r"got 513$")),
    (2**40, r"llama\.block_count: expected an integer <= 512"),
])
def test_a_block_count_beyond_the_tensors(base, tmp_path, count, match):
    """Was a KeyError naming the tensor (14 of the issue's cases)."""
    path = edited(base, tmp_path / "m.gguf",
                  lambda d: d.set("llama.block_count", count, V.UINT64))
    refused(path, match)


def test_a_tensor_count_that_drops_the_last_tensors(base, tmp_path):
    """The header's tensor_count one less (the last info is read as padding and every tensor's
    data shifts) or zero: a ValueError naming the file, whatever it trips on first."""
    n = len(GGUFDoc(base).tensors)
    for count in (n - 1, 0):
        path = edited(base, tmp_path / f"c{count}.gguf", lambda d: None, tensor_count=count)
        with pytest.raises(ValueError, match="^" + re.escape(path) + ": "):
            Model.from_gguf(path, cache_capacity=8)


@pytest.mark.parametrize("key,value,match", [
    # shapes that disagree with the hyper-parameters, named with both
    ("llama.feed_forward_length", 256,
     (r"blk\.0\.ffn_gate\.weight: expected GGML shape \[64, 256\] \(a \[256, 64\] matrix\), "
      r"got \[64, 128\]$")),
    ("llama.attention.key_length", 32,
     (r"blk\.0\.attn_q\.weight: expected GGML shape \[64, 128\] \(a \[128, 64\] matrix\), got "
      r"\[64, 64\]$")),
])
def test_a_layer_shape_that_disagrees_with_the_hparams(base, tmp_path, key, value, match):
    path = edited(base, tmp_path / "m.gguf",
                  lambda d: d.drop("llama.rope.dimension_count").set(key, value, V.UINT32))
    refused(path, match)


def test_model_tensor_shapes(base, untied, tmp_path):
    path = edited(base, tmp_path / "n.gguf", lambda d: (
        d.drop_tensor("output_norm.weight").add_tensor("output_norm.weight", np.ones(32))))
    refused(path, r"output_norm\.weight: expected GGML shape \[64\] \(a vector of 64\), got "
                  r"\[32\]$")
    # the output head's rows are the vocabulary: they must be the embedding's
    doc = GGUFDoc(untied)
    head = doc.tensors[doc.index("output.weight")]
    head[1][1] -= 32
    head[3] = head[3][:len(head[3]) * (VOCAB - 32) // VOCAB]
    path = str(doc.write(tmp_path / "h.gguf"))
    refused(path, r"output\.weight: 288 rows \(the output head's vocabulary\), but "
                  r"token_embd\.weight has 320$")


# ---- the vocabulary -------------------------------------------------------------------------

def test_a_vocabulary_that_disagrees_with_the_embedding(base, tmp_path):
    """1,000 tokens beside 320 embedding rows loaded, and failed only at generation; llama.cpp
    refuses it at load."""
    tokens = [f"t{i}" for i in range(1000)]
    path = edited(base, tmp_path / "t.gguf",
                  lambda d: d.set("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING))
    refused(path, r"tokenizer\.ggml\.tokens: 1000 tokens, but token_embd\.weight has 320 rows "
                  r"\(one a token\)$")
    path = edited(base, tmp_path / "s.gguf",
                  lambda d: d.set("tokenizer.ggml.tokens", "abc", V.STRING))
    refused(path, r"tokenizer\.ggml\.tokens: expected an array of strings, got the string")
    path = edited(base, tmp_path / "v.gguf", lambda d: d.set("llama.vocab_size", 1000, V.UINT32))
    refused(path, r"llama\.vocab_size = 1000, but token_embd\.weight has 320 rows")
    # as many tokens as rows: loads
    path = edited(base, tmp_path / "ok.gguf", lambda d: d.set(
        "tokenizer.ggml.tokens", tokens[:VOCAB], V.ARRAY, V.STRING))
    assert Model.from_gguf(path, cache_capacity=8).vocab_size == VOCAB


# ---- values the float32 kernels cannot hold ---------------------------------------------------

@pytest.mark.parametrize("key,value,vtype,shown", [
    ("llama.attention.layer_norm_rms_epsilon", 1e300, V.FLOAT64, r"1e\+300 is inf"),
    ("llama.attention.layer_norm_rms_epsilon", 1e-50, V.FLOAT64, r"1e-50 is 0\.0"),
    ("llama.rope.freq_base", 1e39, V.FLOAT64, r"1e\+39 is inf"),
    ("llama.attn_logit_softcapping", 1e300, V.FLOAT64, r"1e\+300 is inf"),
    ("llama.final_logit_softcapping", 4e38, V.FLOAT64, r"4e\+38 is inf"),
    ("llama.final_logit_softcapping", 1e-60, V.FLOAT64, r"1e-60 is 0\.0"),
])
def test_a_value_float32_cannot_hold(base, tmp_path, key, value, vtype, shown):
    """An RMS epsilon of 1e300 passed the float64 check, became inf in float32, and every
    logit was 0: the model 'worked' and generated nothing."""
    path = edited(base, tmp_path / "f.gguf", lambda d: d.set(key, value, vtype))
    refused(path, re.escape(key) + ": " + shown + r" in float32, the kernels' precision: "
                  r"expected a value that is finite and (>|>=) 0 there$")


@pytest.mark.parametrize("value", [1.0, 3e38, 2**64 - 1])
def test_an_epsilon_is_less_than_one(base, tmp_path, value):
    """An epsilon float32 holds (3e38) swamps every mean square: each layer's output is ~0, the
    last one underflows, and every logit is the same (the fuzz found it)."""
    vtype = V.UINT64 if isinstance(value, int) else V.FLOAT64
    path = edited(base, tmp_path / "e.gguf",
                  lambda d: d.set("llama.attention.layer_norm_rms_epsilon", value, vtype))
    refused(path, r"llama\.attention\.layer_norm_rms_epsilon: expected an epsilon < 1, got ")


@pytest.mark.parametrize("value,vtype", [(3e38, V.FLOAT32), (2**64 - 1, V.UINT64)])
def test_a_rope_attn_factor_whose_square_float32_cannot_hold(base, tmp_path, value, vtype):
    """The RoPE tables are scaled by it, so q and k are, and the scores by its square: 3e38 is
    finite in float32, the scores were not, and every logit NaN (the fuzz found it)."""
    path = edited(base, tmp_path / "a.gguf",
                  lambda d: d.set("llama.rope.scaling.attn_factor", value, vtype))
    refused(path, r"llama\.rope\.scaling\.attn_factor: .* scales q and k, so the scores by its "
                  r"square, which is inf in float32$")


def test_a_linear_rope_factor_float32_cannot_hold(base, tmp_path):
    path = edited(base, tmp_path / "f.gguf", lambda d: (
        d.set("llama.rope.scaling.type", "linear", V.STRING),
        d.set("llama.rope.scaling.factor", 1e-50, V.FLOAT64)))
    refused(path, r"llama\.rope\.scaling\.factor: 1e-50 is 0\.0 in float32")


def test_soft_caps_of_zero_are_not_capped_and_negative_ones_are_refused(base, tmp_path):
    path = edited(base, tmp_path / "z.gguf",
                  lambda d: d.set("llama.final_logit_softcapping", 0.0, V.FLOAT32))
    assert Model.from_gguf(path, cache_capacity=8).config.final_softcap == 0.0
    path = edited(base, tmp_path / "n.gguf",
                  lambda d: d.set("llama.attn_logit_softcapping", -1.0, V.FLOAT32))
    refused(path, r"llama\.attn_logit_softcapping: expected a finite value >= 0, got -1\.0$")


@pytest.mark.parametrize("factors,shown", [
    ([1.0] * 7 + [0.0], r"\[1\.0, 1\.0, 1\.0, 1\.0, 1\.0, 1\.0, 1\.0, 0\.0\]"),
    ([np.nan] + [1.0] * 7, r"\[nan, 1\.0"), ([np.inf] * 8, r"\[inf, inf"),
    ([-2.0] * 8, r"\[-2\.0"),
])
def test_rope_frequency_factors_must_be_finite_and_positive(base, tmp_path, factors, shown):
    """(They divide the RoPE frequencies: a table of NaN was a ValueError from rope_tables
    that named no file.)"""
    path = edited(base, tmp_path / "r.gguf", lambda d: d.add_tensor("rope_freqs.weight",
                                                                    np.array(factors)))
    refused(path, r"rope_freqs\.weight: expected RoPE frequency factors that are finite and "
                  r"> 0, got " + shown)


# ---- hyper-parameters that contradict each other: ValueError, not NotImplementedError ------

@pytest.mark.parametrize("changes,match", [
    # a corrupt head_count was "partial rotary embeddings are not supported"
    ({"llama.attention.head_count": 5, "llama.attention.head_count_kv": 1},
     (r"llama\.embedding_length = 64 is not a multiple of llama\.attention\.head_count = 5, and "
      r"llama\.attention\.key_length is missing \(head_dim would be embedding_length / "
      r"head_count\)$")),
    ({"llama.attention.head_count": 8},
     (r"llama\.rope\.dimension_count = 16 is more than head_dim = 8: RoPE rotates dimensions of "
      r"a head$")),
    ({"llama.attention.head_count": 6, "llama.attention.head_count_kv": 4},
     (r"llama\.attention\.head_count = 6 is not a multiple of llama\.attention\.head_count_kv "
      r"= 4")),
    ({"llama.attention.head_count_kv": 3},
     (r"llama\.attention\.head_count = 4 is not a multiple of llama\.attention\.head_count_kv = "
      r"3 \(query heads share kv heads in equal groups\)$")),
    # consistent with the heads, but not with the file's own tensors
    ({"llama.attention.head_count": 2},
     (r"blk\.0\.attn_k\.weight: expected GGML shape \[64, 64\] \(a \[64, 64\] matrix\), got "
      r"\[64, 32\]$")),
    ({"llama.embedding_length": 128},
     r"token_embd\.weight: 64 columns, but llama\.embedding_length = 128"),
    ({"llama.attention.value_length": 8},
     r"blk\.0\.attn_v\.weight: expected GGML shape \[64, 16\]"),
    ({"llama.attention.key_length": 15, "llama.rope.dimension_count": 15},
     r"head_dim = 15 \(llama\.attention\.key_length\) is odd: RoPE rotates pairs"),
    ({"llama.feed_forward_length": 0},
     r"llama\.feed_forward_length: expected an integer >= 1, got 0$"),
    ({"llama.embedding_length": 2**31},
     (r"llama\.embedding_length: expected an integer <= 2147483647 \(a C int of the native "
      r"step\), got 2147483648$")),
])
def test_inconsistent_hparams_are_value_errors(base, tmp_path, changes, match):
    def edit(doc):
        for key, value in changes.items():
            doc.set(key, value, V.UINT32 if value < 2**32 else V.UINT64)
    refused(edited(base, tmp_path / "h.gguf", edit), match)


def test_valid_but_unsupported_files_keep_their_not_implemented_error(base, tmp_path):
    """Consistent files of a feature megafuse does not run: NotImplementedError naming the
    file and the key or tensor."""
    cases = [
        (lambda d: d.set("llama.rope.dimension_count", 8, V.UINT32),
         r"llama\.rope\.dimension_count = 8: partial rotary embeddings \(head_dim = 16\)"),
        (lambda d: d.set("llama.rope.scaling.type", "dynamic", V.STRING),
         r"llama\.rope\.scaling\.type = 'dynamic': linear and yarn RoPE scaling are supported"),
        (lambda d: d.set("llama.expert_count", 8, V.UINT32),
         r"llama\.expert_count = 8: mixture-of-experts"),
        (lambda d: d.set("general.architecture", "mamba", V.STRING),
         (r"general\.architecture: megafuse runs gemma2, gemma3, llama, phi3, qwen2, qwen3 GGUF "
          r"files, got 'mamba'")),
    ]
    for i, (edit, match) in enumerate(cases):
        refused(edited(base, tmp_path / f"u{i}.gguf", edit), match, kind=NotImplementedError)
    # a broken file that also uses an unsupported feature: the ValueError first
    path = edited(base, tmp_path / "b.gguf", lambda d: (
        d.set("llama.rope.scaling.type", "dynamic", V.STRING),
        d.set("llama.attention.layer_norm_rms_epsilon", 1e300, V.FLOAT64)))
    refused(path, r"llama\.attention\.layer_norm_rms_epsilon: 1e\+300 is inf in float32")


def test_an_unsupported_tensor_type_names_the_file_and_the_tensor(tmp_path):
    path = write_model(tmp_path / "q.gguf", "llama", {"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0",
                                                      "wo": "Q8_0", "gate": "Q8_0",
                                                      "up": "Q8_0", "w2": "F32"},
                       shape=SMALL, bias=False, vocab=VOCAB)
    doc = GGUFDoc(path)
    down = doc.tensors[doc.index("blk.1.ffn_down.weight")]
    down[2] = 26                                    # F32 -> I32: the same bytes per value
    path = str(doc.write(tmp_path / "i32.gguf"))
    refused(path, r"blk\.1\.ffn_down\.weight: GGML type I32 is not supported by megafuse",
            kind=NotImplementedError)


@pytest.mark.parametrize("name", ["rope_factors_long.weight", "rope_factors_short.weight"])
def test_phi3_longrope_factors_must_be_finite_and_positive(tmp_path, name):
    import os
    from helpers import DATA_DIR
    src = os.path.join(DATA_DIR, "arch", "phi3_longrope.gguf")
    doc = GGUFDoc(src)
    values = np.frombuffer(doc.tensors[doc.index(name)][3], np.float32).copy()
    values[3] = 0.0
    doc.drop_tensor(name).add_tensor(name, values)
    path = str(doc.write(tmp_path / "p.gguf"))
    refused(path, re.escape(name) + r": expected RoPE frequency factors that are finite and > "
                  r"0, got \[")


def test_the_real_files_pass_the_checks(smollm2_path):
    hp = mf_gguf.check_file(smollm2_path)
    assert (hp["block_count"], hp["vocab_size"]) == (30, 49152)


# ---- cache_capacity ----------------------------------------------------------------------------

@pytest.mark.parametrize("value,kind,match", [
    (True, TypeError, r"cache_capacity: expected an int, got the boolean True"),
    (1.5, TypeError, r"cache_capacity: expected an int, got float 1\.5"),
    (64.0, TypeError, r"cache_capacity: expected an int, got float 64\.0"),
    ("64", TypeError, r"cache_capacity: expected an int, got the string '64'"),
    (0, ValueError, r"cache_capacity: expected a positive value, got 0"),
    (-3, ValueError, r"cache_capacity: expected a positive value, got -3"),
])
def test_cache_capacity_takes_integers_only(base, value, kind, match):
    """'64' was accepted and 1.5 became 1."""
    with pytest.raises(kind, match=match):
        Model.from_gguf(base, cache_capacity=value)
    with pytest.raises(kind, match=match):
        DecoderLayer.from_gguf(base, 0, cache_capacity=value)
    model = Model.from_gguf(base, cache_capacity=8)
    with pytest.raises(kind, match=match):
        model.layer(0, cache_capacity=value)
    with pytest.raises(kind, match=match):
        DecoderLayer.from_arrays(**layer_arrays(), cache_capacity=value)
    assert Model.from_gguf(base, cache_capacity=np.int64(8)).cache_capacity == 8


def layer_arrays(E=64, H=4, G=2, D=16, I=128):
    rng = np.random.default_rng(0)

    def w(rows, cols):
        return rng.standard_normal((rows, cols)).astype(np.float32) * 0.1
    return dict(ln1_gamma=np.ones(E, np.float32), ln2_gamma=np.ones(E, np.float32),
                wq=w(H * D, E), wk=w(G * D, E), wv=w(G * D, E), wo=w(E, H * D),
                w1=w(2 * I, E), w2=w(E, I), num_heads=H, num_kv_heads=G)


def test_a_cache_the_machine_cannot_hold_is_refused_before_it_is_allocated(base):
    """2**40 positions died in a MemoryError allocating 8 TiB of RoPE tables."""
    E, H, G, D, I = SMALL
    kv = 2 * 2 * G * D * 4 * 2**40                  # 2 layers x k, v x [G, C, D] float32
    rope = 2 * 2**40 * (D // 2) * 4                 # one pair of [C, D/2] float32 tables
    match = (rf"cache_capacity = {2**40}: the KV caches \({kv} bytes\) and the RoPE tables "
             rf"\({rope} bytes\) would need {kv + rope} bytes \(.* GiB\), more than this "
             rf"machine's memory")
    with pytest.raises(ValueError, match=match):
        Model.from_gguf(base, cache_capacity=2**40)
    with pytest.raises(ValueError, match=r"cache_capacity = 1099511627776: the KV caches"):
        DecoderLayer.from_gguf(base, 0, cache_capacity=2**40)
    with pytest.raises(ValueError, match=r"cache_capacity = 1099511627776: the KV caches"):
        DecoderLayer.from_arrays(**layer_arrays(), cache_capacity=2**40)
    model = Model.from_gguf(base, cache_capacity=8)
    with pytest.raises(ValueError, match=r"cache_capacity = 1099511627776: the KV caches"):
        model.layer(1, cache_capacity=2**40)


@pytest.mark.filterwarnings("ignore:cache_capacity = 4096 is more than")
def test_the_memory_bound_is_the_machines(base, monkeypatch):
    """With 1 MiB of memory, a cache of 4096 positions (2 layers x 2 x [2, 4096, 16] float32 =
    2 MiB) is refused and one of 64 loads; float16 caches take half."""
    monkeypatch.setattr(mf_model, "machine_memory", lambda: 2**20)
    with pytest.raises(ValueError, match=r"cache_capacity = 4096: the KV caches \(2097152 "
                                         r"bytes\) and the RoPE tables \(262144 bytes\)"):
        Model.from_gguf(base, cache_capacity=4096)
    with pytest.raises(ValueError, match=r"cache_capacity = 4096: the KV caches \(1048576 "
                                         r"bytes\)"):
        Model.from_gguf(base, cache_capacity=4096, kv_dtype="float16")
    assert Model.from_gguf(base, cache_capacity=64).cache_capacity == 64
    monkeypatch.setattr(mf_model, "machine_memory", lambda: None)    # unknown: not bounded
    assert Model.from_gguf(base, cache_capacity=4096).cache_capacity == 4096


def test_machine_memory_is_the_physical_memory_or_less():
    import os
    have = mf_model.machine_memory()
    assert have is not None and 0 < have <= os.sysconf("SC_PHYS_PAGES") * \
        os.sysconf("SC_PAGE_SIZE")


def test_past_the_int_positions_of_the_step(base, monkeypatch):
    monkeypatch.setattr(mf_model, "machine_memory", lambda: None)
    with pytest.raises(ValueError, match=r"cache_capacity = 2147483648: at most 2147483647 "
                                         r"positions \(the step's positions are C ints\)"):
        Model.from_gguf(base, cache_capacity=2**31)


def test_the_context_length_policy(base, tmp_path):
    """No cache_capacity: the model's context length, at most 4096 (4096 when the file has
    none).  More than the context length is allowed, as llama.cpp allows it, with a warning."""
    assert Model.from_gguf(base).cache_capacity == 256               # write_model's context
    path = edited(base, tmp_path / "c.gguf", lambda d: d.set("llama.context_length", 2**40,
                                                             V.UINT64))
    assert Model.from_gguf(path).cache_capacity == 4096
    path = edited(base, tmp_path / "n.gguf", lambda d: d.drop("llama.context_length"))
    assert DecoderLayer.from_gguf(path, 0).cache_capacity == 4096
    with pytest.warns(RuntimeWarning, match=r"cache_capacity = 300 is more than the model's "
                                            r"context_length = 256"):
        Model.from_gguf(base, cache_capacity=300)
    with pytest.warns(RuntimeWarning, match=r"context_length = 256"):
        DecoderLayer.from_gguf(base, 0, cache_capacity=300)


def test_layer_zero_cache_capacity_is_not_the_models(base):
    """Model.layer(cache_capacity=0) took the model's capacity (0 is falsy)."""
    model = Model.from_gguf(base, cache_capacity=8)
    assert model.layer(0).cache_capacity == 8
    assert model.layer(0, cache_capacity=16).cache_capacity == 16
    with pytest.raises(ValueError, match=r"cache_capacity: expected a positive value, got 0"):
        model.layer(0, cache_capacity=0)
