"""Compile workers (`codegen.compile_pool`): a tuning batch's candidates are built in worker processes into Triton's
disk cache, and the launching process's own compile of each then finds its binary there (the same cache key).

On a machine without a GPU the launching process is a GPU process in all but the driver: Triton's driver answers
device 0 of an sm90 target, and every kernel is compiled for it (Triton needs no GPU to compile, only to launch).
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime.driver import driver

import dlblas_compiler as dc
from dlblas_compiler.codegen import compile_pool
from dlblas_compiler.codegen.kernel import _Warmup, compile_configs
from dlblas_compiler.codegen.launcher import wgmma_race
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.numerics import rel_error, tolerance
from dlblas_compiler.runtime.program import RegionStep

CFG = BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)


def _regions(device: str):
    """(step, inputs) of each kernel region of a Llama block (bf16), the program stepped along between regions."""
    model = randomize_(LlamaBlock(CFG)).to(device, torch.bfloat16).eval()
    inputs = llama_block_inputs(CFG, 1, 40, torch.bfloat16, device)
    cm = dc.compile(model, backend="triton" if device == "cuda" else "interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(*inputs)
        program = cm._spec().executor
        env = program._env(list(inputs))
        for step in program.steps:
            if isinstance(step, RegionStep) and step.kernel is not None:
                yield step, step.inputs(env)
            step(env)


@pytest.fixture
def workers(tmp_path, monkeypatch):
    """Two compile workers and a fresh Triton cache folder (its path)."""
    compile_pool.shutdown()
    monkeypatch.setenv(compile_pool.WORKERS_ENV, "2")
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))
    yield tmp_path
    compile_pool.shutdown()


def _configs(step) -> list[dict]:
    """Three configs of the region's kernel other than its default (which its first call may have compiled) that
    launch it (a GEMM's MM=2 runs cuBLAS alone)."""
    space = step.kernel.space
    return [c for c in space.configs() if c != space.default() and c.get("MM") != 2][:3]


def _check_workers_build_what_launches_find(step, tensors, fn, cache) -> None:
    configs = _configs(step)
    kernel = step.kernel

    def warm() -> None:
        for c in configs:
            kernel.launch(_Warmup(fn), tensors, c)

    stats = dataclasses.replace(compile_pool.STATS)
    built = compile_pool.prebuild(warm)
    assert built == len(configs), kernel.name
    now = compile_pool.STATS
    assert (now.batches, now.compiles, now.failed) == (stats.batches + 1, stats.compiles + built, stats.failed)
    assert 0 < now.slowest_s - stats.slowest_s <= now.compile_s - stats.compile_s
    assert now.slowest_s - stats.slowest_s <= now.wall_s - stats.wall_s
    assert len(os.listdir(cache)) >= len(configs)
    before = set(os.listdir(cache))
    compile_configs(kernel, fn, tensors, configs)  # (the workers again: each finds its binary; then this process)
    assert set(os.listdir(cache)) == before, f"{kernel.name}: a launch compiled what no worker had built"
    assert len(fn.device_caches[0][0]) >= len(configs)  # (this process's JIT holds each, loaded from the cache)


def test_workers_build_each_kernel_under_the_key_its_launch_finds(workers):
    """For every generated kernel of a Llama block (GEMMs with RMSNorm, rotary and SiLU epilogues, attention, add
    and norm), three configs compiled by the workers for sm90: the launching process's compile of the same
    warm-up launches adds nothing to Triton's cache, and its JIT then holds all three."""
    regions = list(_regions("cpu"))  # (computed on the interpreter first; then every kernel for the sm90 JIT)
    before = driver._active
    driver.set_active(compile_pool.Sm90Driver())
    try:
        kinds = set()
        for step, tensors in regions:
            _check_workers_build_what_launches_find(step, tensors, step.kernel.compiled(False), workers)
            kinds.add(step.kernel.tuning_key[0])
    finally:
        driver.set_active(before)
    assert {"gemm", "attention"} <= kinds, kinds


def test_qkv_epilogue_registers_at_the_m2048_tiles(workers):
    """The QKV GEMM of a block with heads of 128 (norm, rotary: its epilogue is the heaviest), built for sm90 at the
    tiles M = 2048 runs (TMA, 8 warps): 128x128 spills nothing, 128x256 at most 256 bytes a thread — 280-384 before
    the rotary's cos/sin table was read once per tile instead of per column (bench/NOTES.md 131). Read from the
    binaries with Triton's cuobjdump (`bench/kernel_resources.py` does it for a whole layer); Triton is pinned, so
    its ptxas is too. The persistent kernel whose last wave splits over K (SPLIT_K 4) builds too: here its tiles fill
    whole waves (no split at this length), and the workspace and counters it gets are still an fp32 and an int32
    buffer (a bf16 stand-in failed to build). Its second copy of the tile's work, with the partial sums and their
    reduction, spills 512 bytes (bench/NOTES.md 138): pinned at most 576 so that a growth shows."""
    step, tensors = _qkv_region(head_dim=128, kv_heads=1)
    stack = {}
    for bn, sk in ((128, 1), (256, 1), (256, 4)):
        c = {"BLOCK_M": 128, "BLOCK_N": bn, "BLOCK_K": 64, "SPLIT_K": sk, "GROUP_M": 8, "num_warps": 8,
             "num_stages": 3, "TMA": 1, "MM": 0, "NORM_PASS": 1, "PERSISTENT": 1, "WS": 0}  # fmt: skip
        stack[bn, sk] = _sm90_build(workers, step, tensors, c)[0]
    assert stack[128, 1] == 0 and stack[256, 1] <= 256 and stack[256, 4] <= 576, stack


def _qkv_region(head_dim: int, kv_heads: int):
    """(step, inputs) of the QKV GEMM region (norm, q/k/v, rotary) of a 4-head bf16 block of 256 tokens."""
    cfg = BlockConfig(hidden=512, intermediate=1024, heads=4, kv_heads=kv_heads, head_dim=head_dim)
    model = randomize_(LlamaBlock(cfg)).to(torch.bfloat16).eval()
    inputs = llama_block_inputs(cfg, 1, 256, torch.bfloat16, "cpu")
    cm = dc.compile(model, backend="interpret", cuda_graphs=False, tune="none")
    with torch.no_grad():
        cm(*inputs)
        program = cm._spec().executor
        env = program._env(list(inputs))
        for step in program.steps:
            if isinstance(step, RegionStep) and "dl.rotary" in {o.name for o in step.kernel.region.body_ops}:
                return step, step.inputs(env)
            step(env)
    raise AssertionError("no QKV region")


def test_qkv_product_pass_takes_no_shared_memory(workers):
    """The QKV region over cuBLAS's product (MM: the pass reads the product back, rotates q and k, stores q, k, v)
    picks each output's branch from the tile's column span as scalars, so nothing crosses warps: built for sm90 at
    the tiles quick tuning runs for heads of 256 at M = 2048 (16x256, and 16x128, narrower than a head), its kernel
    takes no shared memory. Testing the branch on rn's reductions cost 5 barriers a program there (bench/NOTES.md
    165, 166)."""
    step, tensors = _qkv_region(head_dim=256, kv_heads=4)
    for bn in (256, 128):
        c = {"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": 4,
             "num_stages": 2, "TMA": 0, "MM": 1, "NORM_PASS": 1, "PERSISTENT": 0, "WS": 0}  # fmt: skip
        assert not step.kernel.space.violations(c), c
        _, shared, ttgir = _sm90_build(workers, step, tensors, c)
        assert shared == 0 and "tt.reduce" not in ttgir, (bn, shared)


def test_k_loop_scaling_a_in_registers_races_on_wgmma_tiles_only(workers):
    """The QKV region with its RMSNorm weight applied to A in the K loop (NORM_PASS=0), built for sm90: on 128-row
    tiles Triton makes the product a wgmma reading A from registers, pipelined with groups left in flight, which the
    launcher's check finds (`wgmma_race`; on an H200 such TMA configs gave wrong rows that vary between launches,
    bench/NOTES.md 167) and the space excludes; on 32-row tiles (a synchronous mma) neither. The row pass's config
    at 128 rows has no race either."""
    step, tensors = _qkv_region(head_dim=128, kv_heads=1)
    base = {"BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_stages": 3, "TMA": 1, "MM": 0,
            "PERSISTENT": 0, "WS": 0}  # fmt: skip
    for bm, warps, norm_pass, races in [(128, 8, 0, True), (32, 4, 0, False), (128, 8, 1, False)]:
        c = {**base, "BLOCK_M": bm, "num_warps": warps, "NORM_PASS": norm_pass}
        excluded = [v for v in step.kernel.space.violations(c) if v.startswith("no A tile scaled in registers")]
        assert bool(excluded) == races, (c, step.kernel.space.violations(c))
        ttgir = _sm90_build(workers, step, tensors, c)[2]
        why = wgmma_race(ttgir)
        assert (why is not None and "triton-lang/triton#9433" in why) == races, (c, why)
        assert ("ttng.warp_group_dot " in ttgir) == (bm == 128), c


@triton.jit
def _k_loop(x_ptr, w_ptr, o_ptr, M, N, K: tl.constexpr, STATS: tl.constexpr):
    """o = x @ w^T in 128x256x64 TMA tiles; with STATS, scaled by each row's 1/rms summed from the A tiles in the
    loop (the in-loop statistics of the first session, bench/NOTES.md 6 and 167)."""
    rm = tl.program_id(0) * 128 + tl.arange(0, 128)
    rn = tl.program_id(1) * 256 + tl.arange(0, 256)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[128, 64])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[256, 64])
    acc = tl.zeros((128, 256), dtype=tl.float32)
    ss = tl.zeros((128, 64), dtype=tl.float32)
    for k0 in range(0, K, 64):
        a = a_desc.load([tl.program_id(0) * 128, k0])
        if STATS:
            ss += a.to(tl.float32) * a.to(tl.float32)
        acc = tl.dot(a, b_desc.load([tl.program_id(1) * 256, k0]).T, acc)
    if STATS:
        acc = acc * tl.rsqrt(tl.sum(ss, axis=1) / K + 1e-5)[:, None]
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


