"""The megafuse command: `megafuse bench` (the default), `megafuse run`, `megafuse serve`'s
arguments (the server itself: tests/serve) and `megafuse info`."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import megafuse
from helpers import hang_timeout, path_with_scripts_first
from megafuse import cli

SMALL = dict(embed_dim=256, num_heads=4, num_kv_heads=2, head_dim=64, intermediate_dim=512)


def run(argv, capsys):
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_info_prints_show_config(capsys):
    status, out, _ = run(["info"], capsys)
    assert status == 0
    assert "simd_level" in out and megafuse.simd_level() in out and "include_dir" in out


def test_bench_is_the_default_and_checks_a_qwen2_layer(tmp_path, capsys):
    path = tmp_path / "out.json"
    status, out, err = run(["--tokens", "16", "--decode", "3", "--repeat", "1", "--json",
                            str(path)], capsys)
    assert status == 0, out + err
    assert "embed 896, 14 heads, 2 kv heads, head_dim 64, ffn 4864" in out
    assert "median ms" in out and "GFLOP/s" in out and "max rel err" in out
    assert "OK: max relative error" in out
    assert "megafuse bench: prefill" in err and "megafuse bench: decode" in err   # progress
    report = json.loads(path.read_text())
    assert report["formats"] == {k: "Q8_0" for k in ("wq", "wk", "wv", "wo", "w1", "w2")}
    assert [r["phase"] for r in report["results"]] == ["prefill", "decode"]
    for r in report["results"]:
        assert set(r) == {"phase", "tokens", "median_ms", "tokens_per_s", "gb_per_s",
                          "gflop_per_s", "max_rel_error"}
        assert r["median_ms"] > 0 and r["gflop_per_s"] > 0
        assert 0 < r["max_rel_error"] <= cli.TOLERANCE["quantized"]
    assert report["ok"] is True and report["tolerance"] == cli.TOLERANCE["quantized"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "q4_0", "q5_1", "iq4_nl", "q3_k",
                                   "q4_k", "q6_k"])
def test_bench_every_format(dtype, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "QWEN2_05B", dict(cli.QWEN2_05B, **SMALL))
    path = tmp_path / "out.json"
    status, out, err = run(["bench", "--dtype", dtype, "--tokens", "12", "--decode", "2",
                            "--repeat", "1", "--json", str(path)], capsys)
    assert status == 0, out + err
    report = json.loads(path.read_text())
    assert set(report["formats"].values()) == {dtype.upper()}
    bound = cli.TOLERANCE["float"] if dtype in ("fp32", "fp16", "bf16") else \
        cli.TOLERANCE["quantized"]
    assert report["int8_path"] == (dtype not in ("fp32", "fp16", "bf16"))
    assert all(r["max_rel_error"] <= bound for r in report["results"])


@pytest.mark.parametrize("dtype,fallback", [("q4_k", "Q5_0"), ("iq4_xs", "IQ4_NL")])
def test_kquants_fall_back_on_896_columns_as_llama_cpp_does(dtype, fallback):
    layer = cli.random_layer(dtype, 4)
    assert {k: v.name for k, v in layer.dtypes.items()} == dict(
        {k: fallback for k in ("wq", "wk", "wv", "wo", "w1")}, w2=dtype.upper())


def test_bench_on_a_gguf_file(tmp_path, capsys):
    pytest.importorskip("gguf")
    from test_gguf import TENSORS, write_model
    path = tmp_path / "model.gguf"
    formats = dict({k: "Q8_0" for k in TENSORS}, w2="Q6_K")
    write_model(path, "qwen2", formats, n_layers=2)
    status, out, err = run(["bench", "--model", str(path), "--layer", "1", "--tokens", "10",
                            "--decode", "2", "--repeat", "1"], capsys)
    assert status == 0, out + err
    assert f"layer 1 of {path}" in out and "embed 256, 4 heads, 2 kv heads" in out
    assert "w2=Q6_K" in out and "OK" in out


def test_a_mismatch_fails(monkeypatch, capsys):
    monkeypatch.setattr(cli, "QWEN2_05B", dict(cli.QWEN2_05B, **SMALL))
    monkeypatch.setattr(cli, "TOLERANCE", {"float": 0.0, "quantized": 0.0})
    status, out, _ = run(["--tokens", "4", "--decode", "1", "--repeat", "1"], capsys)
    assert status == 1 and "MISMATCH" in out


def test_no_check(monkeypatch, capsys):
    monkeypatch.setattr(cli, "QWEN2_05B", dict(cli.QWEN2_05B, **SMALL))
    status, out, _ = run(["--tokens", "4", "--decode", "0", "--repeat", "1", "--no-check"],
                         capsys)
    assert status == 0 and "--no-check" in out and "decode" not in out.split("phase")[1]


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--dtype", "q9_0"], ["--decode", "-1"],
                                  ["--depth", "-1"], ["frobnicate"]])
def test_bad_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2


def test_missing_model_file(tmp_path, capsys):
    status, _, err = run(["--model", str(tmp_path / "nope.gguf")], capsys)
    assert status == 2 and "nope.gguf" in err


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(megafuse.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def test_python_dash_m_megafuse():
    done = subprocess.run([sys.executable, "-m", "megafuse", "info"], capture_output=True,
                          text=True, env=_env(), timeout=hang_timeout(120))
    assert done.returncode == 0 and "simd_level" in done.stdout
    done = subprocess.run([sys.executable, "-m", "megafuse", "--help"], capture_output=True,
                          text=True, env=_env(), timeout=hang_timeout(120))
    assert done.returncode == 0 and "bench" in done.stdout and "run" in done.stdout
    done = subprocess.run([sys.executable, "-m", "megafuse", "run", "--help"],
                          capture_output=True, text=True, env=_env(), timeout=hang_timeout(120))
    assert done.returncode == 0 and "--chat" in done.stdout and "--activations" in done.stdout


def test_console_script():
    exe = shutil.which("megafuse", path=path_with_scripts_first())
    if exe is None:
        pytest.skip("the megafuse console script is not installed (pip install -e .)")
    done = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=hang_timeout(120))
    assert done.returncode == 0 and "simd_level" in done.stdout


def test_bench_model_rows_pp_and_tg(tmp_path, capsys):
    """--model adds the whole-model rows of llama-bench: ppN and tgN, in the JSON too."""
    pytest.importorskip("gguf")
    from test_model import write_model
    path = write_model(tmp_path / "m.gguf", "llama", "Q4_1", n_layers=2)
    out_json = tmp_path / "r.json"
    status, out, err = run(["bench", "--model", str(path), "--tokens", "8", "--decode", "2",
                            "--repeat", "2", "--pp", "16", "--tg", "4", "--json",
                            str(out_json)], capsys)
    assert status == 0, out + err
    assert "pp16" in out and "tg4" in out and "t/s" in out
    report = json.loads(out_json.read_text())["model"]
    assert [r["test"] for r in report["results"]] == ["pp16", "tg4"]
    assert all(r["tokens_per_s"] > 0 for r in report["results"])
    assert report["formats"]["Q4_1"] == "12" and report["activations"] == "int8"


def test_bench_model_rows_at_a_depth(tmp_path, monkeypatch, capsys):
    """--depth D: both rows start after D cached tokens (llama-bench's -d), named so."""
    pytest.importorskip("gguf")
    from megafuse.llm.model import Model
    from test_model import write_model
    path = write_model(tmp_path / "m.gguf", "llama", "Q4_1", n_layers=2)
    out_json = tmp_path / "r.json"
    calls = []                           # (cache position, tokens) of every forward call
    forward = Model.forward

    def recording_forward(self, ids, *a, **k):
        calls.append((self.position, len(ids)))
        return forward(self, ids, *a, **k)
    monkeypatch.setattr(Model, "forward", recording_forward)
    status, out, err = run(["bench", "--model", str(path), "--tokens", "8", "--decode", "2",
                            "--repeat", "2", "--pp", "8", "--tg", "4", "--depth", "40",
                            "--json", str(out_json)], capsys)
    assert status == 0, out + err
    assert "pp8 @ d40" in out and "tg4 @ d40" in out
    report = json.loads(out_json.read_text())["model"]
    assert [r["test"] for r in report["results"]] == ["pp8 @ d40", "tg4 @ d40"]
    assert report["depth"] == 40 and all(r["depth"] == 40 for r in report["results"])
    # each run: a prefill of 40 from an empty cache, then the row's tokens from position 40
    assert all(pos == 0 for pos, n in calls if n == 40)
    assert [c for c in calls if c[1] != 40] == [(40, 8)] * 3 + [(40 + j, 1) for j in range(4)] * 3
    assert all(r["tokens_per_s"] > 0 for r in report["results"])


def test_kv_dtype_float16_reaches_the_model(tmp_path, monkeypatch, capsys):
    """--kv-dtype float16 (bench and run) builds the model with a float16 KV cache."""
    pytest.importorskip("gguf")
    from megafuse.llm.model import Model
    from test_model import write_model
    path = write_model(tmp_path / "m.gguf", "llama", "Q8_0", n_layers=2, with_vocab=True)
    out_json = tmp_path / "r.json"
    status, out, err = run(["bench", "--model", str(path), "--tokens", "8", "--decode", "2",
                            "--repeat", "2", "--pp", "8", "--tg", "2", "--kv-dtype", "float16",
                            "--json", str(out_json)], capsys)
    assert status == 0, out + err
    assert "float16 KV cache" in out
    assert json.loads(out_json.read_text())["model"]["kv_dtype"] == "float16"
    seen = []
    init = Model.__init__

    def recording_init(self, *a, **k):
        init(self, *a, **k)
        seen.append(self._layers[0]["k_cache"].dtype)
    monkeypatch.setattr(Model, "__init__", recording_init)
    status, _, err = run(["run", "--model", str(path), "-p", "x", "-n", "1", "--kv-dtype",
                          "float16"], capsys)
    assert status == 0, err
    assert "1 tokens generated" in err
    assert seen == [np.float16]
    with pytest.raises(SystemExit) as exc:               # argparse's usage error
        cli.main(["run", "--model", str(path), "-p", "x", "--kv-dtype", "bf16"])
    assert exc.value.code == 2 and "--kv-dtype" in capsys.readouterr().err


def test_run_answers_the_france_question(smollm2_path, capsys):
    pytest.importorskip("tokenizers")
    status, out, err = run(["run", "--model", smollm2_path, "--chat", "-p",
                            "What is the capital of France?", "-n", "16"], capsys)
    assert status == 0, err
    assert "Paris" in out
    assert "prompt 37 tokens" in err and "prefill" in err and "decode" in err
    assert "tokens/s" in err and "stopped: eog" in err


def test_run_samples_reproducibly_and_reports_bad_input(smollm2_path, capsys):
    pytest.importorskip("tokenizers")
    argv = ["run", "--model", smollm2_path, "-p", "Once upon a time", "-n", "6",
            "--temperature", "0.8", "--top-k", "40", "--seed", "3", "--activations", "int8"]
    first = run(argv, capsys)
    second = run(argv, capsys)
    assert first[0] == second[0] == 0 and first[1] == second[1] and first[1].strip()
    status, _, err = run(["run", "--model", smollm2_path, "-p", "x" * 40, "--ctx", "4"], capsys)
    assert status == 2 and "--ctx 4" in err and "raise --ctx" in err and "reset()" not in err


def test_run_needs_a_prompt(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run"])
    assert exc.value.code == 2


# ---- run on a base model ---------------------------------------------------------------------

def _tiny_model(tmp_path, chat_template=False):
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    import gguf_vocab
    return gguf_vocab.write_llama_model(str(tmp_path / "base.gguf"), chat_template=chat_template)


def _recording_generate(monkeypatch):
    """Model.generate wrapped to record the prompt ids and the tokens it yields."""
    from megafuse.llm.model import Model
    calls = []
    generate = Model.generate

    def recording(self, ids, *args, **kwargs):
        call = {"ids": list(ids), "out": []}
        calls.append(call)
        for token in generate(self, ids, *args, **kwargs):
            call["out"].append(token)
            yield token
    monkeypatch.setattr(Model, "generate", recording)
    return calls


def test_run_continues_a_prompt_on_a_model_without_a_chat_template(tmp_path, monkeypatch,
                                                                   capsys):
    """Without --chat the prompt is encoded as it is, BOS first as the file asks, and the
    generated tokens stream to stdout: a base model needs no chat template."""
    from megafuse.llm.model import Model
    path = _tiny_model(tmp_path)
    calls = _recording_generate(monkeypatch)
    status, out, err = run(["run", "--model", path, "-p", "The quick brown fox", "-n", "6"],
                           capsys)
    assert status == 0, err
    model = Model.from_gguf(path)
    tok = model.tokenizer
    assert tok.chat_template is None and tok.add_bos
    want_ids = [tok.bos_id] + tok.encode("The quick brown fox", add_special=False)
    assert [c["ids"] for c in calls] == [want_ids]
    assert f"prompt {len(want_ids)} tokens" in err
    generated = calls[0]["out"]
    assert generated == list(model.generate(want_ids, 6))      # greedy: the same tokens
    stream = tok.stream_decoder(skip_special=True, at_start=False)
    assert out == "".join(stream.push(i) for i in generated) + stream.flush() + "\n"


def test_run_chat_without_a_template_names_the_missing_key(tmp_path, monkeypatch, capsys):
    """--chat on a file without tokenizer.chat_template: exit status 2 and a message naming the
    key and the way out, before the weights are loaded."""
    from megafuse.llm.model import Model
    path = _tiny_model(tmp_path)

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded")
    monkeypatch.setattr(Model, "from_gguf", no_load)
    status, out, err = run(["run", "--model", path, "--chat", "-p", "Hi"], capsys)
    assert status == 2 and out == ""
    assert "tokenizer.chat_template" in err and "without --chat" in err and path in err


def test_run_chat_with_a_template(tmp_path, monkeypatch, capsys):
    """The same model with a template: --chat (and --system) render it."""
    from megafuse.llm.model import Model
    path = _tiny_model(tmp_path, chat_template=True)
    calls = _recording_generate(monkeypatch)
    status, _, err = run(["run", "--model", path, "--chat", "--system", "Be brief.", "-p", "Hi",
                          "-n", "2"], capsys)
    assert status == 0, err
    tok = Model.from_gguf(path).tokenizer
    assert [c["ids"] for c in calls] == [tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True, tokenize=True)]


def test_run_system_needs_chat(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "-p", "x", "--system", "Be brief."])
    assert exc.value.code == 2 and "--system" in capsys.readouterr().err


