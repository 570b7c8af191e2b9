"""The model the serving tests share (SmolLM2, float mode; each engine adds its own
sequences)."""
import pytest


@pytest.fixture(scope="session")
def float_model(smollm2_path):
    pytest.importorskip("tokenizers")
    from megafuse.llm.model import Model
    return Model.from_gguf(smollm2_path, cache_capacity=512, activations="float")