def test_statistics_from_the_a_tile_shorten_its_ring_for_the_wgmma():
    """A K loop summing the squares of its TMA-loaded A tiles, built for sm90: Triton 3.6 gives A's ring 2 buffers
    where W's has 3, so the wgmma of the last step reads an A tile the next load overwrites (on an H200: 92% of
    the outputs wrong, no two launches alike, bench/NOTES.md 167); `wgmma_race` finds it. The same loop without the
    statistics has rings of equal depth and no race."""
    for stats in (True, False):
        ttgir = _compile_for_sm90(_k_loop, _K_LOOP_SIG, {"K": 4096, "STATS": stats}, num_warps=8, num_stages=3)
        why = wgmma_race(ttgir)
        assert (why is not None and "rings of [2, 3] buffers" in why) == stats, (stats, why)


def _compile_for_sm90(kernel, sig: dict, constexprs: dict, **options) -> str:
    """TTGIR of `kernel` compiled for sm90 here (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    return triton.compile(ASTSource(kernel, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 128),
                          options=options).asm["ttgir"]  # fmt: skip


_K_LOOP_SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "o_ptr": "*bf16", "M": "i32", "N": "i32", "K": "constexpr",
               "STATS": "constexpr"}  # fmt: skip


def test_a_kernel_compiles_after_the_interpreter_ran_a_program(tmp_path, monkeypatch):
    """A Llama block run on the interpreter leaves Triton's language as compiled kernels see it: Triton 3.6's
    interpreter swaps its builtins again when a kernel calls a jitted helper and never undoes that, after which a
    kernel compiled in the same process failed ("'ir.value' object has no attribute 'dtype'"; `interpreted()` puts
    them back)."""
    cfg = BlockConfig(hidden=64, heads=4, kv_heads=2, intermediate=128)
    cm = dc.compile(randomize_(LlamaBlock(cfg)).eval(), backend="interpret", cuda_graphs=False, tune="none")
    with torch.no_grad():
        cm(*llama_block_inputs(cfg, 1, 8, torch.float32, "cpu"))
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))  # (compiled here, not found in a cache)
    ttgir = _compile_for_sm90(_k_loop, _K_LOOP_SIG, {"K": 256, "STATS": False}, num_warps=8, num_stages=3)
    assert "ttng.warp_group_dot " in ttgir


def _sm90_build(workers, step, tensors, c: dict, ptx: bool = False) -> tuple[int, int, str]:
    """Build the region's kernel under config c for sm90 in a compile worker: (bytes of stack a thread, i.e.
    spills; bytes of shared memory the launch takes; its TTGIR, or with `ptx` its PTX), read from the binary with
    Triton's cuobjdump."""
    before = driver._active
    driver.set_active(compile_pool.Sm90Driver())
    try:
        fn = step.kernel.compiled(False)
        seen = set(os.listdir(workers))
        assert compile_pool.prebuild(lambda: step.kernel.launch(_Warmup(fn), tensors, c)) == 1
        (new,) = set(os.listdir(workers)) - seen
        (cubin,) = [os.path.join(workers, new, f) for f in os.listdir(os.path.join(workers, new)) if f.endswith(".cubin")]
        text = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", cubin], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        with open(cubin.removesuffix(".cubin") + ".json") as f:
            shared = json.load(f)["shared"]
        with open(cubin.removesuffix(".cubin") + (".ptx" if ptx else ".ttgir")) as f:
            ttgir = f.read()
    finally:
        driver.set_active(before)
    return int(re.search(r"STACK:(\d+)", text).group(1)), shared, ttgir


