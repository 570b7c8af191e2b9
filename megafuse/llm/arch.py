"""megafuse.llm.arch: each model architecture's layout, as data.

One row a GGUF architecture (``general.architecture``) says everything the loader, ``Model``,
``DecoderLayer``, the float64 reference and the native step need to know about it:

- its tensors: for each layer tensor, the GGUF name (under ``blk.N.``), the role it plays in a
  megafuse layer (the keyword of ``DecoderLayer``: ``wq``, ``ln1_gamma``, ``bq`` ...), its shape
  as a rule over the hyper-parameters, and whether it is required; fused tensors (Phi-3's
  ``attn_qkv``) name the roles they are cut into; the model's own tensors likewise;
- what the loader does to a tensor (llama.cpp's converter interleaves llama's q / k rows:
  ``permute_qk`` puts them back in rotate-half order);
- its hyper-parameter keys (``{arch}.…``; those every architecture shares are in
  ``COMMON_HPARAMS``);
- its layer features, as flags the step plans from.

A new architecture that recombines features already implemented is one row here (and its tests).
No GGUF tensor name of a layer is spelled anywhere else in megafuse.
"""
from __future__ import annotations

import ast
import dataclasses
import operator
from typing import Dict, Mapping, Optional, Tuple

#: A layer's matrices, in the order a step reads them (and Model packs them).
MATRIX_ROLES: Tuple[str, ...] = ("wq", "wk", "wv", "wo", "w1", "w2")
#: A layer's biases, one per matrix (b1: gate, then up).
BIAS_ROLES: Tuple[str, ...] = ("bq", "bk", "bv", "bo", "b1", "b2")
#: A layer's norm weights.
NORM_ROLES: Tuple[str, ...] = ("ln1_gamma", "ln2_gamma")
#: A layer's optional feature tensors: per-head q / k norms [D], sandwich norms [E].
FEATURE_ROLES: Tuple[str, ...] = ("q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")
#: The gate activations the step runs (mf_model.h, MF_ACT_*).
GATES: Tuple[str, ...] = ("silu", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor of a layer (or of the model): its GGUF name, its role, its shape.

    ``shape`` is a rule over the hyper-parameters E (embedding), H / G (query / kv heads),
    D (head dim) and I (feed-forward dim): ``("H*D", "E")`` is a matrix of H*D rows of E
    columns (GGML order is the reverse), ``("E",)`` a vector.  ``parts`` cuts a fused tensor
    into roles by rows (the rows of each part, the same rules), in order."""
    gguf: str
    role: str
    shape: Tuple[str, ...]
    required: bool = True
    parts: Tuple[Tuple[str, str], ...] = ()


def _rule(expr: str) -> ast.expr:
    tree = ast.parse(expr, mode="eval").body
    for node in ast.walk(tree):
        if not isinstance(node, (ast.BinOp, ast.Name, ast.Constant, ast.Add, ast.Mult,
                                 ast.FloorDiv, ast.Load)):
            raise ValueError(f"shape rule {expr!r}: only names, integers, +, * and //")
    return tree


_OPS = {ast.Add: operator.add, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def evaluate(expr: str, dims: Mapping[str, int]) -> int:
    """The value of a shape rule (``"H*D"``, ``"2*I"``, ``"(H+2*G)*D"``, ``"D//2"``) for these
    dims."""
    def value(node: ast.expr) -> int:
        if isinstance(node, ast.Name):
            return int(dims[node.id])
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        assert isinstance(node, ast.BinOp)
        return int(_OPS[type(node.op)](value(node.left), value(node.right)))
    return value(_rule(expr))


def shape_of(spec: TensorSpec, dims: Mapping[str, int]) -> Tuple[int, ...]:
    """The (rows, cols) or (n,) of a tensor for these hyper-parameters."""
    return tuple(evaluate(e, dims) for e in spec.shape)


@dataclasses.dataclass(frozen=True)
class SlidingWindow:
    """Which layers attend over a window of recent positions only, and their RoPE.

    Layer l is a global (full-attention) layer when l % pattern == pattern - 1, a windowed
    one otherwise (llama.cpp's swa pattern); the file's ``attention.sliding_window_pattern``
    (an int, or one bool a layer) wins.  The window is the file's ``attention.sliding_window``,
    else ``default_window`` (0: no windowed layers).  Windowed layers rotate with the file's
    ``rope.freq_base_swa``, else ``rope_base`` (None: the model's base), and take the model's
    RoPE scaling only if ``rope_scaling``."""
    pattern: int
    default_window: int = 0
    rope_base: Optional[float] = None
    rope_scaling: bool = True


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The layout of one GGUF architecture (see the module docstring)."""
    name: str
    layer_tensors: Tuple[TensorSpec, ...]
    #: llama.cpp's converter reordered each head's q / k rows to GGML's interleaved RoPE pairs:
    #: the loader puts them back in rotate-half order (and their biases).
    permute_qk: bool = False
    #: keys of this architecture beyond COMMON_HPARAMS (role -> key under ``{arch}.``)
    hparams: Tuple[Tuple[str, str], ...] = ()
    #: the model's own tensors beyond COMMON_MODEL_TENSORS
    model_tensors: Tuple[TensorSpec, ...] = ()
    # --- layer features (what the step plans from) -----------------------------------------
    #: the gate's activation in the MLP (GATES)
    activation: str = "silu"
    #: the embedding rows are multiplied by sqrt(E) ("sqrt_embed") or not ("none")
    embedding_scale: str = "none"
    #: the scores' scale is 1/sqrt(D), except for models of these layer counts, where it is
    #: 1/sqrt(E/H) (llama.cpp's rule for Gemma's 27B)
    attn_scale_by_embed_at: Tuple[int, ...] = ()
    #: scores capped at softcap * tanh(s / softcap), and the logits likewise, when the file has
    #: no attn_logit_softcapping / final_logit_softcapping (0: not capped)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    #: sliding-window layers, if the architecture has them
    sliding_window: Optional[SlidingWindow] = None

    def tensor_names(self, layer: int) -> Dict[str, TensorSpec]:
        """{full GGUF name: spec} of layer ``layer``'s tensors."""
        return {f"blk.{layer}.{t.gguf}": t for t in self.layer_tensors}

    @property
    def norm_placement(self) -> str:
        """"sandwich" when each block's output is normalised before the residual add, "pre"
        when only its input is (the tensors say)."""
        roles = {t.role for t in self.layer_tensors}
        return "sandwich" if {"post_attn_norm", "post_ffn_norm"} & roles else "pre"

    @property
    def qk_norm(self) -> bool:
        """Each q / k head is RMS-normalised before RoPE (the tensors say)."""
        return any(t.role in ("q_norm", "k_norm") for t in self.layer_tensors)


def _llama_layer(*, qkv_bias: bool = False, fused_qkv: bool = False,
                 fused_gate_up: bool = False, qk_norm: bool = False,
                 sandwich: bool = False) -> Tuple[TensorSpec, ...]:
    """The tensors of a llama-family layer: attention norm, q / k / v (or one fused qkv),
    optional per-head q / k norms, output, the post-attention norm of a sandwich, ffn norm,
    gate + up (or one fused up of 2*I rows, gate first), down, the post-MLP norm; optional
    biases everywhere llama.cpp reads them."""
    t = [TensorSpec("attn_norm.weight", "ln1_gamma", ("E",))]
    if fused_qkv:
        t.append(TensorSpec("attn_qkv.weight", "wqkv", ("(H+2*G)*D", "E"),
                            parts=(("wq", "H*D"), ("wk", "G*D"), ("wv", "G*D"))))
    else:
        t += [TensorSpec("attn_q.weight", "wq", ("H*D", "E")),
              TensorSpec("attn_k.weight", "wk", ("G*D", "E")),
              TensorSpec("attn_v.weight", "wv", ("G*D", "E")),
              TensorSpec("attn_q.bias", "bq", ("H*D",), required=qkv_bias),
              TensorSpec("attn_k.bias", "bk", ("G*D",), required=qkv_bias),
              TensorSpec("attn_v.bias", "bv", ("G*D",), required=qkv_bias)]
    if qk_norm:
        t += [TensorSpec("attn_q_norm.weight", "q_norm", ("D",)),
              TensorSpec("attn_k_norm.weight", "k_norm", ("D",))]
    t += [TensorSpec("attn_output.weight", "wo", ("E", "H*D")),
          TensorSpec("attn_output.bias", "bo", ("E",), required=False)]
    if sandwich:
        t.append(TensorSpec("post_attention_norm.weight", "post_attn_norm", ("E",)))
    t.append(TensorSpec("ffn_norm.weight", "ln2_gamma", ("E",)))
    if fused_gate_up:
        t.append(TensorSpec("ffn_up.weight", "w1", ("2*I", "E")))
    else:
        t += [TensorSpec("ffn_gate.weight", "w_gate", ("I", "E")),
              TensorSpec("ffn_up.weight", "w_up", ("I", "E")),
              TensorSpec("ffn_gate.bias", "b_gate", ("I",), required=False),
              TensorSpec("ffn_up.bias", "b_up", ("I",), required=False)]
    t += [TensorSpec("ffn_down.weight", "w2", ("E", "I")),
          TensorSpec("ffn_down.bias", "b2", ("E",), required=False)]
    if sandwich:
        t.append(TensorSpec("post_ffw_norm.weight", "post_ffn_norm", ("E",)))
    return tuple(t)


#: Hyper-parameter keys every architecture has (role -> key under ``{arch}.``).
COMMON_HPARAMS: Tuple[Tuple[str, str], ...] = (
    ("block_count", "block_count"),
    ("context_length", "context_length"),
    ("vocab_size", "vocab_size"),
    ("embed_dim", "embedding_length"),
    ("num_heads", "attention.head_count"),
    ("num_kv_heads", "attention.head_count_kv"),
    ("head_dim", "attention.key_length"),
    ("value_dim", "attention.value_length"),
    ("intermediate_dim", "feed_forward_length"),
    ("eps", "attention.layer_norm_rms_epsilon"),
    ("rope_theta", "rope.freq_base"),
    ("rope_dims", "rope.dimension_count"),
    ("rope_scaling", "rope.scaling.type"),
    ("rope_scaling_factor", "rope.scaling.factor"),
    ("rope_attn_factor", "rope.scaling.attn_factor"),
    ("rope_original_context", "rope.scaling.original_context_length"),
    ("yarn_beta_fast", "rope.scaling.yarn_beta_fast"),
    ("yarn_beta_slow", "rope.scaling.yarn_beta_slow"),
    ("expert_count", "expert_count"),
    ("sliding_window", "attention.sliding_window"),
    ("sliding_window_pattern", "attention.sliding_window_pattern"),
    ("rope_theta_swa", "rope.freq_base_swa"),
    ("attn_softcap", "attn_logit_softcapping"),
    ("final_softcap", "final_logit_softcapping"),
)

#: The model's tensors every architecture has: the token embedding, the final norm, the output
#: head (absent: tied to the embedding) and Llama 3's RoPE frequency factors.
COMMON_MODEL_TENSORS: Tuple[TensorSpec, ...] = (
    TensorSpec("token_embd.weight", "embedding", ("V", "E")),
    TensorSpec("output_norm.weight", "out_norm", ("E",)),
    TensorSpec("output.weight", "head", ("V", "E"), required=False),
    TensorSpec("rope_freqs.weight", "rope_freq_factors", ("D//2",), required=False),
)

ARCHITECTURES: Dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", _llama_layer(), permute_qk=True),
    Architecture("qwen2", _llama_layer(qkv_bias=True)),
    Architecture("qwen3", _llama_layer(qk_norm=True)),
    Architecture("phi3", _llama_layer(fused_qkv=True, fused_gate_up=True),
                 model_tensors=(   # LongRoPE (the 128k models): frequency divisors, by context
                     TensorSpec("rope_factors_long.weight", "rope_factors_long", ("D//2",),
                                required=False),
                     TensorSpec("rope_factors_short.weight", "rope_factors_short", ("D//2",),
                                required=False))),
    Architecture("gemma2", _llama_layer(sandwich=True), activation="gelu_tanh",
                 embedding_scale="sqrt_embed", attn_scale_by_embed_at=(46,), attn_softcap=50.0,
                 final_softcap=30.0,
                 sliding_window=SlidingWindow(pattern=2, default_window=4096)),
    Architecture("gemma3", _llama_layer(qk_norm=True, sandwich=True), activation="gelu_tanh",
                 embedding_scale="sqrt_embed", attn_scale_by_embed_at=(62,),
                 sliding_window=SlidingWindow(pattern=6, rope_base=10000.0,
                                              rope_scaling=False)),
)}


def architecture(name: str) -> Architecture:
    """The row of ``name``; NotImplementedError naming the ones megafuse runs."""
    arch: Optional[Architecture] = ARCHITECTURES.get(name)
    if arch is None:
        raise NotImplementedError(f"general.architecture: megafuse runs "
                                  f"{', '.join(sorted(ARCHITECTURES))} GGUF files, got {name!r}")
    return arch


__all__ = ["Architecture", "SlidingWindow", "TensorSpec", "ARCHITECTURES", "COMMON_HPARAMS",
           "COMMON_MODEL_TENSORS", "MATRIX_ROLES", "BIAS_ROLES", "NORM_ROLES", "FEATURE_ROLES",
           "GATES", "architecture", "evaluate", "shape_of"]
