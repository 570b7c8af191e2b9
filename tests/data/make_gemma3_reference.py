"""Make tests/data/gemma3_hf_reference.npz: what HF transformers' float32 model of the real
Gemma 3 270M file (gemma-3-270m-q4_k_m.gguf) predicts, for tests/llm/test_gemma3.py -- so the
tests need no torch:

- on an English passage and on a long prompt past the 512-token window: the top-1 token at
  each position and its margin over the second;
- greedy continuations of completion prompts, 16 tokens each, with the margin of each choice.

Run once, in a venv with torch==2.13.0, transformers, accelerate and gguf (not megafuse's test
environment):

    python tests/data/make_gemma3_reference.py /path/to/gemma-3-270m-q4_k_m.gguf

(megafuse.llm.fetch fetches the file).  Then, in a venv with llama-cpp-python 0.3.36, record
llama.cpp's own top-1 on the passage into the same file (its int8 scheme, for
test_int8_mode_agrees_at_least_as_well_as_llama_cpp):

    python tests/data/make_gemma3_reference.py --llama-cpp /path/to/gemma-3-270m-q4_k_m.gguf

The versions are stored in the .npz.
"""
import os
import sys

import numpy as np

PASSAGE = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg developed a system of movable metal type in Mainz. His invention made books far "
    "cheaper to produce, and within a few decades printing shops had spread across Europe. "
    "Scholars could now share their ideas quickly, and the rise of literacy changed religion, "
    "science and politics. Historians often describe the press as one of the most important "
    "inventions of the modern era.")

LONG = " ".join([
    ("Rivers have shaped the places where people live for as long as there have been towns. "
     "The earliest cities grew along the Nile, the Tigris and the Euphrates, the Indus and the "
     "Yellow River, where floods left rich soil behind and boats could carry grain, stone and "
     "timber further than any cart. Farmers learned to read the seasons of the water, to dig "
     "canals that spread it across the fields, and to build banks that held it back."),
    ("Trade followed the rivers too. Merchants moved salt, cloth, metal and pottery from one "
     "market to the next, and the towns at the crossings and the river mouths became rich. "
     "Bridges, harbours and warehouses were built, and with them came customs houses, tolls and "
     "the officials who collected them. Many of the great capitals of Europe, from London and "
     "Paris to Vienna and Budapest, stand on rivers for exactly these reasons."),
    ("Rivers also divided people. A wide river was a border that armies found hard to cross, "
     "and many treaties drew the line between two countries along the middle of a stream. When "
     "a river changed its course after a flood, the border could move with it, and more than "
     "one dispute between neighbours began with a river that had wandered a few hundred metres "
     "to one side."),
    ("In the nineteenth century engineers began to change the rivers themselves. They "
     "straightened bends to shorten the journeys of steamships, built locks so that boats could "
     "climb over rapids, and raised dams that turned valleys into lakes. The dams produced "
     "electricity for factories and homes, and the reservoirs behind them stored water for dry "
     "summers. Yet these works had costs: fish could no longer swim upstream to breed, "
     "sediment that once renewed the fields was trapped behind concrete, and the wetlands at "
     "the river mouths began to shrink."),
    ("Today many cities are trying to give some of that space back. Old embankments are "
     "replaced with parks that can flood without harm, weirs are removed so that salmon can "
     "return, and the concrete channels of small streams are opened to the sky again. The "
     "people who walk along these restored banks may not think about the long history of the "
     "water beside them, but the river still decides where the town began, how it grew, and "
     "how it will meet the floods of the future."),
    ("Scientists who study rivers measure how much water flows past a point each second, how "
     "much sand and mud it carries, and how warm it is through the year. Their records show "
     "that many rivers now rise higher in winter and fall lower in summer than they did a "
     "century ago, and that the timing of the spring flood has moved as snow melts earlier in "
     "the mountains. Planning for these changes is now part of the work of every city that "
     "lives beside a river.")])

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "The first person to walk on the Moon was", "Once upon a time, in a small village,"]
N_GREEDY = 16


DST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemma3_hf_reference.npz")


def llama_cpp(path):
    """llama.cpp's top-1 at each position of the recorded passage (2 threads)."""
    import llama_cpp
    out = dict(np.load(DST))
    ids = out["passage_ids"].tolist()
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, n_threads_batch=2,
                          logits_all=True, verbose=False)
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)])
    out["llama_cpp_passage_top1"] = logits.argmax(1).astype(np.int32)
    out["llama_cpp_version"] = np.array(f"llama-cpp-python {llama_cpp.__version__}")
    np.savez(DST, **out)
    agree = np.mean(out["llama_cpp_passage_top1"] == out["passage_top1"])
    print(f"{DST}: llama.cpp's top-1 agrees with transformers at {agree:.4f} of the passage")


def main(path):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    out = {}
    for key, text in (("passage", PASSAGE), ("long", LONG)):
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
        top2 = np.sort(logits, axis=1)[:, -2:]
        out[f"{key}_ids"] = np.array(ids, np.int32)
        out[f"{key}_top1"] = logits.argmax(1).astype(np.int32)
        out[f"{key}_margin"] = (top2[:, 1] - top2[:, 0]).astype(np.float32)
    for i, prompt in enumerate(PROMPTS):
        ids = tok(prompt)["input_ids"]
        new, margins = [], []
        with torch.no_grad():
            for _ in range(N_GREEDY):
                logits = model(torch.tensor([ids + new])).logits[0, -1].numpy()
                top2 = np.sort(logits)[-2:]
                new.append(int(logits.argmax()))
                margins.append(float(top2[1] - top2[0]))
        out[f"prompt{i}_ids"] = np.array(ids, np.int32)
        out[f"prompt{i}_greedy"] = np.array(new, np.int32)
        out[f"prompt{i}_margin"] = np.array(margins, np.float32)
        print(repr(prompt), "->", repr(tok.decode(new)))
    out["versions"] = np.array([f"transformers {transformers.__version__}",
                                f"torch {torch.__version__}"])
    np.savez(DST, **out)
    print(f"{DST}: passage {len(out['passage_ids'])} tokens, long {len(out['long_ids'])}")


if __name__ == "__main__":
    if sys.argv[1] == "--llama-cpp":
        llama_cpp(sys.argv[2])
    else:
        main(sys.argv[1])