def test_persistent_loops_flatten_and_pipeline_across_tiles(workers):
    """A persistent kernel loops over its tiles with `tl.range(..., flatten=True)`, so Triton pipelines the next
    tile's loads into this tile's epilogue, except where a runtime branch follows the K loop (the QKV kernel stores
    each output only in the tiles holding it), which Triton 3.6's loop fusion fails on (bench/NOTES.md 139). The
    o-proj kernel (linear + residual add) built for sm90 at 128x256, 3 stages takes shared memory beyond its K loop's
    three stages for the next tile's loads: 180,248 bytes, against 147,480 unflattened and 49,160 with a barrier
    before the epilogue (as there was until the forty-first session; bench/NOTES.md 139, 141), and spills nothing."""
    regions = {tuple(o.name for o in step.kernel.region.body_ops): (step, tensors) for step, tensors in _regions("cpu")}
    qkv = next(step for ops, (step, _) in regions.items() if "dl.rotary" in ops)
    assert "flatten=False" in qkv.kernel.source and "flatten=True" not in qkv.kernel.source
    step, tensors = regions["dl.linear", "dl.add"]  # (o-proj or down: the same kernel)
    # (the one barrier left: split-K's, between a program's partial-sum stores and its count's release)
    assert "flatten=True" in step.kernel.source and step.kernel.source.count("tl.debug_barrier()") == 1
    c = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
         "TMA": 1, "MM": 0, "NORM_PASS": 0, "PERSISTENT": 1, "WS": 0}  # fmt: skip
    stack, shared, _ = _sm90_build(workers, step, tensors, c)
    assert stack == 0 and shared > 3 * (128 + 256) * 64 * 2 + 16384, (stack, shared)


