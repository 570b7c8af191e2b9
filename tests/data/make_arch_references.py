"""Make tests/data/arch/<name>.gguf and <name>_hf.npz: a small random-init HF transformers model
of each architecture, written to GGUF the way llama.cpp's convert_hf_to_gguf.py writes it, and
what the HF model itself computes on a fixed sequence of token ids (its float32 logits at every
position) -- so that tests/llm/test_arch.py compares megafuse with HF on the same weights
without torch.

The weights are rounded to float16 before HF runs (so the F16 tensors of the file hold exactly
the weights HF used) and written as F16 (norms as F32).

Run once, in a venv with torch==2.13.0, transformers and gguf (not megafuse's test environment):

    python tests/data/make_arch_references.py [name ...]

Recorded with the versions stored in each .npz (``versions``).
"""
import math
import os
import sys

import gguf
import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "arch")
SEQ = 24                    # tokens of the recorded sequence
VOCAB = 128

# Each case: the HF config class and its keywords, the GGUF architecture it is written as, and
# how the HF state dict maps to GGUF tensors (a name pattern with {n} for the layer; "permute"
# marks llama.cpp's q / k row interleaving).
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
              max_position_embeddings=256, tie_word_embeddings=False)

CASES = {
    "phi3": dict(
        config=("Phi3Config", dict(COMMON, pad_token_id=0, rope_theta=10000.0)),
        arch="phi3",
        layer={"input_layernorm.weight": "attn_norm.weight",
               "self_attn.qkv_proj.weight": "attn_qkv.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}),
    "mistral": dict(
        config=("MistralConfig", dict(COMMON, rope_theta=1e6, sliding_window=None)),
        arch="llama",
        layer={"input_layernorm.weight": "attn_norm.weight",
               "self_attn.q_proj.weight": ("attn_q.weight", "permute_q"),
               "self_attn.k_proj.weight": ("attn_k.weight", "permute_k"),
               "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}),
}
GEMMA_LAYER = {"input_layernorm.weight": "attn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "post_attention_norm.weight",
               "pre_feedforward_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight",
               "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
# Gemma's RMSNorm multiplies by (1 + w): llama.cpp's converter writes w + 1 (norm_shift)
GEMMA_SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, rms_norm_eps=1e-6,
                   max_position_embeddings=256, sliding_window=8, tie_word_embeddings=True)
CASES.update({
    "qwen3": dict(
        config=("Qwen3Config", dict(COMMON, head_dim=32, rope_theta=1e6)),
        arch="qwen3", key_length=32,
        layer={"input_layernorm.weight": "attn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}),
    "gemma2": dict(
        config=("Gemma2Config", dict(GEMMA_SMALL, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16,
                                     query_pre_attn_scalar=16)),
        arch="gemma2", key_length=16, norm_shift=1.0, sliding_window=8, theta=10000.0,
        softcaps=(50.0, 30.0), layer={**GEMMA_LAYER}),
    "gemma3": dict(
        config=("Gemma3TextConfig", dict(GEMMA_SMALL, num_hidden_layers=6, num_attention_heads=4,
                                         num_key_value_heads=1, head_dim=32,
                                         query_pre_attn_scalar=32)),
        arch="gemma3", key_length=32, norm_shift=1.0, sliding_window=8, theta=1e6,
        layer={**GEMMA_LAYER, "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight"}),
})
CASES.update({
    # YaRN (Qwen2.5's long-context files): factor 4 over an original context of 64
    "qwen2_yarn": dict(
        config=("Qwen2Config", dict(COMMON, rope_theta=10000.0, rope_scaling={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})),
        arch="qwen2", yarn=(4.0, 64),
        layer={"input_layernorm.weight": "attn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.q_proj.bias": "attn_q.bias",
               "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.v_proj.bias": "attn_v.bias",
               "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}),
    # LongRoPE (Phi-3's 128k files): short factors below the original context of 64
    "phi3_longrope": dict(
        config=("Phi3Config", dict(COMMON, pad_token_id=0, rope_theta=10000.0,
                                   original_max_position_embeddings=64,
                                   rope_scaling={"rope_type": "longrope",
                                                 "short_factor": [1 + 0.05 * i for i in range(8)],
                                                 "long_factor": [1 + 0.5 * i for i in range(8)]})),
        arch="phi3", longrope=64, layer=CASES["phi3"]["layer"]),
})
MODEL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def make(name):
    case = CASES[name]
    cls_name, kwargs = case["config"]
    torch.manual_seed(1234)
    config = getattr(transformers, cls_name)(**kwargs)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for p in model.parameters():        # larger than init's 0.02 so layers matter
            if p.ndim > 1:
                p.copy_(p * 0.05 / max(float(p.std()), 1e-6))
            else:                           # norms: around 1 (Gemma's: around 0, as 1 + w)
                p.copy_((0.0 if "norm_shift" in case else 1.0) + 0.1 * torch.randn_like(p))
            p.copy_(p.half().float())
        if "norm_shift" in case:            # (1 + w) rounded as the file will hold w + 1
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_((p + 1).half().float() - 1)
    H, G = config.num_attention_heads, config.num_key_value_heads
    D = case.get("key_length") or config.hidden_size // H
    ids = np.random.default_rng(7).integers(0, VOCAB, SEQ)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids[None])).logits[0].numpy()

    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{name}.gguf")
    arch = case["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"random-init {name}")
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    theta = case.get("theta") or config.rope_parameters["rope_theta"]
    w.add_rope_freq_base(float(theta))
    w.add_rope_dimension_count(D)
    w.add_vocab_size(VOCAB)
    if case.get("key_length"):
        w.add_key_length(D)
        w.add_value_length(D)
    if case.get("sliding_window"):
        w.add_sliding_window(case["sliding_window"])
    if case.get("softcaps"):
        w.add_attn_logit_softcapping(case["softcaps"][0])
        w.add_final_logit_softcapping(case["softcaps"][1])
    if case.get("yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(case["yarn"][0])
        w.add_rope_scaling_orig_ctx_len(case["yarn"][1])
    if case.get("longrope"):                  # what the converter writes (conversion/phi)
        original = case["longrope"]
        scale = config.max_position_embeddings / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        w.add_rope_scaling_orig_ctx_len(original)
        rope = getattr(config, "rope_parameters", None) or config.rope_scaling
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    shift = case.get("norm_shift", 0.0)
    state = {k: v.numpy() + (shift if k.endswith("norm.weight") else 0.0)
             for k, v in model.state_dict().items()}
    for hf, name_ in MODEL_TENSORS.items():
        if hf in state:                       # (a tied model has no lm_head)
            _add(w, name_, state[hf])
    for n in range(config.num_hidden_layers):
        for hf, target in case["layer"].items():
            value = state[f"model.layers.{n}.{hf}"]
            if isinstance(target, tuple):
                target, how = target
                value = permute(value, H if how == "permute_q" else G)
            _add(w, f"blk.{n}.{target}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    np.savez(os.path.join(OUT, f"{name}_hf.npz"), ids=ids.astype(np.int32),
             logits=logits.astype(np.float32),
             versions=np.array([f"transformers {transformers.__version__}",
                                f"torch {torch.__version__}"]))
    print(f"{path}: {os.path.getsize(path)} bytes")


def _add(writer, name, value):
    value = np.ascontiguousarray(value, np.float32)
    writer.add_tensor(name, value if value.ndim == 1 else value.astype(np.float16))


if __name__ == "__main__":
    for case in sys.argv[1:] or sorted(CASES):
        make(case)