def test_run_takes_a_model_name(tmp_path, monkeypatch, capsys):
    """--model NAME fetches (once) the model of that name in megafuse.llm.fetch.MODELS; an
    unknown name that is no file is an error naming it."""
    from megafuse.llm import fetch
    path = _tiny_model(tmp_path)
    asked = []
    monkeypatch.setattr(fetch, "model_path", lambda name=None, **kw: asked.append(name) or path)
    status, _, err = run(["run", "--model", "Gemma-3-270M", "-p", "x", "-n", "1"], capsys)
    assert status == 0, err
    assert asked == ["Gemma-3-270M"]
    status, _, err = run(["run", "--model", str(tmp_path / "gemma-9"), "-p", "x"], capsys)
    assert status == 2 and "gemma-9" in err


def test_run_chat_on_gemma3_names_the_missing_template(gemma3_path, capsys):
    """The real Gemma 3 270M is a base model: no chat template in the file."""
    status, out, err = run(["run", "--model", gemma3_path, "--chat", "-p", "Hi"], capsys)
    assert status == 2 and out == ""
    assert "tokenizer.chat_template" in err and "without --chat" in err


@pytest.mark.parametrize("prompt, continuation", [
    ("The capital of France is",
     " the capital of the country of France. It is the largest city in France and"),
    ("def fibonacci(n):", "\n    if n == 0:\n        return 0\n    elif"),
])
def test_run_continues_a_prompt_on_gemma3(gemma3_path, capsys, prompt, continuation):
    """The real Gemma 3 270M, a base model, by name and without --chat: BOS then the prompt,
    and the greedy continuation transformers and llama.cpp give (issue 36)."""
    pytest.importorskip("tokenizers")
    status, out, err = run(["run", "--model", "gemma-3-270m", "-p", prompt, "-n", "16"], capsys)
    assert status == 0, err
    assert out.startswith(continuation), out
    n_prompt = 1 + len(megafuse.Tokenizer.from_gguf(gemma3_path).encode(prompt,
                                                                        add_special=False))
    assert f"prompt: {n_prompt} tokens" in err and "Gemma 3 270m" in err

