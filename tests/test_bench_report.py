"""bench/report.py is the only writer of BENCHMARKS.md's tables: every generated section must equal what its raw
JSON in bench/results/ gives, and no table may stand outside a generated section (CPU only, no GPU)."""

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import report  # noqa: E402


def test_benchmarks_md_matches_the_json():
    assert report.main(["--check"]) == 0


def test_a_hand_edited_number_is_caught(tmp_path):
    text = open(report.DOC).read()
    name = "block-decoder_layer"
    start = text.index(f"<!-- report:{name} begin -->")
    i = text.index("| 2048 |", start)  # the M = 2048 row of the decoder-layer table
    j = text.index(" | ", i + 8)  # after its floor cell
    edited = text[:j] + " | 1.0 / 1.0" + text[text.index(" | ", j + 3) :]
    assert edited != text
    found = report.problems(edited)
    assert found and name in found[0]
    doc = tmp_path / "B.md"
    doc.write_text(edited)
    assert report.main(["--check", "--doc", str(doc)]) == 1
    assert report.main(["--write", "--doc", str(doc)]) == 0  # --write restores what the JSON gives
    assert doc.read_text() == text


def test_a_table_outside_the_sections_is_caught():
    text = open(report.DOC).read() + "\n| M | ours |\n|---|---|\n| 1 | 2.0 |\n"
    assert any("outside the generated sections" in p for p in report.problems(text))


def test_unbalanced_markers_are_refused():
    with pytest.raises(ValueError):
        report.split_doc("<!-- report:goals begin -->\n| x |\n")
    with pytest.raises(KeyError):
        report.regenerate("<!-- report:no-such-section begin -->\n<!-- report:no-such-section end -->\n")


def test_block_rows_name_what_ran_each_region():
    text = report.render("block-decoder_layer")
    row_2048 = next(line for line in text.splitlines() if line.startswith("| 2048 |"))
    assert "SDPA: attn" in row_2048 and "cuBLAS: o-proj, down" in row_2048 and "Triton: QKV, gate/up" in row_2048
    assert "ceilings not measured in this run" in text and "s4-decoder-b.json" in text


def test_library_speedups_are_by_gpu_time_and_call_time_apart():
    text = report.render("library-tuned")
    head = text.splitlines()[1]
    assert "ours speedup (GPU time)" in head and "ours speedup (call time)" in head
    row = next(line for line in text.splitlines() if "fused_rotary_and_fa" in line and "D=64" in line)
    gpu_speedups = row.split(" | ")[5]
    assert "eager 0.94x" in gpu_speedups and "compiled(rotary+fa) 0.68x" in gpu_speedups


def test_ep_moe_scaling_is_against_the_best_one_gpu_variant():
    text = report.render("ep-moe")
    assert "| mixtral | 2 | ep |" in text and "1.52x of torch loop" in text
    assert "0.94x of fused_moe" in text  # DeepSeek-like on 2 GPUs: slower than one


def test_generation_table_renders_rows_errors_and_the_source_line():
    doc = {
        "gpu": "NVIDIA H200",
        "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0"},
        "ceilings": {"copy_bytes_per_s": 4.3e12, "bf16_matmul_flops": 7.9e14},
        "rows": [
            {"mode": "ours", "batch": 1, "prompt": 128, "new": 64, "layers": 32, "first_call_s": 41.2,
             "prefill_ms": 18.5, "decode_ms_per_token": 4.2, "peak_gib": 16.3, "logits_rel_err": 4.1e-3,
             "tokens_equal_eager": 64, "floor_ms_per_token": 3.75, "error": None,
             "graphs": [{"regions": {"gemm_0": "kernel", "gemm_1": "reference"}, "graph_note": ""},
                        {"regions": {"gemm_0": "kernel", "gemm_1": "kernel"},
                         "graph_note": "CUDA graph replay 6916 µs vs direct launches 18144 µs per call"}]},
            {"mode": "eager", "batch": 8, "prompt": 128, "new": 64, "layers": 32,
             "error": "OutOfMemoryError: CUDA out of memory"},
        ],
    }  # fmt: skip
    text = report.generation_table(doc)
    lines = text.splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == lines[3].count("|")
    assert "| ours | 1 | 128 | 64 | 32 | 41.2 | 18.50 | 4.200 | 3.750 | 1.12x | 16.30 | 4.1e-03 | 64 of 64 |" in text
    assert "1 Triton, 1 torch (cuBLAS/SDPA) / 2 Triton; CUDA graph replay 6916 µs |" in text
    assert "error: OutOfMemoryError" in lines[3]
    src = report.source_line([("x-generate.json", doc, "")])
    assert "NVIDIA H200" in src and "torch 2.11.0+cu130" in src and "copy 4.30 TB/s" in src and "790 TFLOP/s" in src
    assert "`bench/results/x-generate.json`" in src


