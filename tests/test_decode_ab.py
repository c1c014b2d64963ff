"""bench/decode_ab.py on the CPU (a tiny Llama, the reference backend): every mode is compiled and warmed in one
process, each round times all of them in turn, the order turning, and the ratios are taken within rounds."""

import json
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import decode_ab  # noqa: E402
import generate  # noqa: E402


def test_modes_interleaved_in_one_process(tmp_path, monkeypatch):
    for name, value in {"H": 64, "I": 128, "HQ": 4, "HK": 2, "D": 16, "VOCAB": 1000}.items():
        monkeypatch.setattr(generate, name, value)
    assert decode_ab.main(["--out", str(tmp_path), "--modes", "ours,eager", "--rounds", "2", "--prompt", "5", "--new",
                           "3", "--layers", "1", "--tune", "none", "--device", "cpu"]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "decode_ab.json").read_text())
    assert [r["order"] for r in doc["rounds"]] == [["ours", "eager"], ["eager", "ours"]]
    for r in doc["rounds"]:
        per = r["decode_ms_per_token"]
        assert set(per) == {"ours", "eager"} and all(isinstance(v, float) for v in per.values())
        assert r["ratio_to_first"]["eager"] == round(per["eager"] / per["ours"], 4)
        pre = r["prefill_ms"]  # (generate() of one token: the prompt's forward)
        assert set(pre) == {"ours", "eager"} and all(v > 0 for v in pre.values())
        assert r["prefill_ratio_to_first"]["eager"] == round(pre["eager"] / pre["ours"], 4)
    assert set(doc["first_call_s"]) == {"ours", "eager"} and set(doc["median_ratio_to_first"]) == {"eager"}
    assert set(doc["median_prefill_ms"]) == {"ours", "eager"} and set(doc["median_prefill_ratio_to_first"]) == {"eager"}


def test_a_published_configuration(tmp_path, monkeypatch):
    """--model builds that configuration's *ForCausalLM (here Qwen3's, qk norms included, with tiny dims)."""
    import blocks

    monkeypatch.setitem(blocks.HF_LAYERS, "qwen3_8b", ("qwen3", dict(hidden_size=64, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6)))  # fmt: skip
    monkeypatch.setitem(decode_ab.VOCABS, "qwen3_8b", 1000)
    model = decode_ab.build_model("qwen3_8b", 1, __import__("torch").float32, "cpu")
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.hidden_size == 64
    assert decode_ab.main(["--out", str(tmp_path), "--model", "qwen3_8b", "--modes", "ours,eager", "--rounds", "1",
                           "--prompt", "5", "--new", "3", "--layers", "1", "--tune", "none", "--device", "cpu"]) == 0
    doc = json.loads((tmp_path / "decode_ab.json").read_text())
    assert doc["model"] == "qwen3_8b" and set(doc["median_prefill_ms"]) == {"ours", "eager"}
    assert "Qwen3ForCausalLM" in doc["ours_decode_report"] and "fused region" in doc["ours_decode_report"]


def test_a_sliding_window_decodes_with_one_specialization(tmp_path, monkeypatch):
    """--sliding-window sets the config's window (Phi-3-mini's published one is 2047); `ours-int-keyed` is ours with
    the cache's int counter in the specialization key, as before NOTES 111: one specialization a token there, a
    fixed number in ours."""
    import blocks

    monkeypatch.setitem(blocks.HF_LAYERS, "phi3_mini", ("phi3", dict(hidden_size=64, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5)))  # fmt: skip
    monkeypatch.setitem(decode_ab.VOCABS, "phi3_mini", 1000)
    assert decode_ab.main(["--out", str(tmp_path), "--model", "phi3_mini", "--sliding-window", "64", "--modes",
                           "ours,ours-int-keyed", "--rounds", "1", "--prompt", "5", "--new", "6", "--layers", "1",
                           "--tune", "none", "--device", "cpu"]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "decode_ab.json").read_text())
    assert doc["sliding_window"] == 64
    spec = doc["specializations"]
    assert spec["ours"] == 2 and spec["ours-int-keyed"] == 1 + 5, spec  # (the prefill and the decode step; 5 counter values)


def test_ours_without_in_place_residuals_sets_its_switch_around_its_calls_only(tmp_path, monkeypatch):
    """`ours-no-inplace` is ours with DLBLAS_GEMM_IN_PLACE=0 while its generate() runs (the switch is read where a
    region's kernel is made, during the call), and the caller's environment is left as it was."""
    from dlblas_compiler.codegen.gemm.cublas import IN_PLACE_ENV

    for name, value in {"H": 64, "I": 128, "HQ": 4, "HK": 2, "D": 16, "VOCAB": 1000}.items():
        monkeypatch.setattr(generate, name, value)
    monkeypatch.setenv(IN_PLACE_ENV, "1")
    seen = []
    real = decode_ab.make

    def make(mode, *args, **kw):
        model, gen = real(mode, *args, **kw)
        forward = model.forward

        def spy(*a, **k):
            seen.append((mode, os.environ.get(IN_PLACE_ENV)))
            return forward(*a, **k)

        spy.report = forward.report
        spy.compilations = forward.compilations
        model.forward = spy
        return model, gen

    monkeypatch.setattr(decode_ab, "make", make)
    assert decode_ab.main(["--out", str(tmp_path), "--modes", "ours,ours-no-inplace", "--rounds", "1", "--prompt", "5",
                           "--new", "3", "--layers", "1", "--tune", "none", "--device", "cpu"]) == 0  # fmt: skip
    assert {v for m, v in seen if m == "ours"} == {None} and {v for m, v in seen if m == "ours-no-inplace"} == {"0"}
    assert os.environ[IN_PLACE_ENV] == "1"
    doc = json.loads((tmp_path / "decode_ab.json").read_text())
    assert "fused region" in doc["ours_decode_report"] and "fused region" in doc["ours_no_inplace_decode_report"]
    assert set(doc["specializations"]) == {"ours", "ours-no-inplace"}