# ---- megafuse run's defects (issue 37) --------------------------------------------------------

def test_run_caps_ctx_at_the_models_context(smollm2_path, capsys, monkeypatch):
    pytest.importorskip("tokenizers")
    from megafuse.llm.model import Model
    seen = []
    real = Model.from_gguf.__func__

    def recording(cls, *args, **kwargs):
        seen.append(kwargs["cache_capacity"])
        return real(cls, *args, **kwargs)
    monkeypatch.setattr(Model, "from_gguf", classmethod(recording))
    status, out, err = run(["run", "--model", smollm2_path, "-p", "Hi", "-n", "1", "--ctx",
                            "100000"], capsys)
    assert status == 0, err
    assert "--ctx 100000 is more than the model's context length 8192: using 8192" in err
    assert seen == [8192]


def test_run_with_no_new_tokens_prints_no_prefill_rate(smollm2_path, capsys):
    pytest.importorskip("tokenizers")
    status, out, err = run(["run", "--model", smollm2_path, "-p", "Hello", "-n", "0"], capsys)
    assert status == 0, err
    assert "no prefill" in err and "0 tokens generated" in err
    assert not re.search(r"prefill [0-9.]+ tokens/s", err)


def test_more_threads_than_cpus_warns(smollm2_path, capsys, threads):
    pytest.importorskip("tokenizers")
    cpus = cli.available_cpus()
    status, _, err = run(["run", "--model", smollm2_path, "-p", "Hi", "-n", "0", "--threads",
                          str(cpus + 62)], capsys)
    assert status == 0, err
    assert f"--threads {cpus + 62} is more than the {cpus} CPUs" in err
    status, _, err = run(["run", "--model", smollm2_path, "-p", "Hi", "-n", "0", "--threads",
                          str(cpus)], capsys)
    assert "warning" not in err


def test_serve_arguments_are_checked(capsys):
    for argv, name in ((["serve", "--parallel", "0"], "--parallel"),
                       (["serve", "--max-queue", "-1"], "--max-queue"),
                       (["serve", "--graceful-seconds", "-1"], "--graceful-seconds"),
                       (["serve", "--graceful-seconds", "nan"], "--graceful-seconds"),
                       (["serve", "--port", "0"], "--port")):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2 and name in capsys.readouterr().err
