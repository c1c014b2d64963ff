"""The warp-specialized GEMM kernel (WS: `codegen/gemm/warp_specialized.py`): the tiled GEMM's main loop in Gluon,
a TMA loader warp feeding the MMA warps through a ring of shared-memory stages, the shared epilogue after it.

Gluon kernels do not run in Triton's interpreter: on the CPU the kernels are built for sm90 by the compile workers
(as `test_compile_pool` builds the Triton ones) and their resources read from the binaries; on the GPU they run
against float64."""

import dataclasses
import re

import pytest
import torch
from torch import nn

import dlblas_compiler as dc
from dlblas_compiler.codegen import device
from dlblas_compiler.codegen.gemm import warp_specialized
from dlblas_compiler.codegen.gemm.emitter import GemmEmitter
from dlblas_compiler.codegen.gemm.plan import Cols, analyze, flat_row_stride
from dlblas_compiler.codegen.gemm.space import space as gemm_space
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.numerics import rel_error, tolerance
from dlblas_compiler.runtime.program import RegionStep

from .test_codegen import CacheWriteQKV, PerHeadQKVRotary, QKNormRotary, _cache_write_args
from .test_compile_pool import _sm90_build, workers  # noqa: F401 - (its fixture: two workers, a fresh cache)

pytestmark = pytest.mark.skipif(not warp_specialized.available(), reason="this Triton has no Gluon for Hopper")

CFG = BlockConfig(hidden=512, intermediate=1024, heads=8, kv_heads=2, head_dim=64)


def ws(bm: int, bn: int, bk: int, warps: int, stages: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": warps,
            "num_stages": stages, "TMA": 1, "MM": 0, "NORM_PASS": 1, "PERSISTENT": 1, "WS": 1}  # fmt: skip


def _steps(model, inputs, backend: str):
    """(step, inputs, float64 references on the GPU) of each GEMM region, the program stepped along between them."""
    cm = dc.compile(model, backend=backend, cuda_graphs=False, tune="none")
    with torch.no_grad():
        cm(*inputs)
        program = cm._spec().executor
        env = program._env(list(inputs))
        for step in program.steps:
            if isinstance(step, RegionStep) and step.kernel is not None and step.choice.pattern == "gemm":
                tensors = step.inputs(env)
                gpu = backend == "triton"
                yield step, tensors, step.reference([t.double() if t.is_floating_point() else t for t in tensors]) if gpu else None
            step(env)


def _block(device_: str, dtype=torch.bfloat16, tokens: int = 40):
    model = randomize_(LlamaBlock(CFG)).to(device_, dtype).eval()
    return model, llama_block_inputs(CFG, 1, tokens, dtype, device_)


