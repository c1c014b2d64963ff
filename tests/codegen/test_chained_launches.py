"""Programmatic dependent launch (`Options.chained_launches`): every generated kernel carries the guarded
grid-dependency wait, `Chained` launches it with PDL on sm90+, and results do not change (directly and inside
CUDA graphs)."""

from __future__ import annotations

import re

import pytest
import torch

import dlblas_compiler as dc
from dlblas_compiler.codegen.kernel import Chained
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.numerics import rel_error, tolerance

CFG = BlockConfig(hidden=64, heads=4, kv_heads=2, intermediate=128)


def _kernels(cm) -> list:
    return [s for s in cm._spec().executor.steps if getattr(s, "kernel", None) is not None]


def test_every_generated_kernel_waits_for_its_predecessor_under_pdl_only():
    model = randomize_(LlamaBlock(CFG)).eval()
    args = llama_block_inputs(CFG, 2, 9, dtype=torch.float32)
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad():
        out, ref = cm(*args), model(*args)
    assert rel_error(out, ref) < tolerance(torch.float32)
    steps = _kernels(cm)
    assert all(s.choice.impl == "kernel" for s in steps)
    kinds = {s.kernel.name.rsplit("_", 1)[0] for s in steps}
    assert {"gemm", "attention"} <= kinds, kinds
    for s in steps:
        src = s.kernel.source
        assert "PDL: tl.constexpr = False" in src, s.kernel.name
        head = src.split("):\n", 1)[1].splitlines()[:3]  # the body's first statements: nothing is read before the wait
        assert head[0].strip().startswith("if PDL:") and "gdc_wait()" in head[1]
        if s.kernel.name.startswith("gemm"):  # a GEMM releases the next kernel once its K loop has read its operands
            assert "gdc_launch_dependents()" not in head[2]
            kernel, tile = src.split("def _tile(", 1)
            tile, products = tile.split("\n\n@triton.jit", 1)  # (each variant's product follows the tile's work)
            assert "for k0 in range(" in products and "gdc_launch_dependents()" not in products
            calls = max(tile.index(f"{p}(") for p in ("_product_cublas", "_product_one_row", "_product_tiled"))
            assert calls < tile.index("gdc_launch_dependents()") < tile.index("tl.store(")
            release = next(line for line in tile.splitlines() if line.strip().startswith("if RELEASE:"))
            variants = next(line for line in tile.splitlines() if line.strip() == "if MM:")
            assert release.index("if") == variants.index("if")  # (after every variant's K loop, not inside one)
            # the persistent loops (whole tiles; the last wave split over K): released after the last tile
            persistent = kernel.split("if PERSISTENT:", 1)[1].split("\n    else:\n", 1)[0]
            loops = [persistent.index("for pid in tl.range("), persistent.index("for u in range(")]  # (whole, split tiles)
            assert max(loops) < persistent.index("gdc_launch_dependents()")
            calls = [re.split(r"\n\s*\)", c, maxsplit=1)[0] for c in persistent.split("_tile(")[1:]]
            assert len(calls) == 3 and all(c.rstrip().endswith("False,") for c in calls)  # (its tiles release nothing)
        else:
            assert "gdc_launch_dependents()" in head[2]
        assert not isinstance(s.compiled, Chained)  # the interpreter (and GPUs before sm90) launch plainly


def _fake_launches(monkeypatch, ttgir: str = ""):
    """(a Chained launcher of a fake jitted function whose binaries carry `ttgir`, the calls it saw)."""
    from dlblas_compiler.codegen import launcher

    seen = []
    monkeypatch.setattr(launcher, "_device", lambda: 0)
    monkeypatch.setattr(launcher, "_stream", lambda device: 7)

    class Param:
        def __init__(self, name, constexpr, default=None):
            self.name, self.is_constexpr, self.default = name, constexpr, default

    class Binary:
        function, packed_metadata, name, asm = "fn", "meta", "fake", {"ttgir": ttgir}

        def run(self, *a):
            seen.append(("binary", a))

    class Fake:
        params = [Param("x", False), Param("y", False), Param("BLOCK_M", True), Param("PDL", True, False)]

        def run(self, *a, **k):
            seen.append(("run", a, k))
            return Binary()

    return Chained(Fake()), seen