class _SoftmaxOf(torch.nn.Module):
    """A softmax over columns [lo, lo + 8) of each row (a router's softmax over 8 experts, or over a slice)."""

    def __init__(self, lo: int):
        super().__init__()
        self.lo = lo

    def forward(self, x):
        return torch.softmax(x[:, self.lo:self.lo + 8].float(), -1).to(x.dtype)


@pytest.mark.parametrize("width,lo,vectors", [(8, 0, True), (24, 8, True), (16, 3, False)])
def test_rows_of_a_few_elements_load_and_store_whole_vectors(workers, width, lo, vectors):
    """Row kernels tell Triton their rows start at multiples of the largest power of two dividing every row's offset
    (`row.row_alignment`): Triton knows an integer argument only as a multiple of 16 or not, so rows of 8 bf16
    elements were loaded and stored two bytes at a time (1.8x the copy time on an H100, bench/NOTES.md 189). Built for
    sm90: 16-byte loads and stores where every row starts at a multiple of 8 elements; where a slice starts rows at
    odd offsets, two-byte accesses (the hint claims nothing it does not know), and the values are right."""
    model = _SoftmaxOf(lo)
    x = torch.randn(300, width, dtype=torch.bfloat16)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False, tune="none")
    with torch.no_grad():
        out = cm(x)
        assert rel_error(out, model(x.double())) <= tolerance(torch.bfloat16)
        program = cm._spec().executor
        env = program._env([x])
        (step,) = [s for s in program.steps if isinstance(s, RegionStep) and s.kernel is not None]
        ptx = _sm90_build(workers, step, step.inputs(env), step.choice.config, ptx=True)[2]
    accesses = set(re.findall(r"(?:ld|st)\.global[.\w]*", ptx))
    wide = {"ld.global.v4.b32", "st.global.v4.b32"}
    assert (wide <= accesses) == vectors and any(".b16" in a for a in accesses) != vectors, accesses


