"""megafuse.llm: whole GGUF models on megafuse's kernels.

- ``arch.py``: each architecture's layout, as data (tensors, hyper-parameters, layer features);
- ``gguf.py``: reading GGUF files; ``model.py``: ``Model``; ``layer.py``: ``DecoderLayer``;
- ``_runner.pyx``: ``ModelRunner``, the boundary of the native whole-model step;
- ``tokenizer.py``, ``sampling.py``, ``fetch.py`` (where the default model comes from).
"""