def test_chained_passes_the_flag_and_the_launch_attribute_to_launches_and_warmups(monkeypatch):
    """Chained adds PDL=True and launch_pdl=True to the first launch of a specialization (Triton's launcher
    compiles it with them) and to warm-ups; later launches call that binary with the flag among its constexprs."""
    fn, seen = _fake_launches(monkeypatch)
    fn[(3, 1)](1, 2, BLOCK_M=16, num_warps=4)
    fn[(3, 1)](1, 2, BLOCK_M=16, num_warps=4)
    fn.run(1, grid=(2,), warmup=True, BLOCK_M=16, num_warps=4)
    assert seen[0] == ("run", (1, 2), {"grid": (3, 1), "warmup": False, "BLOCK_M": 16, "num_warps": 4, "PDL": True,
                                       "launch_pdl": True})  # fmt: skip
    assert seen[1] == ("binary", (3, 1, 1, 7, "fn", "meta", None, None, None, 1, 2, 16, True))
    assert seen[2] == ("run", (1,), {"PDL": True, "launch_pdl": True, "grid": (2,), "warmup": True, "BLOCK_M": 16,
                                     "num_warps": 4})  # fmt: skip
    # the keywords in one order: Triton keys the binaries it holds in memory on the text of the options' dict
    # (num_warps, launch_pdl, ...), so a warm-up that put them in another order than the launch built a binary the
    # launch missed (and loaded again from the disk cache)
    launch_order, warmup_order = ([k for k in kw if k not in ("grid", "warmup")] for _, _, kw in (seen[0], seen[2]))
    assert launch_order == warmup_order == ["BLOCK_M", "num_warps", "PDL", "launch_pdl"]


# the loop of an sm90 K loop whose A tile was scaled in registers (Triton 3.6's TTGIR, trimmed): one wgmma per 16-wide
# K slice reading A from registers, each waited on with 3 groups left in flight (bench/NOTES.md 167)
RS_LOOP = """
      %acc0_159 = ttng.warp_group_dot %a_151, %acc0_155, %acc0_110 {inputPrecision = 0 : i32, isAsync = true} : \
tensor<128x16xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> * !ttg.memdesc<16x256xbf16, #shared2, #smem>
      %acc0_160:2 = ttng.warp_group_dot_wait %acc0_159, %acc0_155 {pendings = 3 : i32} : tensor<128x256xf32, #mma>
"""  # (the backslash joins the dot's line)


def test_launcher_refuses_a_binary_whose_pipelined_wgmma_races(monkeypatch):
    """A binary whose TTGIR pipelines a wgmma reading A from registers with groups left in flight is refused at its
    first launch (WgmmaRace: a failed candidate to the tuner) and kept for no later launch; waited on in full
    (pendings = 0), its binary is kept and called directly afterwards."""
    from dlblas_compiler.codegen import launcher

    fn, seen = _fake_launches(monkeypatch, RS_LOOP)
    for _ in range(2):
        with pytest.raises(launcher.WgmmaRace, match="triton-lang/triton#9433"):
            fn[(3, 1)](1, 2, BLOCK_M=16, num_warps=4)
    assert [s[0] for s in seen] == ["run", "run"]  # (never called directly)
    fn, seen = _fake_launches(monkeypatch, RS_LOOP.replace("pendings = 3", "pendings = 0"))
    fn[(3, 1)](1, 2, BLOCK_M=16, num_warps=4)
    fn[(3, 1)](1, 2, BLOCK_M=16, num_warps=4)
    assert [s[0] for s in seen] == ["run", "binary"]