def test_no_workers_when_switched_off(tmp_path, monkeypatch):
    compile_pool.shutdown()
    monkeypatch.setenv(compile_pool.WORKERS_ENV, "0")
    ran = []
    assert compile_pool.prebuild(lambda: ran.append(1)) == 0
    assert ran == []  # (nothing collected: the warm-ups run once, in this process)


@pytest.mark.gpu
def test_workers_then_launches_on_the_gpu(workers):
    """The same on the GPU, and every config's launch afterwards computes the region's values."""
    for step, tensors in _regions("cuda"):
        fn = step.compiled
        _check_workers_build_what_launches_find(step, tensors, fn, workers)
        refs = step.reference([t.double() if t.is_floating_point() else t for t in tensors])
        for c in _configs(step):
            outs = step.launch(step.private(tensors, every=True), c)
            for o, r in zip(outs, refs, strict=True):
                assert rel_error(o, r) <= tolerance(torch.bfloat16), (step.kernel.name, c)


_SMALL = """@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)
"""


def test_a_worker_that_dies_is_replaced(workers):
    """A worker killed between batches: its next job is answered as failed (that launch compiles in the process)
    and a new worker takes its place, so the batch after builds everything again."""
    from dlblas_compiler.codegen.kernel import compile_source

    fn = compile_source(_SMALL, "add_one", False)
    x = torch.randn(1000)
    before = driver._active
    driver.set_active(compile_pool.Sm90Driver())
    try:
        def warm(blocks):
            return lambda: [_Warmup(fn)[(1,)](x, x.numel(), BLOCK=b) for b in blocks]

        assert compile_pool.prebuild(warm([64, 128])) == 2
        for p in compile_pool._pool._procs:
            p.kill()
            p.wait()
        assert compile_pool.prebuild(warm([256, 512])) == 0  # (both workers found dead, both replaced)
        assert compile_pool.prebuild(warm([256, 512, 1024])) == 3
        assert not compile_pool._pool.broken
    finally:
        driver.set_active(before)


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("clang")), reason="Triton builds launchers with a C compiler")
def test_workers_build_each_kernel_s_launcher_where_its_first_launch_finds_it(workers, monkeypatch):
    """A kernel's launcher (a C module Triton builds at its first launch, ~0.3 s) is built by the worker that
    compiles the kernel, into the cache under the key the launching process computes: there its first launch
    loads it and builds nothing. (On this CPU host a stub stands for the driver library: the launcher links
    against it, and loading it is left out.)"""
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.runtime import build as triton_build

    from dlblas_compiler.codegen.kernel import compile_source

    stub = workers / "stub"
    stub.mkdir()
    (stub / "stub.c").write_text("int dlblas_stub;\n")
    cc = shutil.which("gcc") or shutil.which("clang")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(stub / "libcuda.so.1"), str(stub / "stub.c")], check=True)
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(stub))  # (the workers start with it, at the first batch)
    fn = compile_source(_SMALL, "add_one", False)
    x = torch.randn(1000)
    before = driver._active
    driver.set_active(compile_pool.Sm90Driver())
    try:
        assert compile_pool.prebuild(lambda: [_Warmup(fn)[(1,)](x, x.numel(), BLOCK=b) for b in (64, 128)]) == 2
        built: list = []
        monkeypatch.setattr(triton_build, "_build", lambda *a, **k: built.append(a))
        monkeypatch.setattr(triton_build, "_load_module_from_path", lambda name, path: SimpleNamespace(launch=None))
        for block in (64, 128):
            kernel = _Warmup(fn)[(1,)](x, x.numel(), BLOCK=block)  # (this process's compile: found in the cache)
            CudaLauncher(kernel.src, kernel.metadata)  # what the kernel's first launch builds
        assert built == []
    finally:
        driver.set_active(before)