def test_a_new_run_names_its_ceilings_and_regions(tmp_path):
    """A bench/run.py result with measured ceilings and region ops (what new runs record)."""
    ceilings = {"copy_bytes_per_s": 4.3e12, "bf16_matmul_flops": 7.9e14, "gpu": "NVIDIA H200"}
    meta = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-12-01", "dtype": "bfloat16",
            "tune": "quick", "rounds": 3, "ceilings": ceilings}  # fmt: skip
    kernels = [
        {"name": "gemm_0", "pattern": "gemm", "impl": "kernel", "ops": ["dl.rms_norm", "dl.linear", "dl.rotary"]},
        {"name": "gemm_1", "pattern": "gemm", "impl": "reference", "ops": ["dl.linear", "dl.add"],
         "reason": "the reference (torch / cuBLAS) measured faster"},
    ]  # fmt: skip
    base = {"block": "new_block", "M": 16, "floor_us": 10.0}
    rows = [
        {**base, "mode": "eager", "gpu_us": 30.0, "call_us": 60.0},
        {**base, "mode": "ours", "call_us": 25.0, "kernels": kernels},
        {**base, "mode": "ours-nocg", "gpu_us": 20.0, "call_us": 40.0, "kernels": kernels},
    ]
    path = tmp_path / "run.json"
    path.write_text(report.json.dumps({"runs": [{"meta": meta, "rows": rows}]}))
    text = report.block_markdown(report.load_runs([str(path)]))
    assert "| 16 | 10.0 | 30.0 / 60.0 | 20.0 / 25.0 | 1.50x |" in text
    assert "Triton: rms_norm+linear+rotary; cuBLAS: linear+add" in text
    assert "ceilings measured in this run: copy 4.30 TB/s, bf16 matmul 790 TFLOP/s" in text
    assert "floors from the ceilings measured in the same run" in text and "run.json` (M = 16)" in text


def test_rounds_apart_by_more_than_five_per_cent_are_listed_under_the_table():
    """A median of rounds that disagree is uncertain: the rounds' range is listed where it passes 5%, not else."""
    modes = {"ours": {"call_us": 150.0, "call_us_rounds": [140.0, 150.0, 160.0]},
             "eager": {"gpu_us": 200.0, "gpu_us_rounds": [199.0, 200.0, 203.0], "call_us_rounds": [210.0]}}  # fmt: skip
    line = report.rounds_spread({2048: modes}, ["eager", "ours"])
    assert line == "*Rounds apart by more than 5%:* M = 2048 ours call 140–160 µs."
    assert report.rounds_spread({2048: {"ours": {"call_us_rounds": [100.0, 104.0]}}}, ["ours"]) == ""


def test_paired_calls_predecessors_rebuild_the_profilers_turn_order():
    """bench/report.py rebuilds which mode's call came before each paired call with the profiler's seeded order,
    without importing torch: the two must agree."""
    from dlblas_compiler.tuning.profiler import turn_orders

    modes = ("ours", "inductor", "max-autotune")
    rows = [{"mode": m, "call_us_paired_calls": [1.0] * 7} for m in modes]
    flat = [i for order in turn_orders(3, 7) for i in order]
    expected: list[list] = [[] for _ in modes]
    for k, i in enumerate(flat):
        expected[i].append(modes[flat[k - 1]] if k else None)
    assert report._paired_after(rows) == expected
    assert sum(a.count(None) for a in expected) == 1 and all(len(a) == 7 for a in expected)