@pytest.mark.gpu
def test_chained_launches_give_the_same_results_direct_and_in_cuda_graphs():
    from dlblas_compiler.codegen.device import has_pdl

    if not has_pdl():
        pytest.skip("programmatic dependent launch needs sm90+ and a CUDA 12.3+ driver")
    model = randomize_(LlamaBlock(CFG)).cuda().to(torch.bfloat16).eval()
    outs = {}
    for chained in (False, True):
        cm = dc.compile(model, backend="triton", chained_launches=chained)
        runs = []
        for tokens in (1, 1, 1, 37, 37, 37):  # third calls replay a CUDA graph
            args = llama_block_inputs(CFG, 2, tokens, dtype=torch.bfloat16, device="cuda", seed=tokens)
            with torch.no_grad():
                runs.append(cm(*args).float())
        torch.cuda.synchronize()
        assert all(isinstance(s.compiled, Chained) == chained for s in _kernels(cm))
        outs[chained] = runs
    with torch.no_grad():
        ref = model.float()(*llama_block_inputs(CFG, 2, 37, dtype=torch.float32, device="cuda", seed=37))
    for a, b in zip(outs[False], outs[True]):
        assert torch.equal(a, b)  # same kernels, same configs: PDL changes when programs start, not what they compute
    assert rel_error(outs[True][-1], ref) < tolerance(torch.bfloat16)


class _WithPDL:
    """A jitted function launched with PDL=True (on the interpreter, with the grid-dependency instructions as
    no-ops: the chained branches' arithmetic, not their timing)."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.fn[grid](*args, PDL=True, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fn, name)


def test_the_chained_branches_compute_what_the_plain_ones_do(monkeypatch):
    """Every kernel run with PDL=True gives the same values as with PDL=False, one-row GEMMs (1 token: BLOCK_M = 1)
    and tiles (9 tokens): the interpreter runs the chained branches, with the grid-dependency instructions as no-ops."""
    import triton.language.extra.cuda as cuda_extra

    monkeypatch.setattr(cuda_extra, "gdc_wait", lambda *a, **k: None)
    monkeypatch.setattr(cuda_extra, "gdc_launch_dependents", lambda *a, **k: None)
    cfg = BlockConfig(hidden=256, heads=4, kv_heads=2, intermediate=384)  # (K of several BLOCK_K steps)
    model = randomize_(LlamaBlock(cfg)).eval()
    cm = dc.compile(model, backend="interpret")
    for tokens in (1, 9):
        args = llama_block_inputs(cfg, 1, tokens, dtype=torch.float32, seed=tokens)
        with torch.no_grad():
            plain = cm(*args)
            steps = _kernels(cm)
            if tokens == 1:
                assert {s.choice.config["BLOCK_M"] for s in steps if s.kernel.name.startswith("gemm")} == {1}
            for s in steps:
                s.compiled = _WithPDL(s.compiled)
            try:
                chained = cm(*args)
            finally:
                for s in steps:
                    s.compiled = s.compiled.fn
        assert all(s.choice.impl == "kernel" for s in steps)
        assert torch.equal(plain, chained)


@pytest.mark.parametrize("capability, cuda, driver, expected", [((9, 0), "12.4", 12040, True), ((10, 0), "13.0", 13000, True),
                                                                ((9, 0), "12.4", 12020, False),
                                                                ((8, 0), "13.0", 13000, False),
                                                                ((9, 0), None, 12040, False)])  # fmt: skip
def test_pdl_needs_hopper_and_a_driver_that_captures_it(monkeypatch, capability, cuda, driver, expected):
    """Chained launches only where they run and are captured into CUDA graphs: an NVIDIA GPU of sm90 or later
    (no CUDA build: ROCm, say) with a 12.3+ driver (a 12.2 one runs a cu124 torch, and its captures would fail)."""
    from dlblas_compiler.codegen import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(device, "driver_version", lambda: driver)
    assert device.has_pdl() is expected