def test_worker_count_follows_the_cores_and_torchrun(monkeypatch):
    monkeypatch.delenv(compile_pool.WORKERS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert compile_pool._count() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert compile_pool._count() == 4
    monkeypatch.setenv(compile_pool.WORKERS_ENV, "3")
    assert compile_pool._count() == 3


def _tune_with_fake_timings(monkeypatch, regions, together: bool) -> tuple[list, list]:
    """Tune `regions` (compiled for sm90) with `Together` (or one after another) in a small quick mode, every
    candidate "run" by the region's reference and "timed" by a hash of its config: the searches' outcomes do not
    depend on timing noise. The chosen configs, and the compile batches of a lockstep (together)."""
    import zlib

    from dlblas_compiler.runtime import selection
    from dlblas_compiler.tuning import TUNE_MODES, TuneMode, policies, profiler

    monkeypatch.setitem(TUNE_MODES, "small", TuneMode("bayes", fraction=0.0, cap=6, floor=6, patience=None))
    monkeypatch.setattr(policies, "BATCH", 2)  # (three rounds of compiles a search)
    monkeypatch.setattr(selection, "TOGETHER", together)
    last: list = [None]

    def fake_benchmark(fn, arg_sets=None, warmup_ms=0.0, rep_ms=0.0, device=None, settle=True):
        fn()
        return 1e-6 * (1 + zlib.crc32(repr(sorted(last[0].items())).encode()) % 1000)

    monkeypatch.setattr(profiler, "benchmark", fake_benchmark)
    monkeypatch.setattr(selection, "benchmark", fake_benchmark)
    batches: list = []
    real = selection.Lockstep

    class Recorded(real):
        def __init__(self, build):
            super().__init__(build)
            batches.append(self.batches)

    monkeypatch.setattr(selection, "Lockstep", Recorded)
    plan = selection.Together("small", written=set(), progress=False)
    for step, tensors in regions:
        step.interpret, step.compiled = False, step.kernel.compiled(False)
        step.choice.impl = "kernel"

        def launch(tensors, config, step=step):
            last[0] = config
            return step.reference(tensors)

        monkeypatch.setattr(step, "launch", launch)
        assert plan.defer(step, tensors) == together
    plan.tune()
    return [dict(step.choice.config) for step, _ in regions], batches


def test_a_program_s_regions_tune_together_and_choose_as_alone(workers, tmp_path, monkeypatch):
    """`runtime.selection.Together` (a program's first call): the regions' searches run in step, every round's
    compiles of all of them in one batch of the workers, and each search chooses what it chooses alone (the same
    proposals: its policy sees only its own timings). A region whose search another makes takes that choice."""
    from dlblas_compiler.runtime.steps import KernelChoice

    regions = [(step, tensors) for step, tensors in _regions("cpu") if step.kernel.tuning_key[0] == "gemm"][:2]
    assert len(regions) == 2
    before = driver._active
    driver.set_active(compile_pool.Sm90Driver())
    try:
        monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "together"))
        stats = dataclasses.replace(compile_pool.STATS)
        chosen, batches = _tune_with_fake_timings(monkeypatch, regions, together=True)
        assert len(batches) == 1 and len(batches[0]) >= 3 and batches[0][0] >= 4  # (both searches' first rounds)
        assert compile_pool.STATS.failed == stats.failed
        assert compile_pool.STATS.batches - stats.batches == sum(1 for n in batches[0] if n)
        monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "alone"))
        alone, _ = _tune_with_fake_timings(monkeypatch, regions, together=False)
        assert chosen == alone
        # a follower: another region with the same kernel, deferred after its leader
        monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "followers"))
        step, tensors = regions[0]
        twin = dataclasses.replace(step, choice=KernelChoice("twin", step.choice.pattern, impl="kernel"))
        chosen, _ = _tune_with_fake_timings(monkeypatch, [regions[0], (twin, tensors)], together=True)
        assert chosen[1] == chosen[0] and twin.choice.from_cache and twin.choice.impl == step.choice.impl
        # kernels below `SMALL_SHARE` of the call (here all): each default config compiled in one batch, not searched
        from dlblas_compiler.runtime import selection

        monkeypatch.setenv("DLBLAS_CACHE_DIR", str(tmp_path / "small"))
        monkeypatch.setattr(selection, "SMALL_SHARE", 2.0)
        chosen, batches = _tune_with_fake_timings(monkeypatch, regions, together=True)
        assert chosen == [step.kernel.space.default() for step, _ in regions] and len(batches[0]) == 1
        assert all(step.choice.trials == 0 for step, _ in regions)
    finally:
        driver.set_active(before)