class BiasGelu(nn.Module):
    """Linear(bias) → GELU (erf) on a shape no tile divides: K = 200 (a ragged last K step, zero-filled by TMA) and
    N = 300 columns."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(200, 300)

    def forward(self, x):
        return torch.nn.functional.gelu(self.proj(x))


class QRotary(nn.Module):
    """q alone: one projection, heads in eager's [B, S, H, D] (a plain block of the GEMM's columns), rotary."""

    def __init__(self, k, heads, d):
        super().__init__()
        self.heads, self.d = heads, d
        self.q = nn.Linear(k, heads * d, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.d)
        return q * cos[:, None] + torch.cat([-q[..., self.d // 2:], q[..., : self.d // 2]], -1) * sin[:, None]


def test_offered_where_the_epilogue_needs_nothing_gluon_lacks():
    """o-proj and down (+ residual), the dual gate/up GEMM (norm, SiLU · up) and the QKV GEMM (rotary, heads) get the
    Gluon kernel `<name>_ws` in their source; a per-head RMSNorm (Qwen3's q/k norms) keeps a region out. A rotary
    region gets no TMA epilogue (WS=2), even with one output laid out as a plain block. The QKV kernel's epilogue
    takes no reduction of the column indices and no table reshaped for every head (Gluon infers neither's layout),
    and its layout holds each rotary pair in one thread. Without a GPU the space has no WS config."""
    model, inputs = _block("cpu")
    got = {}
    for step, _, _ in _steps(model, inputs, "interpret"):
        ops = {o.name for o in step.kernel.region.body_ops}
        got[frozenset(ops)] = f"def {step.kernel.name}_ws(" in step.kernel.source
        assert not any(c.get("WS") for c in step.kernel.space.starts())
        if "dl.rotary" in ops:
            tiles = step.kernel.source[step.kernel.source.index("def _ws_tiles("):]
            tiles = tiles[: tiles.index("@gluon.jit")]
            # (no reduction of rn; no [BLOCK_M, 64] cos/sin table for every head: any `gl.arange(0, <n>)`)
            assert "gl.max(rn" not in tiles and not re.search(r"gl\.arange\(0, \d+\)", tiles)
            assert "_epilogue_layout(BLOCK_N, num_warps, 32)" in tiles  # (pairs 32 columns apart in one thread)
    assert sorted(got.values()) == [True, True, True], got  # (o-proj and down are one kernel)
    q = randomize_(QRotary(64, 4, 16)).to(torch.bfloat16).eval()  # (one output, a plain block, with a rotary)
    ang = torch.randn(40, 8)
    inputs = (torch.randn(1, 40, 64), torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1))
    (step,) = [s for s, _, _ in _steps(q, [t.bfloat16() for t in inputs], "interpret")]
    em = GemmEmitter(analyze(list(step.kernel.region.body_ops), list(step.kernel.region.block.args)),
                     step.kernel.region, step.kernel.name)  # fmt: skip
    em.source()
    assert f"def {step.kernel.name}_ws(" in step.kernel.source and em.staging is None  # (WS=1 only: see `staging`)
    model = randomize_(QKNormRotary(64, 4, 2, 16)).to(torch.bfloat16).eval()
    ang = torch.randn(40, 8)
    inputs = (torch.randn(1, 40, 64), torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1))
    (step,) = [s for s, _, _ in _steps(model, [t.bfloat16() for t in inputs], "interpret")]
    assert "dl.rms_norm" in step.kernel.region_ir and f"def {step.kernel.name}_ws(" not in step.kernel.source


def test_twins_follow_the_persistent_starts_on_sm90(monkeypatch):
    """On an sm90 GPU the quick search's starts hold each persistent TMA start's WS twin right after it (WS=2, with
    the TMA epilogue, where the region's output allows it), and the space rejects WS configs it cannot run (split K,
    one tile per program, 8 warps on 64 rows, a norm weight in the K loop, WS=2 without the TMA epilogue)."""
    model, inputs = _block("cpu")
    steps = [s for s, _, _ in _steps(model, inputs, "interpret") if f"{s.kernel.name}_ws(" in s.kernel.source]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device, "capability", lambda: (9, 0))
    monkeypatch.setattr(device, "smem_limit", lambda: 232448)
    monkeypatch.setattr(device, "sm_count", lambda: 132)
    for step in steps:
        fused = step.kernel.region
        plan = analyze(list(fused.body_ops), list(fused.block.args))
        em = GemmEmitter(plan, fused, step.kernel.name)
        em.source()
        staged = em.staging is not None  # (as the kernel's build found: not for the QKV GEMM, a rotary)
        assert staged == ("dl.rotary" not in step.kernel.region_ir)
        plan = dataclasses.replace(plan, rows=(1, 8192), tma_epilogue=staged)  # (8192 tokens: more tiles than SMs)
        space = gemm_space(plan)
        starts = space.starts()
        twins = [i for i, c in enumerate(starts) if c["WS"]]
        assert twins, step.kernel.name
        for i in twins:  # (with the TMA epilogue where the region's output is a plain block; after the start's
            # split-K twin where it has one)
            start = next(c for c in reversed(starts[:i]) if not c["WS"] and c["SPLIT_K"] == 1)
            assert {**start, "WS": 2 if staged else 1} == starts[i]
        base = starts[twins[0]]
        assert space.is_valid({**base, "WS": 1})  # (the pointer epilogue stays in the space)
        assert space.is_valid({**base, "WS": 2}) == staged
        assert space.is_valid(base)
        for bad in ({"SPLIT_K": 2}, {"PERSISTENT": 0}, {"BLOCK_M": 64, "num_warps": 8}, {"MM": 1}, {"TMA": 0}):
            assert not space.is_valid({**base, **bad}), bad


def test_builds_warp_specialized_for_sm90_without_spills(workers):  # noqa: F811 - (the fixture)
    """Built for sm90 by a compile worker (Gluon's own compile path): the o-proj kernel at 128x128 (4 stages) and the
    dual gate/up one at 128x128 a stream are warp-specialized (a loader partition beside the MMA warps) and spill
    nothing; the o-proj at 128x256 with 3 stages spills at most 64 bytes (none with Triton 3.6), and nothing with
    the TMA epilogue (WS=2: the accumulator's column halves in turn, bench/NOTES.md 170). Each issues one
    product a K step: the dual GEMM's 128x256 over both streams' rows (until the fifty-fifth session two of
    128x128, each reading the A tile again: bench/NOTES.md 160)."""
    model, inputs = _block("cpu")
    found = {}
    for step, tensors, _ in _steps(model, inputs, "interpret"):
        if f"{step.kernel.name}_ws(" in step.kernel.source:
            found["glu" if "dl.glu" in step.kernel.region_ir else "add"] = (step, tensors)
    for name, c, most in (("add", ws(128, 128, 64, 8, 4), 0), ("glu", ws(128, 128, 64, 8, 4), 0),
                          ("add", ws(128, 256, 64, 8, 3), 64), ("add", {**ws(128, 256, 64, 8, 3), "WS": 2}, 0),
                          ("glu", {**ws(128, 128, 64, 8, 4), "WS": 2}, 0)):  # fmt: skip
        stack, _, ttgir = _sm90_build(workers, *found[name], c)
        assert "ttg.warp_specialize" in ttgir and "ttng.warp_group_dot" in ttgir, name
        assert stack <= most, (name, c, stack)
        # WS=2: the tile stored by TMA; o-proj's residual copied in by TMA (the A, W and residual loads: three)
        assert ("ttng.async_tma_copy_local_to_global" in ttgir) == (c["WS"] == 2), (name, c)
        loads = ttgir.count("ttng.async_tma_copy_global_to_local")
        assert loads == 2 + (c["WS"] == 2 and name == "add"), (name, c, loads)
        # one product a K step, as wide as all the streams' columns (gate/up: both streams' rows in one stage)
        dots = re.findall(r"ttng.warp_group_dot .*", ttgir)
        width = c["BLOCK_N"] * (2 if name == "glu" else 1)
        assert len(dots) == 1 and f"tensor<{c['BLOCK_M']}x{width}xf32" in dots[0], (name, dots)


def _rotary_cases(device_: str, dtype, tokens: int) -> dict:
    """QKV regions beside the Llama block's (halves, heads of 64): a static cache's k and v written at their
    positions (heads of 32), and GPT-NeoX's per-head [q | k | v] columns with interleaved pairs or partial rotary
    (16 of 32 columns) and a bias; each (model, inputs)."""
    cases = {}
    cache = randomize_(CacheWriteQKV(256, 4, 2, 32)).to(device_, dtype).eval()
    args = _cache_write_args(1, tokens, 256, 2, 32, tokens + 50, list(range(40, 40 + tokens)))
    cases["cache"] = (cache, [t.to(device_, dtype) if t.is_floating_point() else t.to(device_) for t in args])
    for rd, inter in ((None, True), (16, False)):
        neox = randomize_(PerHeadQKVRotary(256, 4, 32, rd, inter)).to(device_, dtype).eval()
        ang = torch.randn(tokens, (rd or 32) // 2, generator=torch.Generator().manual_seed(3))
        rep = (lambda t: t.repeat_interleave(2, -1)) if inter else (lambda t: torch.cat([t, t], -1))
        x = torch.randn(1, tokens, 256, generator=torch.Generator().manual_seed(4))
        cases[f"neox-{rd}-{inter}"] = (neox, [t.to(device_, dtype) for t in (x, rep(ang.cos()), rep(ang.sin()))])
    return cases


def test_qkv_builds_for_sm90(workers):  # noqa: F811 - (the fixture)
    """The QKV kernels' Gluon twins build for sm90 at 128x128, 4 stages: the Llama block's (rotary halves 32 columns
    apart, the norm's row pass) and the static cache's (k and v stored at indexed rows) spill nothing; GPT-NeoX's
    per-head interleaved one builds too."""
    model, inputs = _block("cpu")
    steps = _steps(model, inputs, "interpret")
    cases = {"llama": next((s, t) for s, t, _ in steps if "dl.rotary" in s.kernel.region_ir)}
    for name, (m, args) in _rotary_cases("cpu", torch.bfloat16, 40).items():
        if name != "neox-16-False":
            (cases[name],) = [(s, t) for s, t, _ in _steps(m, args, "interpret")]
    for name, (step, tensors) in cases.items():
        c = {**ws(128, 128, 64, 8, 4), "NORM_PASS": int("dl.rms_norm" in step.kernel.region_ir)}
        stack, _, ttgir = _sm90_build(workers, step, tensors, c)
        assert "ttg.warp_specialize" in ttgir, name
        assert stack == 0 or name.startswith("neox"), (name, stack)


def test_tma_epilogue_where_the_output_is_a_plain_block(monkeypatch):
    """WS=2 (the TMA epilogue) is built where the region's one output is a plain [M, N] block with 16-byte rows:
    o-proj and down (the residual, laid out so too, prefetched by the loader into the output's shared-memory tile)
    and the dual gate/up GEMM (no operand to prefetch); not for Linear(bias)+GELU with N = 300 (600-byte rows), whose
    space then has no WS=2 config. A WS=2 launch asks for the TMA epilogue (EPI_TMA) only with a 16-byte-aligned
    residual: for a residual viewed at an odd offset the same kernel stores by pointer."""
    model, inputs = _block("cpu")
    lin = randomize_(BiasGelu()).to(torch.bfloat16).eval()
    found = {}
    for m, x in ((model, inputs), (lin, (torch.randn(1, 517, 200, dtype=torch.bfloat16),))):
        for step, tensors, _ in _steps(m, x, "interpret"):
            if f"def {step.kernel.name}_ws(" not in step.kernel.source:
                continue
            ops = {o.name for o in step.kernel.region.body_ops}
            kind = "glu" if "dl.glu" in ops else "add" if "dl.add" in ops else "gelu"
            em = GemmEmitter(analyze(list(step.kernel.region.body_ops), list(step.kernel.region.block.args)),
                             step.kernel.region, step.kernel.name)  # fmt: skip
            em.source()
            found[kind] = (step, tensors, warp_specialized.staging(em), em)
    assert set(found) == {"add", "glu", "gelu"}
    for kind, (step, _, st, _) in found.items():
        assert (st is not None) == (kind != "gelu"), kind
        assert (st is not None and st.ext is not None) == (kind == "add"), kind
        assert ("tma.async_copy_shared_to_global(c_desc" in step.kernel.source) == (st is not None), kind

    seen = []

    class Recorder:  # (a kernel object whose WS launch records EPI_TMA instead of running)
        def variant(self, _name):
            return self

        def __getitem__(self, _grid):
            return lambda *a, **kw: seen.append(kw["EPI_TMA"])

    monkeypatch.setattr(device, "descriptor_scratch", lambda: None)
    step, tensors, st, em = found["add"]
    c = {**ws(128, 128, 64, 8, 4), "WS": 2}
    step.kernel.launch(Recorder(), tensors, c)
    step.kernel.launch(Recorder(), tensors, {**c, "WS": 1})
    odd, r = list(tensors), em.ext_operand(st.ext)[0]
    odd[r] = torch.empty(odd[r].numel() + 1, dtype=odd[r].dtype)[1:].view_as(odd[r])
    step.kernel.launch(Recorder(), odd, c)
    assert seen == [True, False, False], seen


def test_flat_row_stride_accepts_only_plain_blocks():
    """`plan.flat_row_stride` (what WS=2's TMA descriptors assume): the row stride where every row m = (i0 * R1 + i1)
    * R2 + ... of a value lies one stride after the last and its columns are the tile's, contiguous; None for any
    other layout. A row dim of size 1 may have any stride but does not break the chain (review of the sixtieth
    session: rows (4, 1, 8) with strides (64, 64, 256) were taken for a block 256 apart)."""
    cols = Cols(0, 0, 512, (512,), (0, 1, 2))
    assert flat_row_stride([40 * 512, 512, 1], cols, (2, 40), 512) == 512  # (contiguous [B, S, N])
    assert flat_row_stride([40 * 1024, 1024, 1], cols, (2, 40), 512) == 1024  # (the first N columns of wider rows)
    assert flat_row_stride([1024, 64, 1], cols, (8, 1), 512) == 1024  # (a size-1 dim's stride is free)
    four = Cols(0, 0, 512, (512,), (0, 1, 2, 3))
    assert flat_row_stride([64, 64, 256, 1], four, (4, 1, 8), 512) is None  # (a permuted [C, A, 1, N])
    assert flat_row_stride([512, 20480, 1], cols, (2, 40), 512) is None  # (rows transposed)
    assert flat_row_stride([0, 512, 1], cols, (2, 40), 512) is None  # (broadcast over the batch)
    assert flat_row_stride([20480, 0, 1], cols, (2, 40), 512) is None  # (one row for every position)
    assert flat_row_stride([20480, 512, 2], cols, (2, 40), 512) is None  # (columns strided)
    assert flat_row_stride([20480, 256, 1], cols, (2, 40), 512) is None  # (rows overlapping)
    heads = Cols(0, 0, 512, (8, 64), (0, 1, 2, 3))
    assert flat_row_stride([20480, 512, 64, 1], heads, (2, 40), 512) == 512  # (heads split, still in order)
    assert flat_row_stride([20480, 512, 1, 8], heads, (2, 40), 512) is None  # (heads interleaved)
    assert flat_row_stride([20480, 512, 1], Cols(0, 0, 256, (256,), (0, 1, 2)), (2, 40), 512) is None  # (narrower)
    assert flat_row_stride([20480, 512, 1], Cols(0, 0, 512, (512,), (0, 1, 2), (0, 256)), (2, 40), 512) is None


def test_one_worker_builds_a_kernel_and_its_ws_twin_from_one_file(workers, monkeypatch):  # noqa: F811
    """A GEMM's file holds two functions, its Triton kernel and its Gluon twin `<name>_ws`. A fresh worker given jobs
    of both, in either order, builds each (until the fifty-third session a worker kept the first function it built
    from a file and answered the other's jobs with it: "'PERSISTENT' is not in list", and the tuner's batches on
    the GPU compiled those candidates one after another in the launching process instead)."""
    from triton.runtime.driver import driver

    from dlblas_compiler.codegen import compile_pool
    from dlblas_compiler.codegen.kernel import _Warmup

    monkeypatch.setenv(compile_pool.WORKERS_ENV, "1")  # (the pool starts at the first batch: one worker)
    model, inputs = _block("cpu")
    step, tensors, _ = next((s, t, r) for s, t, r in _steps(model, inputs, "interpret")
                            if f"{s.kernel.name}_ws(" in s.kernel.source)  # fmt: skip
    twin = ws(128, 128, 64, 8, 4)
    before = driver._active
    driver.set_active(compile_pool.Sm90Driver())
    try:
        fn = step.kernel.compiled(False)
        twin3 = {**twin, "num_stages": 3}
        for order in ((twin, {**twin, "WS": 0}), ({**twin3, "WS": 0}, twin3)):  # (new configs: nothing cached)
            compile_pool.shutdown()  # (a fresh worker for each order: it has built nothing from the file yet)
            failed = compile_pool.STATS.failed
            assert compile_pool.prebuild(lambda o=order: [step.kernel.launch(_Warmup(fn), tensors, c) for c in o]) == 2
            assert compile_pool.STATS.failed == failed, order
    finally:
        driver.set_active(before)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ws_configs_are_right_and_repeatable_on_the_gpu(dtype, monkeypatch):
    """Every WS region of a Llama block at 333 and 2100 tokens (ragged last row tiles), a Linear(bias)+GELU with
    K = 200 and N = 300 (ragged K step and columns) and the QKV regions of `_rotary_cases` at 333 tokens, with 7 programs so that each loops over many tiles and the
    loader runs ahead across them (and, with the TMA epilogue, the residual's copy and the store of one tile overlap
    the next tile's K loop): each config launched three times, every output within tolerance of float64 and the
    three runs equal bit for bit."""
    monkeypatch.setattr(device, "sm_count", lambda: 7)
    configs = [ws(128, 128, 64, 8, 4), ws(128, 256, 64, 8, 3), ws(64, 128, 64, 4, 4), ws(128, 64, 32, 4, 5),
               ws(128, 128, 32, 8, 5)]  # fmt: skip
    configs += [{**c, "WS": 2} for c in configs]  # (the TMA epilogue where the region has it: not Linear+GELU's)
    cases = [_block("cuda", dtype, 333), _block("cuda", dtype, 2100)]
    lin = randomize_(BiasGelu()).to("cuda", dtype).eval()
    cases.append((lin, (torch.randn(1, 517, 200, device="cuda", dtype=dtype),)))
    cases += list(_rotary_cases("cuda", dtype, 333).values())  # (QKV regions: cache writes, GPT-NeoX's heads)
    checked = set()
    with torch.no_grad():
        for model, inputs in cases:
            for step, tensors, refs in _steps(model, inputs, "triton"):
                if f"{step.kernel.name}_ws(" not in step.kernel.source:
                    continue
                for c in configs:
                    if step.kernel.shape_key["streams"] * c["BLOCK_M"] * c["BLOCK_N"] > 128 * 32 * c["num_warps"]:
                        continue  # (the accumulators would not fit the registers: the space's rule)
                    runs = [step.launch(step.private(tensors, every=True), c) for _ in range(3)]
                    for o, r in zip(runs[0], refs, strict=True):
                        assert rel_error(o, r) <= tolerance(dtype), (step.kernel.region_ir, c)
                    for outs in runs[1:]:
                        assert all(torch.equal(a, b) for a, b in zip(outs, runs[0])), ("runs differ", c)
                    checked.add((step.kernel.name, tuple(c.values())))
    assert len(checked) >= 24, checked
