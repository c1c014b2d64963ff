"""Generated kernels against a float64 torch reference, on ragged shapes.

CPU: the same Triton kernels under the interpreter (`interpret` backend), fp32 and fp16 (the interpreter
computes bf16 dots wrongly). GPU (marker `gpu`, run by `GPU_TESTS=1 bench/device.sh` on the device machine, log in `$OUT/gpu-tests.log`):
`triton` backend in fp16 and bf16. Tolerances: relative error ‖out−ref‖/‖ref‖ in float64 below
dlblas_compiler.numerics.REL_TOL (fp32 1e-5, fp16 5e-3, bf16 2e-2). Every run uses fresh random
inputs (never zeros); kernel outputs are freshly allocated, and a failed launch would fall back to the
reference with a warning, which these tests turn into an error.
"""

import copy
import itertools
from collections import Counter
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler.models import BlockConfig, LlamaBlock, RMSNorm, llama_block_inputs, randomize_, rotate_half
from dlblas_compiler.numerics import rel_error, tolerance

CPU = [("interpret", torch.float32), ("interpret", torch.float16)]
GPU = [pytest.param("triton", dt, marks=pytest.mark.gpu) for dt in (torch.float16, torch.bfloat16)]
CASES = CPU + GPU


def _device(backend):
    return "cuda" if backend == "triton" else "cpu"


def _run(model, args, backend, dtype, kwargs=None, expect_regions=None, tol_scale=1.0):
    kwargs = kwargs or {}
    dev = _device(backend)
    model = model.to(device=dev, dtype=dtype).eval()
    args = [a.to(dev) if a.is_floating_point() is False else a.to(device=dev, dtype=dtype) for a in args]
    cm = dc.compile(model, backend=backend, cuda_graphs=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="dlblas_compiler")
        out = cm(*args, **kwargs)
        ref = model.to(torch.float64)(*[a.double() if a.is_floating_point() else a for a in args], **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(outs, refs):
        assert o.dtype == dtype
        err = rel_error(o, r)
        assert err <= tolerance(dtype) * tol_scale, f"relative error {err:.3g} (dtype {dtype})"
    if expect_regions is not None:
        report = cm.report()
        for pattern, count in expect_regions.items():
            assert report.patterns.count(pattern) == count, report
    return cm


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- row template -----------------------------------------------------------------------------------


class AddNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norm = RMSNorm(n, 1e-5)

    def forward(self, x, r):
        s = x + r
        return self.norm(s), s


class Chain(nn.Module):
    def forward(self, x, w, b):
        y = torch.tanh(x * w + b) - 0.5 * F.gelu(x) / (1.0 + x.abs())
        return torch.sigmoid(y) * F.silu(y), y.mean(-1)


class Softmaxes(nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True), torch.softmax(x * 0.5, dim=-1)


class Rotary(nn.Module):
    def __init__(self, rotary_dim=None, interleaved=False):
        super().__init__()
        self.rd, self.inter = rotary_dim, interleaved

    def forward(self, x, cos, sin):
        def rot(t):
            if self.inter:
                return torch.stack((-t[..., 1::2], t[..., ::2]), dim=-1).flatten(-2)
            return rotate_half(t)

        if self.rd is None:
            return x * cos + rot(x) * sin
        xr, xp = x[..., : self.rd], x[..., self.rd :]
        return torch.cat((xr * cos + rot(xr) * sin, xp), dim=-1)


@pytest.mark.parametrize("backend,dtype", CASES)
def test_row_add_rmsnorm_ragged(backend, dtype):
    _run(randomize_(AddNorm(200)), [_x(3, 7, 200), _x(3, 7, 200, seed=1)], backend, dtype, expect_regions={"row": 1})


@pytest.mark.parametrize("backend,dtype", CASES)
def test_row_elementwise_chain_and_reduction(backend, dtype):
    _run(Chain(), [_x(5, 37), _x(37, seed=1), _x(5, 1, seed=2)], backend, dtype, expect_regions={"row": 1})


class Narrow(nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * y) + y, torch.exp(y * 0.5)


@pytest.mark.parametrize("backend,dtype", CASES)
def test_row_kernels_of_narrow_rows_take_many_rows_per_program(backend, dtype):
    """Rows of 3 and of 1 element over 3001 rows (not a multiple of any block): a program takes about 2048
    elements by default, not 16 rows (a last dim of one had been a program per 16 elements), and the last, ragged
    block is masked."""
    cm = _run(Narrow(), [_x(3001, 3), _x(3001, 1, seed=1)], backend, dtype)
    blocks = sorted(k.config["BLOCK_M"] for k in cm.report().kernels if k.pattern == "row")
    assert blocks and all(b >= 512 for b in blocks), blocks


@pytest.mark.parametrize("backend,dtype", CASES)
def test_row_softmax_both_spellings(backend, dtype):
    """The spelled softmax is raised to dl.softmax (fp32 inside, rounded once) only where eager computes it in
    fp32: in fp16 eager rounds each step, so it stays as written (one row kernel all the same)."""
    cm = _run(Softmaxes(), [_x(6, 3, 45) * 3], backend, dtype)
    assert cm.ir("after:recognize").count("dl.softmax") == (2 if dtype == torch.float32 else 1)


@pytest.mark.parametrize("backend,dtype", CASES)
@pytest.mark.parametrize("rd,inter", [(None, False), (8, False), (None, True)])
def test_row_rotary_layouts(backend, dtype, rd, inter):
    b, h, s, d = 2, 3, 5, 16
    ang = _x(s, (rd or d) // 2, seed=3)
    rep = (lambda t: t.repeat_interleave(2, -1)) if inter else (lambda t: torch.cat([t, t], -1))
    cm = _run(Rotary(rd, inter), [_x(b, h, s, d), rep(ang.cos()), rep(ang.sin())], backend, dtype)
    assert "dl.rotary" in cm.ir("after:recognize")


class HeadNormRotary(nn.Module):
    """Per-head RMSNorm over [B, S, H, D], heads to [B, H, S, D], then rotary: Qwen3's q/k after their projection."""

    def __init__(self, d, rotary_dim=None, interleaved=False):
        super().__init__()
        self.norm, self.rot = nn.RMSNorm(d, eps=1e-6), Rotary(rotary_dim, interleaved)

    def forward(self, x, cos, sin):
        return self.rot(self.norm(x).transpose(1, 2), cos, sin)


@pytest.mark.parametrize("backend,dtype", CASES)
@pytest.mark.parametrize("rd,inter", [(None, False), (8, False), (None, True), (8, True)])
def test_row_rotary_of_a_norm_one_kernel(backend, dtype, rd, inter):
    """The rotary of a value the kernel computed (its partners are not in memory: rotated in registers) in the same
    row kernel as the per-head norm before it; the transpose between them goes before the norm (algebraic)."""
    b, s, h, d = 2, 5, 3, 16
    ang = _x(s, (rd or d) // 2, seed=3)
    rep = (lambda t: t.repeat_interleave(2, -1)) if inter else (lambda t: torch.cat([t, t], -1))
    cm = _run(randomize_(HeadNormRotary(d, rd, inter)), [_x(b, s, h, d), rep(ang.cos()), rep(ang.sin())], backend,
              dtype, expect_regions={"row": 1})  # fmt: skip
    ir = cm.ir("after:fuse")
    assert "dl.rms_norm" in ir and "dl.rotary" in ir and ir.index("dl.permute") < ir.index("dl.rms_norm")


def test_row_rotary_of_a_computed_value_needs_whole_groups():
    """A row of no power of two columns cannot be reshaped into rotation pairs: the norm and the rotary then run
    as two kernels, each right."""
    b, s, h, d = 1, 3, 2, 24
    ang = _x(s, d // 2, seed=3)
    cm = _run(randomize_(HeadNormRotary(d)), [_x(b, s, h, d), torch.cat([ang.cos()] * 2, -1),
                                               torch.cat([ang.sin()] * 2, -1)], "interpret", torch.float32)  # fmt: skip
    assert Counter(cm.report().patterns)["row"] == 2


class Cats(nn.Module):
    """Concatenations along the last dim as layers build them: a head's columns from two producers, one of them
    shared by every head (MLA's rotary key, a broadcast of stride 0), a part used twice, widths of no power of
    two, a cat whose result is computed on (x 2), one along another dim (not a row op: torch runs it), and a part
    read through a reshape of a permutation (even/odd pairs taken apart, as DeepSeek-V3's rotary leaves q)."""

    def forward(self, kv, rot, a, b):
        heads = kv.shape[2]
        k = kv.transpose(1, 2)[..., :24]  # [B, H, S, 24] of [B, S, H, 40]: strided
        key = torch.cat((k, rot.expand(-1, heads, -1, -1)), dim=-1)  # rot [B, 1, S, 8]
        three = torch.cat((a, b, a), dim=-1) * 2.0
        other = torch.cat((a, a), dim=1)
        pairs = b.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)  # pairs taken apart: no strides express it
        return key, three, other, torch.cat((a, pairs), dim=-1), pairs * 3.0


@pytest.mark.parametrize("backend,dtype", CASES)
def test_row_cat_along_the_last_dim(backend, dtype):
    args = [_x(2, 7, 3, 40), _x(2, 1, 7, 8, seed=1), _x(2, 5, 12, seed=2), _x(2, 5, 36, seed=3)]
    cm = _run(Cats(), args, backend, dtype)
    regions = cm.report().regions
    cats = [r for r in regions if "dl.cat" in r.ops]
    assert len(cats) == 3 and all(r.pattern == "row" for r in cats), regions
    assert ["dl.cat", "dl.mul"] in [[o for o in r.ops if o in ("dl.cat", "dl.mul")] for r in cats]
    assert cm.report().unfused == {"dl.cat": 1}  # the cat along dim 1; the pairs' views are read as index maps
    # moving values: bit-equal to torch of the same inputs (x 2 and x 3 are exact but for an overflow)
    dev = _device(backend)
    xs = [a.to(device=dev, dtype=dtype) for a in args]
    with torch.no_grad():
        got, want = cm(*xs), Cats()(*xs)
    for i in (0, 1, 3, 4):
        assert torch.equal(got[i], want[i]), i


def test_row_cat_reason_for_a_cat_it_does_not_take():
    """A cat along another dim is left to torch, and the report says why."""
    cm = dc.compile(Cats(), backend="interpret")
    with torch.no_grad():
        cm(_x(2, 7, 3, 40), _x(2, 1, 7, 8, seed=1), _x(2, 5, 12, seed=2), _x(2, 5, 36, seed=3))
    notes = [n for n in cm.report().notes if n.startswith("not fused: dl.cat")]
    assert len(notes) == 1 and "not the last dim of the row space" in notes[0], notes


# -- gemm template ----------------------------------------------------------------------------------


class LinearEpilogue(nn.Module):
    def __init__(self, k, n, bias):
        super().__init__()
        self.lin = nn.Linear(k, n, bias=bias)

    def forward(self, x, res):
        return res + F.gelu(self.lin(x), approximate="tanh") * 2.0


@pytest.mark.parametrize("backend,dtype", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_bias_activation_residual_ragged(backend, dtype, bias):
    _run(randomize_(LinearEpilogue(70, 45, bias)), [_x(2, 9, 70), _x(2, 9, 45, seed=1)], backend, dtype,
         expect_regions={"gemm": 1})  # fmt: skip


def test_same_kernel_in_two_layers_shares_one_tuning_entry_and_one_compiled_function():
    """Identical regions (every layer of a model) compile to kernels of different names that the tuning
    cache files under one key, so a model's layers are tuned once; a different shape gets its own kernel."""
    from dlblas_compiler.runtime.program import RegionStep

    model = nn.Sequential(LinearEpilogueOne(32, 32), LinearEpilogueOne(32, 32), LinearEpilogueOne(32, 48)).eval()
    cm = dc.compile(randomize_(model), backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(_x(5, 32))
    steps = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.kernel is not None]
    ks = [s.kernel for s in steps]
    assert len(ks) == 3 and len({k.name for k in ks}) == 3
    assert ks[0].tuning_key == ks[1].tuning_key != ks[2].tuning_key and ks[0].tuning_key[0] == "gemm"
    # ... and run one jitted function, which Triton compiles once per config for both layers
    assert steps[0].compiled is steps[1].compiled is not steps[2].compiled
    assert steps[0].compiled.__name__ == ks[0].shared_name == ks[1].shared_name != ks[2].shared_name


@pytest.mark.gpu
def test_tuning_batch_compiles_in_parallel_then_launches_find_it_built():
    """`compile_configs` builds a batch of candidate configs in threads (Triton's AsyncCompileMode); each launch
    afterwards finds its binary in the jitted function's cache and computes the right values."""
    from dlblas_compiler.codegen.kernel import compile_configs
    from dlblas_compiler.runtime.program import RegionStep

    model = randomize_(nn.Sequential(LinearEpilogueOne(256, 384))).cuda().half().eval()
    cm = dc.compile(model, backend="triton", cuda_graphs=False)
    x = _x(37, 256).cuda().half()
    with torch.no_grad():
        cm(x)
    program = cm._spec().executor
    (step,) = [s for s in program.steps if isinstance(s, RegionStep) and s.kernel is not None]
    env = program._env([x])
    for s in program.steps:  # (the value table as the region sees it)
        s(env)
    tensors = step.inputs(env)
    configs = list(step.kernel.space.configs())[:6]
    fn = step.compiled
    cache = fn.device_caches[torch.cuda.current_device()][0]
    before = len(cache)
    compile_configs(step.kernel, fn, tensors, configs)
    assert len(cache) >= before + len(configs) - 1  # (the default config may already be built)
    built = len(cache)
    ref = copy.deepcopy(model).double()(x.double())
    for c in configs:
        (out,) = step.launch(tensors, c)
        assert rel_error(out.reshape(ref.shape), ref) < tolerance(torch.float16)
    assert len(cache) == built, "a launch compiled again"


class LinearEpilogueOne(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.lin = nn.Linear(k, n)

    def forward(self, x):
        return F.gelu(self.lin(x))


class NormGLU(nn.Module):
    def __init__(self, h, i, act):
        super().__init__()
        self.norm = RMSNorm(h, 1e-6)
        self.gate = nn.Linear(h, i, bias=False)
        self.up = nn.Linear(h, i, bias=False)
        self.act = act

    def forward(self, x):
        h = self.norm(x)
        return self.act(self.gate(h)) * self.up(h)


@pytest.mark.parametrize("backend,dtype", CASES)
@pytest.mark.parametrize("act", [F.silu, F.gelu])
def test_gemm_norm_prologue_dual_glu(backend, dtype, act):
    cm = _run(randomize_(NormGLU(48, 72, act)), [_x(11, 48)], backend, dtype, expect_regions={"gemm": 1})
    final = cm.ir()
    assert "dl.rms_norm" in final and "dl.glu" in final and final.count("dl.linear") == 1


class UpFirstGLU(nn.Module):
    """The up projection computed (and so concatenated) before the gate, both with a bias: the dual GEMM's first
    stream is the up projection."""

    def __init__(self, h, i):
        super().__init__()
        self.up = nn.Linear(h, i)
        self.gate = nn.Linear(h, i)

    def forward(self, x):
        u = self.up(x)
        return F.gelu(self.gate(x), approximate="tanh") * u


def test_dual_gemm_one_accumulator_over_both_streams():
    """The dual GEMM's tiled K loop reads both streams' weight rows in turn into one [2 * BLOCK_N, BLOCK_K] tile
    and one accumulator (TMA: a 3-D descriptor over the weight as it is), split after the loop: right whichever
    stream comes first in the weight, with a bias, for tiles by pointer and by TMA, split-K, persistent programs and
    ragged column tiles (N = 40 is no multiple of BLOCK_N), against the float64 reference."""
    from dlblas_compiler.runtime.program import RegionStep

    model = randomize_(UpFirstGLU(64, 40)).eval()
    x = _x(37, 64)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(x)
        prog = cm._spec().executor
        step = next(s for s in prog.steps if isinstance(s, RegionStep) and s.choice.pattern == "gemm")
        tensors = step.inputs(prog._env([x]))
        ref = model.double()(x.double())
        src = step.kernel.source
        assert "acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)" in src
        assert "acc0, acc1 = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))" in src
        checked = 0
        for bm, bn, sk, tma, pers in [(16, 16, 1, 0, 0), (16, 32, 2, 0, 0), (32, 16, 1, 1, 0), (16, 32, 1, 1, 1),
                                      (16, 16, 4, 1, 0), (32, 32, 1, 0, 1)]:  # fmt: skip
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 16 if sk > 1 else 32, "SPLIT_K": sk, "GROUP_M": 1,
                   "num_warps": 4, "num_stages": 2, "TMA": tma, "MM": 0, "NORM_PASS": 0, "PERSISTENT": pers, "WS": 0}  # fmt: skip
            (out,) = step.launch(tensors, cfg)
            assert rel_error(out, ref) <= tolerance(torch.float32), cfg
            checked += 1
        assert checked == 6


class NormLinearGelu(nn.Module):
    """LayerNorm → Linear(bias) → GELU, the LayerNorm's weight and bias random (not 1 and 0)."""

    def __init__(self, h, n):
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc = nn.Linear(h, n)
        with torch.no_grad():
            self.ln.weight.normal_(1.0, 0.5)
            self.ln.bias.normal_(0.0, 0.5)

    def forward(self, x):
        return F.gelu(self.fc(self.ln(x)))


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_layer_norm_prologue_of_a_few_rows_in_the_k_loop(rows, dtype):
    """A LayerNorm before a linear is the GEMM's prologue (the built-in pattern takes it); up to 16 rows each
    program computes its rows' statistics and normalizes the A tiles it loads (no row pass: `NORM_PASS` 0), one-row
    and tensor-core tiles, split-K, a partial last K step (K = 80), each config as close to the float64 reference
    as eager is, and the same as the config with the pass within rounding."""
    from dlblas_compiler.runtime.program import RegionStep

    model = NormLinearGelu(80, 48).eval()
    x = _x(rows, 80) * 3 + 0.5  # (a mean well away from 0)
    cm = dc.compile(model.to(dtype), backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(x.to(dtype))
        prog = cm._spec().executor
        (step,) = [s for s in prog.steps if isinstance(s, RegionStep)]
        assert step.choice.pattern == "gemm" and "dl.layer_norm" in step.kernel.region_ir
        assert step.choice.config["NORM_PASS"] == 0
        tensors = step.inputs(prog._env([x.to(dtype)]))
        ref = copy.deepcopy(model).double()(x.double())  # (a copy: the compiled program reads the model's weights)
        eager = rel_error(model(x.to(dtype)), ref)
        configs = [(16, 16, 32, 1, 0), (16, 32, 16, 2, 0), (32, 16, 64, 1, 0), (16, 16, 32, 1, 1)]  # (persistent last)
        configs += [(1, 16, 32, 1, 0), (1, 32, 16, 4, 0)] if rows <= 4 else []  # (one-row tiles for a few rows)
        for bm, bn, bk, sk, pers in configs:
            outs = []
            for normed in (0, 1):
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk, "GROUP_M": 1, "num_warps": 4,
                       "num_stages": 2, "TMA": 0, "MM": 0, "NORM_PASS": normed, "PERSISTENT": pers, "WS": 0}  # fmt: skip
                (out,) = step.launch(tensors, cfg)
                assert rel_error(out, ref) <= 1.05 * eager + tolerance(torch.float32), cfg
                outs.append(out.float())
            torch.testing.assert_close(outs[0], outs[1], rtol=tolerance(dtype), atol=tolerance(dtype))


class NormLinear(nn.Module):
    """RMSNorm (random gain) → Linear, no bias."""

    def __init__(self, h, n):
        super().__init__()
        self.norm = RMSNorm(h, 1e-6)
        self.fc = nn.Linear(h, n, bias=False)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.5)

    def forward(self, x):
        return self.fc(self.norm(x))


@pytest.mark.parametrize("k", [80, 8200])  # 8200: the statistics pass's 8192-wide row blocks loop twice, one partial
def test_gemm_rms_norm_statistics_pass_or_row_pass(k):
    """Above 16 rows an RMSNorm before a linear is a pass over x: the normalized rows (NORM_PASS 1), or each row's
    statistics alone, which the epilogue applies while the K loop scales the A tiles by the gain (NORM_PASS 0, tiles
    under 64 rows). The statistics pass reads whole rows of up to 8192 columns (bench/NOTES.md 178), here also rows
    wider than that. Each within eager's distance of float64, and the two passes equal within rounding."""
    from dlblas_compiler.runtime.program import RegionStep

    model = NormLinear(k, 16).eval()
    x = _x(20, k) * 2 + 0.3
    cm = dc.compile(model, backend="interpret", cuda_graphs=False, tune="none")
    with torch.no_grad():
        cm(x)
        prog = cm._spec().executor
        (step,) = [s for s in prog.steps if isinstance(s, RegionStep)]
        assert step.choice.pattern == "gemm" and "dl.rms_norm" in step.kernel.region_ir
        tensors = step.inputs(prog._env([x]))
        ref = copy.deepcopy(model).double()(x.double())
        eager = rel_error(model(x), ref)
        outs = []
        for normed in (0, 1):
            cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 1, "num_warps": 4,
                   "num_stages": 2, "TMA": 0, "MM": 0, "NORM_PASS": normed, "PERSISTENT": 0, "WS": 0}  # fmt: skip
            assert step.kernel.space.is_valid(cfg), step.kernel.space.violations(cfg)
            (out,) = step.launch(tensors, cfg)
            assert rel_error(out, ref) <= 1.05 * eager + tolerance(torch.float32), cfg
            outs.append(out)
        torch.testing.assert_close(outs[0], outs[1], rtol=tolerance(torch.float32), atol=tolerance(torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 40])
def test_layer_norm_gemm_space_samples_are_right_and_repeatable(tokens):
    """As `test_gemm_space_samples_are_right_and_repeatable`, for a LayerNorm → Linear(bias) → GELU region in bf16:
    configs drawn from its space (up to 16 rows the K loop normalizes the A tiles itself, NOTES 150; above, a row
    pass), each launched three times, within tolerance of float64 and equal bit for bit."""
    import random

    from dlblas_compiler.codegen.kernel import compile_configs
    from dlblas_compiler.runtime.program import RegionStep

    model = NormLinearGelu(512, 1536).eval()
    x = _x(tokens, 512, seed=tokens).cuda() * 2 + 0.5
    cm = dc.compile(model.cuda().to(torch.bfloat16), backend="triton", tune="none", cuda_graphs=False)
    rng, checked, in_loop = random.Random(tokens), 0, 0
    with torch.no_grad():
        cm(x.bfloat16())
        prog = cm._spec().executor
        (step,) = [s for s in prog.steps if isinstance(s, RegionStep)]
        tensors = step.inputs(prog._env([x.bfloat16()]))
        ref = copy.deepcopy(model).double()(x.double())  # (a copy: the compiled program reads the model's own weights)
        space, seen = step.kernel.space, set()
        configs = [c for c in (space.sample(rng, seen) for _ in range(16)) if c is not None and not seen.add(space.key(c))]
        compile_configs(step.kernel, step.compiled, tensors, configs)
        for c in configs:
            runs = [step.launch(tensors, c)[0] for _ in range(3)]
            assert rel_error(runs[0], ref) <= tolerance(torch.bfloat16), c
            assert all(torch.equal(r, runs[0]) for r in runs[1:]), ("runs differ", c)
            checked += 1
            in_loop += not c["NORM_PASS"]
    assert checked >= 8 and (in_loop > 0) == (tokens <= 16)


def test_gemm_layer_norm_above_sixteen_rows_or_through_tma_is_a_row_pass():
    """The K loop normalizes A tiles itself only for a few rows loaded by pointer; otherwise the space keeps the
    LayerNorm as a row pass (the A tile scaled in registers inside a pipelined TMA loop raced, NOTES 59)."""
    from dlblas_compiler.runtime.program import RegionStep

    for rows in (5, 40):
        cm = dc.compile(NormLinearGelu(64, 32).eval(), backend="interpret", cuda_graphs=False)
        with torch.no_grad():
            cm(_x(rows, 64))
        (step,) = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep)]
        base = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 1, "num_warps": 4,
                "num_stages": 2, "TMA": 0, "MM": 0, "PERSISTENT": 0, "WS": 0}  # fmt: skip
        assert step.kernel.space.is_valid({**base, "NORM_PASS": 0}) == (rows <= 16)
        assert step.kernel.space.is_valid({**base, "NORM_PASS": 1})
        assert not step.kernel.space.is_valid({**base, "NORM_PASS": 0, "TMA": 1})


@pytest.mark.parametrize("k", [128, 160])  # 160: the last K step is partial for BLOCK_K * SPLIT_K = 64 / 128
def test_gemm_configs_split_k_and_ragged_tiles(k):
    """Several tile configs of one norm+dual-GEMM region (rows and columns past the end wrap in the loads,
    K loads unmasked when K divides into BLOCK_K * SPLIT_K), each against the float64 reference."""
    from dlblas_compiler.runtime.program import RegionStep

    model = randomize_(NormGLU(k, 40, F.silu)).eval()
    x = _x(19, k)
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(x)
        prog = cm._spec().executor
        env = prog._env([x])
        step = next(s for s in prog.steps if isinstance(s, RegionStep) and s.choice.pattern == "gemm")
        tensors = step.inputs(env)
        ref = model.double()(x.double())
        configs = [(16, 16, 32, 1, 0), (32, 32, 64, 2, 0), (16, 32, 32, 4, 0), (64, 16, 64, 2, 0), (16, 32, 64, 2, 1)]
        for (bm, bn, bk, sk, tma), normed in itertools.product(configs, (0, 1)):  # TMA: the partial last K step is zero-filled
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk, "GROUP_M": 1, "num_warps": 4, "num_stages": 2,
                   "TMA": tma, "MM": 0, "NORM_PASS": normed, "PERSISTENT": 0, "WS": 0}  # NORM_PASS: the norm as a row pass before the K loop
            (out,) = step.launch(tensors, cfg)
            assert rel_error(out, ref) <= tolerance(torch.float32), cfg


def _launch_valid(step, tensors: list, refs: list, configs: list[dict], dtype=torch.float32) -> list[dict]:
    """Launch each config the region's space accepts and compare every output with its reference; returns
    the configs checked."""
    checked = []
    for c in configs:
        if step.kernel.space.is_valid(c):
            for o, r in zip(step.launch(step.private(tensors, every=True), c), refs):
                assert rel_error(o, r) <= tolerance(dtype), (step.choice.region, c)
            checked.append(c)
    return checked


def _gemm_regions(cfg: BlockConfig, tokens: int, dtype=None):
    """(step, inputs, references) for each GEMM region of a Llama block compiled for the interpreter (on the GPU
    in `dtype`), the references computed in float64 on the GPU; the program steps along between regions."""
    from dlblas_compiler.runtime.program import RegionStep

    gpu = dtype is not None
    x, cos, sin = llama_block_inputs(cfg, 1, tokens, dtype or torch.float32, "cuda" if gpu else "cpu")
    model = randomize_(LlamaBlock(cfg)).eval()
    model = model.to("cuda", dtype) if gpu else model
    cm = dc.compile(model, backend="triton" if gpu else "interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(x, cos, sin)
        prog = cm._spec().executor
        env = prog._env([x, cos, sin])
        for step in prog.steps:
            if isinstance(step, RegionStep) and step.choice.pattern == "gemm":
                tensors = step.inputs(env)
                yield step, tensors, step.reference([t.double() if gpu and t.is_floating_point() else t for t in tensors])
            step(env)


def _check_gemm_regions(cfg: BlockConfig, tokens: int, configs: list[dict], dtype=None) -> list[tuple]:
    """Launch each valid config on every GEMM region of a Llama block (interpreter; on the GPU in `dtype`) and
    compare with the region's reference (computed in float64); returns (region, config, K) for each config
    checked."""
    checked = []
    with torch.no_grad():
        for step, tensors, refs in _gemm_regions(cfg, tokens, dtype):
            for c in _launch_valid(step, tensors, refs, configs, dtype or torch.float32):
                checked.append((step.kernel.region_ir, c, step.kernel.shape_key["K"]))
    return checked


@pytest.mark.parametrize("tokens", [1, 19])
def test_gemm_tma_and_pointer_configs(tokens):
    """Every GEMM region of a Llama block (norm+QKV+RoPE, o-proj+residual, norm+gate/up+SiLU,
    down+residual) under tiles loaded by pointer and through TMA descriptors, split-K included (with
    1 token the norm statistics come from the GEMM itself), against the region's reference."""
    cfg = BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)  # K long enough to split
    configs = [{"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": tma, "MM": 0, "NORM_PASS": p, "PERSISTENT": 0, "WS": 0}
               for bn, bk, sk in [(32, 32, 4), (64, 64, 1), (128, 32, 2)] for tma in (0, 1) for p in (0, 1)]  # fmt: skip
    checked = _check_gemm_regions(cfg, tokens, configs)
    assert len({r for r, _, _ in checked}) == 4, checked
    assert {(c["SPLIT_K"] > 1, c["TMA"]) for _, c, _ in checked} == {(a, b) for a in (False, True) for b in (0, 1)}
    assert {c["NORM_PASS"] for r, c, _ in checked if "dl.rms_norm" in r} == {0, 1}


def test_gemm_persistent_configs(monkeypatch):
    """One program per SM looping over the tiles (PERSISTENT, tiles by pointer, through TMA, after cuBLAS): with
    2 SMs each program runs several tiles of every GEMM region of a Llama block (norm+QKV+RoPE, o-proj+residual,
    norm+gate/up+SiLU, down+residual), ragged tiles included, against the region's reference."""
    from dlblas_compiler.codegen import device

    monkeypatch.setattr(device, "sm_count", lambda: 2)
    cfg = BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)
    configs = [{"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": 32 if mm else 64, "SPLIT_K": 1, "GROUP_M": g, "num_warps": 4,
                "num_stages": 2, "TMA": tma, "MM": mm, "NORM_PASS": mm, "PERSISTENT": 1, "WS": 0}
               for bn, g in [(64, 1), (128, 8)] for tma in (0, 1) for mm in (0, 1) if not (mm and tma)]  # fmt: skip
    checked = _check_gemm_regions(cfg, 19, configs)
    assert len({r for r, _, _ in checked}) == 4, checked
    assert {(c["TMA"], c["MM"]) for _, c, _ in checked} == {(0, 0), (1, 0), (0, 1)}


def test_gemm_persistent_split_last_wave(monkeypatch):
    """A persistent kernel with SPLIT_K > 1 splits over K only the tiles of its last wave (each program's whole
    tiles first, then at most one part of a tail tile, the parts summed by the tile's last program before the
    epilogue): every GEMM region of a Llama block (norm+QKV+RoPE with the norm weight in the K loop or a norm pass,
    o-proj+residual, the dual gate/up, down+residual), ragged row tiles, pointer and TMA loads, K that the parts
    split evenly or not, with SM counts that leave one to three tiles in the last wave, against the region's
    reference. The launches are checked to have split (the launch's `whole_tiles` below the tile count). Then the
    same configs at another length (a shape family reuses its config): a last wave that the split parts would
    overfill, or none, runs every tile whole, still right."""
    from dlblas_compiler.codegen import device
    from dlblas_compiler.codegen.gemm import launch

    plans = []
    whole_tiles = launch.whole_tiles
    monkeypatch.setattr(launch, "whole_tiles", lambda t, p, s: plans.append((t, r := whole_tiles(t, p, s))) or r)
    configs = [{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "SPLIT_K": sk, "GROUP_M": g, "num_warps": 4,
                "num_stages": 2, "TMA": tma, "MM": 0, "NORM_PASS": p, "PERSISTENT": 1, "WS": 0}
               for sk in (2, 4) for g, tma, p in [(1, 0, 0), (8, 1, 1), (8, 0, 1)]]  # fmt: skip
    checked = []
    for cfg in (BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64),
                BlockConfig(hidden=288, intermediate=576, heads=4, kv_heads=2, head_dim=64)):  # (K 288, 576: uneven)
        for sms in (5, 7):  # (16 QKV or gate/up tiles, 8 o-proj or down tiles: last waves of 1-3 tiles)
            monkeypatch.setattr(device, "sm_count", lambda sms=sms: sms)
            checked += [(cfg.hidden, *c) for c in _check_gemm_regions(cfg, 19, configs)]
    assert len({r for h, r, _, _ in checked if h == 256}) == 4, checked
    assert {c["SPLIT_K"] for _, _, c, _ in checked} == {2, 4}
    assert {c["TMA"] for _, r, c, _ in checked if "dl.rotary" in r} == {0, 1}
    assert any(k % (c["BLOCK_K"] * c["SPLIT_K"]) for _, _, c, k in checked)  # (a part's last K step partial)
    assert sum(d < t for t, d in plans) >= len(checked), plans  # (every check's launch split its last wave)
    # the 256-wide block's configs valid at 19 tokens, launched at 40 and 64 (the QKV's 24 or 32 tiles on 7 SMs)
    monkeypatch.setattr(device, "sm_count", lambda: 7)
    cfg = BlockConfig(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64)
    tuned = [c for h, _, c, _ in checked if h == 256]
    for tokens in (40, 64):
        plans.clear()
        with torch.no_grad():
            for step, tensors, refs in _gemm_regions(cfg, tokens):
                for c in tuned:
                    for o, r in zip(step.launch(step.private(tensors, every=True), c), refs):
                        assert rel_error(o, r) <= tolerance(torch.float32), (tokens, step.choice.region, c)
        assert any(d == t for t, d in plans) and (tokens == 64 or any(d < t for t, d in plans)), plans


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_persistent_configs_on_the_gpu(dtype):
    """The persistent loop on the GPU: every GEMM region of a Llama block at 2100 tokens (more tiles than an H100
    has SMs), tensor-core tiles through TMA and by pointer, against float64. The norm is a row pass: a norm weight
    scaling A in the K loop of a wgmma tile (64 rows or more on sm90) is outside the space (bench/NOTES.md 167)."""
    cfg = BlockConfig(hidden=512, intermediate=1024, heads=8, kv_heads=2, head_dim=64)
    tiles = [(64, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 3), (128, 128, 8, 4)]
    configs = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": w, "num_stages": s,
                "TMA": tma, "MM": 0, "NORM_PASS": p, "PERSISTENT": 1, "WS": 0}
               for bm, bn, w, s in tiles for tma in (0, 1) for p in (0, 1)]  # fmt: skip
    checked = _check_gemm_regions(cfg, 2100, configs, dtype)
    assert len({r for r, _, _ in checked}) == 4, checked
    assert {(c["TMA"], c["NORM_PASS"]) for r, c, _ in checked if "dl.rms_norm" in r} == {(0, 1), (1, 1)}


@pytest.mark.gpu
def test_gemm_persistent_split_last_wave_on_the_gpu(monkeypatch):
    """The persistent kernel's last wave split over K on the GPU (bf16, 2100 tokens; the SM count the launch
    plans for set so the last waves hold different numbers of tiles): every GEMM region of a Llama block, pointer
    and TMA loads, norm weight in the K loop or a norm pass, against float64."""
    from dlblas_compiler.codegen import device

    cfg = BlockConfig(hidden=512, intermediate=1024, heads=8, kv_heads=2, head_dim=64)
    tiles = [(64, 128, 4, 3), (128, 128, 8, 3), (128, 256, 8, 3)]
    configs = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "SPLIT_K": sk, "GROUP_M": 8, "num_warps": w,
                "num_stages": s, "TMA": tma, "MM": 0, "NORM_PASS": p, "PERSISTENT": 1, "WS": 0}
               for bm, bn, w, s in tiles for sk in (2, 4) for tma in (0, 1) for p in (0, 1)]  # fmt: skip
    checked = []
    for sms in (23, 40, 97):
        monkeypatch.setattr(device, "sm_count", lambda sms=sms: sms)
        checked += _check_gemm_regions(cfg, 2100, configs, torch.bfloat16)
    assert len({r for r, _, _ in checked}) == 4, checked
    assert {c["SPLIT_K"] for _, c, _ in checked} == {2, 4}


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 96])
@pytest.mark.parametrize("tokens", [1, 300, 2100])
def test_gemm_space_samples_are_right_and_repeatable(tokens, head_dim):
    """Configs drawn at random from each GEMM region's search space (what quick tuning may pick) on a Llama
    block in bf16: each launched three times, every output within tolerance of float64 and the three runs equal
    bit for bit — a config family that races (two were found this way on the H100, NOTES 59) fails here. Heads of
    96 columns (Phi-3-mini's) rotate in the QKV GEMM in tiles of part of a head or over cuBLAS's product (NOTES
    105: built in the thirty-first session and not yet run on a GPU)."""
    import random

    from dlblas_compiler.codegen.kernel import compile_configs

    cfg = BlockConfig(hidden=8 * head_dim, intermediate=1024, heads=8, kv_heads=2, head_dim=head_dim)
    rng, checked, rotated = random.Random(tokens), 0, False
    with torch.no_grad():
        for step, tensors, refs in _gemm_regions(cfg, tokens, torch.bfloat16):
            rotated |= step.kernel.region_ir.count("dl.rotary") == 2
            space, seen = step.kernel.space, set()
            configs = [c for c in (space.sample(rng, seen) for _ in range(12)) if c is not None and not seen.add(space.key(c))]
            compile_configs(step.kernel, step.compiled, tensors, configs)
            for c in configs:
                runs = [step.launch(step.private(tensors, every=True), c) for _ in range(3)]
                for outs in runs:
                    for o, r in zip(outs, refs):
                        assert rel_error(o, r) <= tolerance(torch.bfloat16), (step.choice.region, c)
                for outs in runs[1:]:
                    assert all(torch.equal(a, b) for a, b in zip(outs, runs[0])), ("runs differ", step.choice.region, c)
                checked += 1
    assert checked >= 40 and rotated


@pytest.mark.parametrize("tokens", [2, 19])
def test_gemm_cublas_product_with_generated_epilogue(tokens):
    """MM=1: cuBLAS (torch.matmul) computes x @ W^T and the generated kernel runs the rest of the region on it
    (the norm's row scaling, rotary on the q/k heads, [B, H, S, D] stores, the dual GEMM's SiLU * up, residual
    adds) on every GEMM region of a Llama block, tiles narrower than a head included, against the reference."""
    cfg = BlockConfig(hidden=256, intermediate=320, heads=4, kv_heads=2, head_dim=64)
    configs = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": g, "num_warps": 4,
                "num_stages": 2, "TMA": 0, "MM": 1, "NORM_PASS": p, "PERSISTENT": 0, "WS": 0} for bm, bn, g in [(16, 64, 1), (16, 32, 1), (32, 128, 8)] for p in (0, 1)]  # fmt: skip
    checked = _check_gemm_regions(cfg, tokens, configs)
    assert len({r for r, _, _ in checked}) == 4, checked
    assert any(c["BLOCK_N"] < 64 and "dl.rotary" in r for r, c, _ in checked)


class BiasQKRotary(nn.Module):
    """q/k projections with bias (Qwen2), split into heads, rotated (any layout of `Rotary`)."""

    def __init__(self, k, heads, d, rd, inter):
        super().__init__()
        self.heads, self.d = heads, d
        self.qk = nn.Linear(k, 2 * heads * d, bias=True)
        self.rot = Rotary(rd, inter)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k = self.qk(x).split(self.heads * self.d, dim=-1)
        q, k = (t.view(b, s, self.heads, self.d).transpose(1, 2) for t in (q, k))
        return self.rot(q, cos, sin), self.rot(k, cos, sin)


@pytest.mark.parametrize("rd,inter", [(None, False), (8, False), (None, True)])
def test_gemm_rotary_partners_read_from_the_product(rd, inter):
    """MM configs rotate by reading each column's partner back from the cuBLAS product (bias added), for any
    tile width (narrower and wider than a head, not a multiple of it), in every rotary layout; K-loop configs
    rotate in registers. Each against the region's reference."""
    from dlblas_compiler.runtime.program import RegionStep

    d, s = 16, 7
    model = randomize_(BiasQKRotary(32, 3, d, rd, inter)).eval()
    ang = _x(s, (rd or d) // 2, seed=3)
    rep = (lambda t: t.repeat_interleave(2, -1)) if inter else (lambda t: torch.cat([t, t], -1))
    args = [_x(1, s, 32), rep(ang.cos()), rep(ang.sin())]
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    base = {"BLOCK_M": 16, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": 0, "NORM_PASS": 0, "PERSISTENT": 0, "WS": 0}
    configs = [{**base, "BLOCK_N": bn, "MM": mm} for bn, mm in [(16, 1), (32, 1), (64, 1), (128, 1), (16, 0), (32, 0)]]
    with torch.no_grad():
        cm(*args)
        prog = cm._spec().executor
        env = prog._env(args)
        (step,) = [st for st in prog.steps if isinstance(st, RegionStep) and st.choice.pattern == "gemm"]
        assert step.kernel.region_ir.count("dl.rotary") == 2
        for st in prog.steps:
            if st is step:
                break
            st(env)
        tensors = step.inputs(env)
        refs = step.reference([t.double() for t in tensors])
        checked = _launch_valid(step, tensors, refs, configs)
    assert {(c["BLOCK_N"], c["MM"]) for c in checked} >= {(16, 1), (64, 1), (128, 1), (32, 0)}


@pytest.mark.parametrize("backend,dtype", [("interpret", torch.float32), *GPU[1:]])
@pytest.mark.parametrize("rd,inter", [(None, False), (8, False), (None, True)])
@pytest.mark.parametrize("per_head", [False, True])
def test_gemm_rotary_loads_a_table_shared_by_the_heads_once(backend, dtype, rd, inter, per_head):
    """cos and sin given once for every head ([S, D], broadcast over the heads as HF passes them) are loaded as
    one [BLOCK_M, rotary_dim] tile for all the heads of a K-loop tile, not per column (its register cost spilled a
    128x256 tile's epilogue, bench/NOTES.md 131); tables that differ per head are read per column. Every K-loop,
    one-row, narrow-tile and cuBLAS-product config against the region's float64 reference."""
    from dlblas_compiler.runtime.program import RegionStep

    dev = _device(backend)
    heads, d, s = 4, 16, 7
    model = randomize_(BiasQKRotary(32, heads, d, rd, inter)).eval()
    ang = _x(heads if per_head else 1, s, (rd or d) // 2, seed=3)
    rep = (lambda t: t.repeat_interleave(2, -1)) if inter else (lambda t: torch.cat([t, t], -1))
    args = [_x(1, s, 32), rep(ang.cos())[None], rep(ang.sin())[None]]  # [1, 1 or heads, S, rd]
    ref = copy.deepcopy(model).double()(*(a.double() for a in args))
    model, args = model.to(dev, dtype), [a.to(dev, dtype) for a in args]
    cm = dc.compile(model, backend=backend, cuda_graphs=False)
    base = {"BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": 0, "NORM_PASS": 0,
            "PERSISTENT": 0, "WS": 0}  # fmt: skip
    configs = [{**base, "BLOCK_M": bm, "BLOCK_N": bn, "MM": mm}
               for bm, bn, mm in [(16, 8, 0), (16, 16, 0), (16, 32, 0), (16, 64, 0), (1, 64, 0), (16, 64, 1)]]
    with torch.no_grad():
        out = cm(*args)
        assert all(rel_error(o, r.to(dev)) <= tolerance(dtype) for o, r in zip(out, ref, strict=True))
        prog = cm._spec().executor
        env = prog._env(args)
        (step,) = [st for st in prog.steps if isinstance(st, RegionStep) and st.choice.pattern == "gemm"]
        table = f"(tl.arange(0, {rd or d})[None, :]) * e"  # a table's columns: one group's, for every head
        assert (table in step.kernel.source) == (not per_head), step.kernel.source
        tensors = step.inputs(env)
        refs = step.reference([t.double() for t in tensors])
        checked = {(c["BLOCK_M"], c["BLOCK_N"], c["MM"]) for c in _launch_valid(step, tensors, refs, configs, dtype)}
    assert {(16, 16, 0), (16, 32, 0), (16, 64, 0), (16, 64, 1)} <= checked


@pytest.mark.parametrize("tokens", [1, 7])
@pytest.mark.parametrize("d,rd,inter", [(48, None, False), (48, None, True), (40, None, False), (40, 8, False)])
def test_gemm_rotary_on_heads_whose_width_is_not_a_power_of_two(tokens, d, rd, inter):
    """Heads of 48 columns (Phi-3-mini has 96) rotate in the QKV GEMM's epilogue: in tiles of part of a head
    (BLOCK_N dividing the head, each tile the matching parts of its two halves) or over cuBLAS's product; heads of
    40 columns (not a multiple of 16) and partial rotary over cuBLAS's product only. Each config against the
    region's float64 reference (these rotaries were row kernels after the GEMM before)."""
    from dlblas_compiler.runtime.program import RegionStep

    model = randomize_(BiasQKRotary(32, 3, d, rd, inter)).eval()
    ang = _x(tokens, (rd or d) // 2, seed=3)
    rep = (lambda t: t.repeat_interleave(2, -1)) if inter else (lambda t: torch.cat([t, t], -1))
    args = [_x(1, tokens, 32), rep(ang.cos()), rep(ang.sin())]
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    base = {"BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": 0, "NORM_PASS": 0,
            "PERSISTENT": 0, "WS": 0}  # fmt: skip
    configs = [{**base, "BLOCK_M": bm, "BLOCK_N": bn, "MM": mm}
               for bm, bn, mm in [(1, 16, 0), (16, 16, 0), (16, 32, 0), (16, 16, 1), (16, 32, 1), (16, 64, 1), (16, 128, 1)]]
    with torch.no_grad():
        out = cm(*args)
        ref = copy.deepcopy(model).double()(*(a.double() for a in args))
        assert all(rel_error(o, r) <= tolerance(torch.float32) for o, r in zip(out, ref, strict=True))
        prog = cm._spec().executor
        env = prog._env(args)
        (step,) = [st for st in prog.steps if isinstance(st, RegionStep)]
        assert step.choice.pattern == "gemm" and step.kernel.region_ir.count("dl.rotary") == 2
        assert step.kernel.space.is_valid(step.kernel.space._default)  # (the declared default, not a neighbour)
        tensors = step.inputs(env)
        refs = step.reference([t.double() for t in tensors])
        checked = {(c["BLOCK_M"], c["BLOCK_N"], c["MM"]) for c in _launch_valid(step, tensors, refs, configs)}
    assert {(16, 64, 1), (16, 128, 1)} <= checked  # the product read back: tiles of a head or more, any width
    assert (16, 32, 0) not in checked
    if d % 16 == 0 and rd is None:  # tiles of part of a head dividing it (one-row tiles at one token)
        assert {(16, 16, 0), (16, 16, 1)} <= checked and ((1, 16, 0) in checked) == (tokens == 1)
        assert (16, 32, 1) not in checked  # (32 columns do not divide a head of 48)
    else:  # no tile holds part of a head: only the product read back, in tiles of any width
        assert not any(mm == 0 for _, _, mm in checked) and {(16, 16, 1), (16, 32, 1)} <= checked


def _one_gemm_region_every_config(model, args, configs, ops: dict[str, int], outputs: bool = False):
    """Compile `model` (interpreter), check it is one GEMM region holding `ops` (name -> count) and that its outputs
    match the float64 model, then launch each valid config of `configs` against the region's float64 reference;
    returns the configs checked (and, with `outputs`, the compiled and float64 outputs)."""
    from dlblas_compiler.runtime.program import RegionStep

    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    out = cm(*args)
    assert Counter(cm.report().patterns) == {"gemm": 1}
    prog = cm._spec().executor
    env = prog._env(args)
    (step,) = [st for st in prog.steps if isinstance(st, RegionStep)]
    assert {op: step.kernel.region_ir.count(op) for op in ops} == ops
    tensors = step.inputs(env)
    refs = step.reference([t.double() for t in tensors])
    checked = _launch_valid(step, tensors, refs, configs)
    ref = model.double()(*(a.double() for a in args))
    assert all(rel_error(o, r) <= tolerance(torch.float32) for o, r in zip(out, ref, strict=True))
    return (checked, out, ref) if outputs else checked


class PerHeadQKVRotary(nn.Module):
    """GPT-NeoX's attention input: one projection with bias whose columns are laid out per head as [q | k | v],
    heads split and moved before the sequence, q, k and v sliced from each head's columns, rotary on q and k."""

    def __init__(self, k, heads, d, rd, inter):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = nn.Linear(k, heads * 3 * d)
        self.rot = Rotary(rd, inter)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, self.heads, 3 * self.d).transpose(1, 2).chunk(3, dim=-1)
        return self.rot(q, cos, sin), self.rot(k, cos, sin), v


@pytest.mark.parametrize("tokens", [1, 7])
@pytest.mark.parametrize("rd,inter", [(None, False), (4, False), (None, True)])
def test_gemm_rotary_on_q_k_v_sliced_from_each_heads_columns(tokens, rd, inter):
    """q, k and v sliced from each head's [q | k | v] columns (GPT-NeoX) are views of the tile holding those
    positions of each head: the slices and the rotary of q and k run in the QKV GEMM's epilogue (one region),
    for tiles of one or several [q | k | v] blocks, one-row tiles, split-K and cuBLAS-product (MM) configs, in
    the half and interleaved layouts and with partial rotary, each against the region's float64 reference."""
    d, k = 16, 256  # (K long enough to split)
    model = randomize_(PerHeadQKVRotary(k, 4, d, rd, inter)).eval()
    ang = _x(tokens, (rd or d) // 2, seed=3)
    rep = (lambda t: t.repeat_interleave(2, -1)) if inter else (lambda t: torch.cat([t, t], -1))
    args = [_x(1, tokens, k), rep(ang.cos()), rep(ang.sin())]
    base = {"BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": 0, "NORM_PASS": 0, "PERSISTENT": 0, "WS": 0}
    configs = [{**base, "BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk, "MM": mm}
               for bm, bn, sk, mm in [(16, 16, 1, 0), (16, 32, 1, 0), (16, 64, 2, 0), (16, 128, 1, 0), (16, 16, 1, 1),
                                      (16, 64, 1, 1), (1, 16, 1, 0), (1, 32, 2, 0)]]  # fmt: skip
    with torch.no_grad():
        checked = _one_gemm_region_every_config(model, args, configs, {"dl.rotary": 2, "dl.slice": 3})
    assert {c["BLOCK_N"] for c in checked} >= {16, 32, 64} and {c["MM"] for c in checked} >= ({0, 1} if tokens > 1 else {0})
    assert any(c["SPLIT_K"] == 2 for c in checked) and (tokens > 4 or any(c["BLOCK_M"] == 1 for c in checked))


class CacheWriteQKV(nn.Module):
    """Llama's attention input with a static cache (HF's StaticLayer.update): RMSNorm, one q/k/v projection, heads,
    rotary on q and k, then k and v written into the caller's caches at the positions `pos` along the tokens
    (`index_copy_`); returns q (and, with `return_cache`, the key cache itself, as a user-visible output)."""

    def __init__(self, k, heads, kv_heads, d, return_cache=False):
        super().__init__()
        self.heads, self.kv_heads, self.d, self.return_cache = heads, kv_heads, d, return_cache
        self.norm = nn.RMSNorm(k, eps=1e-6)
        self.qkv = nn.Linear(k, (heads + 2 * kv_heads) * d, bias=False)
        self.rot = Rotary(None, False)

    def forward(self, x, cos, sin, k_cache, v_cache, pos):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d],
                                               -1)  # fmt: skip
        q, k, v = (t.view(b, s, -1, self.d).transpose(1, 2) for t in (q, k, v))
        k_cache.index_copy_(2, pos, self.rot(k, cos, sin))
        v_cache.index_copy_(2, pos, v)
        q = self.rot(q, cos, sin)
        return (q, k_cache) if self.return_cache else q


def _cache_write_args(batch, tokens, k, kv_heads, d, length, pos, seed=0):
    ang = _x(tokens, d // 2, seed=seed + 3)
    return [_x(batch, tokens, k, seed=seed), torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1),
            _x(batch, kv_heads, length, d, seed=seed + 1), _x(batch, kv_heads, length, d, seed=seed + 2),
            torch.tensor(pos)]  # fmt: skip


@pytest.mark.parametrize("batch,pos", [(1, [5]), (2, [6, 1, 3]), (1, [0, 1, 2, 3, 4, 5, 6, 7, 8])])
def test_gemm_stores_k_and_v_into_the_cache_at_their_positions(batch, pos):
    """A static cache's update (`k_cache.index_copy_(2, pos, k)`, and v's) joins the QKV GEMM's epilogue: the
    tile's k and v rows are stored at the cache positions `pos` (any order, any tile) into the caller's own cache
    tensors, where nothing reads their old values afterwards: no index_copy step, no copy of the cache. Every
    config family (one-row tiles, split-K, cuBLAS product) against the region's float64 reference on fresh
    caches, the cache rows not written left bit for bit; the caller's caches and q equal eager's over calls."""
    from dlblas_compiler.runtime.inplace import InPlaceIndexCopy, WriteInput
    from dlblas_compiler.runtime.program import RegionStep

    k, heads, kv_heads, d, length = 256, 4, 2, 16, 9
    model = randomize_(CacheWriteQKV(k, heads, kv_heads, d)).eval()
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        for call in range(2):  # (new positions and values at each call: the positions are read at run time)
            where = [(p + call) % length for p in pos]
            args = _cache_write_args(batch, len(pos), k, kv_heads, d, length, where, seed=call)
            twin = [a.clone() for a in args]
            ref = model.double()(*[a.double() if a.is_floating_point() else a for a in args])
            model.float()
            q = cm(*args)
            eager = model(*twin)
            assert rel_error(q, ref) <= tolerance(torch.float32) and rel_error(q, eager) <= tolerance(torch.float32)
            for c in (3, 4):
                assert rel_error(args[c], twin[c]) <= tolerance(torch.float32)
                assert torch.equal(args[c][:, :, [i for i in range(length) if i not in where]],
                                   twin[c][:, :, [i for i in range(length) if i not in where]])  # fmt: skip
        prog = cm._spec().executor
        assert Counter(cm.report().patterns) == {"gemm": 1}
        (step,) = [st for st in prog.steps if isinstance(st, RegionStep)]
        assert step.kernel.region_ir.count("dl.index_copy") == 2 and step.kernel.region_ir.count("dl.rotary") == 2
        assert [ok for _, ok in step.writes] == [True, True]
        assert not [st for st in prog.steps if isinstance(st, (InPlaceIndexCopy, WriteInput))]
        args = _cache_write_args(batch, len(pos), k, kv_heads, d, length, pos, seed=5)
        tensors = step.inputs(prog._env(args))
        before = [t.clone() for t in tensors]
        refs = step.reference([t.double() if t.is_floating_point() else t for t in tensors])
        base = {"BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": 0}
        configs = [{**base, "BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk, "MM": mm, "NORM_PASS": mm, "PERSISTENT": 0, "WS": 0}
                   for bm, bn, sk, mm in [(16, 16, 1, 0), (16, 32, 2, 0), (16, 64, 1, 0), (16, 32, 1, 1),
                                          (16, 64, 1, 1), (1, 16, 1, 0), (1, 32, 2, 0)]]  # fmt: skip
        checked = _launch_valid(step, tensors, refs, configs)
        assert all(torch.equal(t, b) for t, b in zip(tensors, before))  # (each config wrote its own copies)
    rows = batch * len(pos)  # (one-row tiles up to GEMV_ROWS rows)
    assert {c["MM"] for c in checked} == {0, 1} and {c["BLOCK_M"] for c in checked} == {16, 1 if rows <= 4 else 16}
    assert any(c["SPLIT_K"] == 2 for c in checked) and {c["BLOCK_N"] for c in checked} >= {16, 32, 64}


def test_a_cache_position_outside_the_cache_writes_nothing():
    """torch's index_copy_ fails on a position outside the destination; the GEMM's store must not write there
    (no memory past the cache is touched): the rows in range are written, every other cache row is unchanged."""
    from dlblas_compiler.runtime.program import RegionStep

    k, length = 64, 8
    model = randomize_(CacheWriteQKV(k, 4, 2, 16)).eval()
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    with torch.no_grad():
        cm(*_cache_write_args(1, 3, k, 2, 16, length, [0, 1, 2]))
        prog = cm._spec().executor
        (step,) = [st for st in prog.steps if isinstance(st, RegionStep)]
        args = _cache_write_args(1, 3, k, 2, 16, length, [5, length + 3, -1], seed=4)
        tensors = step.inputs(prog._env(args))
        before = [t.clone() for t in tensors]
        good = _cache_write_args(1, 3, k, 2, 16, length, [5, 6, 7], seed=4)
        ref = step.reference(step.inputs(prog._env(good)))
        out = step.launch(tensors, step.choice.config)
    caches = [(o, r, next(i for i, t in enumerate(tensors) if t is o)) for o, r in zip(out, ref, strict=True)
              if any(o is t for t in tensors)]  # (the k and v caches: written in the tensors passed)
    assert len(caches) == 2
    for o, r, i in caches:
        assert rel_error(o[:, :, 5], r[:, :, 5]) <= tolerance(torch.float32)
        assert torch.equal(o[:, :, :5], before[i][:, :, :5]) and torch.equal(o[:, :, 6:], before[i][:, :, 6:])


def test_a_cache_the_caller_gets_back_is_written_as_a_copy():
    """Where the cache is also an output (eager returns the caller's tensor there), the runtime keeps its update
    functional: the GEMM stores k into a copy of the cache, which the compiled module writes back; the outputs
    and the caller's caches equal eager's."""
    from dlblas_compiler.runtime.program import RegionStep

    model = randomize_(CacheWriteQKV(64, 4, 2, 16, return_cache=True)).eval()
    cm = dc.compile(model, backend="interpret", cuda_graphs=False)
    args = _cache_write_args(1, 3, 64, 2, 16, 8, [2, 7, 4])
    twin = [a.clone() for a in args]
    with torch.no_grad():
        (q, kc), (eq, ekc) = cm(*args), model(*twin)
    assert rel_error(q, eq) <= tolerance(torch.float32) and rel_error(kc, ekc) <= tolerance(torch.float32)
    assert all(rel_error(args[c], twin[c]) <= tolerance(torch.float32) for c in (3, 4))
    (step,) = [st for st in cm._spec().executor.steps if isinstance(st, RegionStep)]
    assert sorted(ok for _, ok in step.writes) == [False, True]  # (the value cache is still written in place)


class QKNormRotary(nn.Module):
    """Qwen3's attention input: RMSNorm, one q/k/v projection, heads, an RMSNorm over each q and k head (its own
    weight), then rotary on [B, H, S, D]."""

    def __init__(self, k, heads, kv_heads, d):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.norm = nn.RMSNorm(k, eps=1e-6)
        self.qkv = nn.Linear(k, (heads + 2 * kv_heads) * d, bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.rot = Rotary(None, False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], -1)
        q = self.q_norm(q.view(b, s, self.heads, self.d)).transpose(1, 2)
        k = self.k_norm(k.view(b, s, self.kv_heads, self.d)).transpose(1, 2)
        return self.rot(q, cos, sin), self.rot(k, cos, sin), v.view(b, s, self.kv_heads, self.d).transpose(1, 2)


@pytest.mark.parametrize("tokens", [5, 19])
def test_gemm_per_head_rms_norm_before_rotary(tokens):
    """Qwen3's per-head q/k RMSNorms and the rotary after them run in the QKV GEMM's epilogue (one region):
    K-loop and cuBLAS-product (MM) configs and split-K, each against the region's float64 reference; tiles
    narrower than a head are not in the space. In bf16 the compiled module's error against float64 is eager's.
    (For up to GEMV_ROWS rows the norm stays out: test_per_head_norm_stays_out_of_the_decode_gemv.)"""
    d, k = 32, 256  # (K long enough to split)
    model = randomize_(QKNormRotary(k, 4, 2, d)).eval()
    ang = _x(tokens, d // 2, seed=3)
    args = [_x(1, tokens, k), torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)]
    base = {"BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": 0}
    configs = [{**base, "BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk, "MM": mm, "NORM_PASS": p, "PERSISTENT": 0, "WS": 0}
               for bm, bn, sk, mm, p in [(16, 32, 1, 0, 0), (16, 64, 2, 0, 0), (16, 128, 1, 0, 1), (16, 32, 1, 1, 1),
                                         (16, 64, 1, 1, 1), (1, 32, 1, 0, 0), (16, 16, 1, 0, 0), (16, 16, 1, 1, 1)]]  # fmt: skip
    with torch.no_grad():
        checked, out, ref = _one_gemm_region_every_config(model, args, configs, {"dl.rms_norm": 3, "dl.rotary": 2},
                                                           outputs=True)  # fmt: skip
        bf = copy.deepcopy(model).to(torch.bfloat16)
        bargs = [a.to(torch.bfloat16) for a in args]
        ours, eager = dc.compile(bf, backend="interpret", cuda_graphs=False)(*bargs), bf(*bargs)
        for o, e, r in zip(ours, eager, ref):
            assert rel_error(o, r) <= 2 * rel_error(e, r) + 1e-3
    assert {c["BLOCK_N"] for c in checked} == {32, 64, 128} and {c["MM"] for c in checked} == {0, 1}
    assert any(c["SPLIT_K"] == 2 for c in checked)
    from dlblas_compiler.runtime.program import RegionStep

    cm = dc.compile(copy.deepcopy(model).float(), backend="interpret", cuda_graphs=False)  # (the helper made it float64)
    with torch.no_grad():
        cm(*args)
    (step,) = [st for st in cm._spec().executor.steps if isinstance(st, RegionStep)]
    # q's and k's norm weights (one for every row and head) loaded once each as D values, not per column
    assert step.kernel.source.count(f"tl.arange(0, {d}) * e") == 2, step.kernel.source


class QKNormCacheWrite(nn.Module):
    """Qwen3's attention input with a static cache: per-head q/k RMSNorms, rotary, k and v written into the caller's
    caches at the positions `pos` (HF's StaticLayer.update); returns q."""

    def __init__(self, k, heads, kv_heads, d):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.qkv = nn.Linear(k, (heads + 2 * kv_heads) * d, bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.rot = Rotary(None, False)

    def forward(self, x, cos, sin, k_cache, v_cache, pos):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], -1)
        q = self.q_norm(q.view(b, s, -1, self.d)).transpose(1, 2)
        k = self.k_norm(k.view(b, s, -1, self.d)).transpose(1, 2)
        k_cache.index_copy_(2, pos, self.rot(k, cos, sin))
        v_cache.index_copy_(2, pos, v.view(b, s, -1, self.d).transpose(1, 2))
        return self.rot(q, cos, sin)


@pytest.mark.parametrize("backend,dtype", [*CPU[:1], GPU[1]])
@pytest.mark.parametrize("batch,pos", [(1, [5]), (2, [7]), (1, [9])])
def test_row_kernel_stores_k_into_the_cache_at_its_position(backend, dtype, batch, pos):
    """At decode (the norm out of the QKV GEMV) k's per-head norm, its rotary and its cache write are one row kernel:
    each row stored at its position into the caller's own cache (no index_copy step, no copy of the cache); a
    position past the cache's end writes nothing (torch's index_copy_ fails there). Against eager on fresh inputs."""
    from dlblas_compiler.runtime.inplace import InPlaceIndexCopy
    from dlblas_compiler.runtime.program import RegionStep

    dev = _device(backend)
    model = randomize_(QKNormCacheWrite(64, 4, 2, 16)).eval().to(device=dev, dtype=dtype)
    cm = dc.compile(model, backend=backend, cuda_graphs=False)
    args = [a.to(dev, dtype) if a.is_floating_point() else a.to(dev) for a in _cache_write_args(batch, 1, 64, 2, 16, 8, pos)]
    twin = [a.clone() for a in args]
    with torch.no_grad():
        if pos[0] >= 8:
            cm(*args)
            assert torch.equal(args[3], twin[3])  # (nothing written out of range)
            return
        q, eq = cm(*args), model(*twin)
        ref = model.to(torch.float64)(*[a.double() if a.is_floating_point() else a for a in twin])
    assert rel_error(q, eq) <= tolerance(dtype) or rel_error(q, ref) <= 2 * rel_error(eq, ref) + tolerance(dtype)
    assert all(rel_error(args[c], twin[c]) <= tolerance(dtype) for c in (3, 4))  # (the caches)
    assert Counter(cm.report().patterns) == Counter({"gemm": 1, "row": 2})
    steps = [st for st in cm._spec().executor.steps if isinstance(st, RegionStep)]
    assert not any(isinstance(st, InPlaceIndexCopy) for st in cm._spec().executor.steps)
    row = [st for st in steps if "dl.index_copy" in st.kernel.region_ir and "dl.rotary" in st.kernel.region_ir
           and "dl.linear" not in st.kernel.region_ir]  # fmt: skip
    assert len(row) == 1 and [ok for _, ok in row[0].writes] == [True]


def test_per_head_norm_stays_out_of_the_decode_gemv():
    """For one token the QKV GEMM streams its weight in tiles narrower than a head, so the per-head norms and
    rotary run after it as row kernels."""
    d = 32
    ang = _x(1, d // 2, seed=3)
    args = [_x(1, 1, 64), torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)]
    cm = _run(randomize_(QKNormRotary(64, 4, 2, d)), args, "interpret", torch.float32, expect_regions={"gemm": 1})
    assert "dl.rms_norm" not in next(s.kernel.region_ir for s in cm._spec().executor.steps if getattr(s, "kernel", None)
                                     and "dl.linear" in s.kernel.region_ir).split("dl.linear")[1]
    assert Counter(cm.report().patterns)["row"] >= 2


class TanhGelu(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2.0, F.gelu(x, approximate="tanh") * 2.0


@pytest.mark.parametrize("backend", ["interpret", pytest.param("triton", marks=pytest.mark.gpu)])
def test_tanh_and_tanh_gelu_keep_their_digits_near_zero(backend):
    """tanh and GELU's tanh form in float32 kernels, element by element against float64, from 1e-6 to 10 in
    magnitude: tanh within 4 float32 epsilons of each value (2 sigmoid(2x) - 1, the formula before, was 1e-3 off at
    tanh(1e-4), relatively: a fuzzed RMSNorm over one element made that 2.6e-5 of its output), GELU no further than
    eager's float32 plus (4 + |2u|) epsilons: both evaluate its argument 2u in float32, and on a GPU e^2u is
    exp2 of 2u log2(e) rounded to float32, an error of about |2u| / 2 epsilons that eager's own rounding on an element
    need not share; -0.0, NaN and the infinities as eager gives them."""
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(512, generator=g) * s for s in (1e-6, 1e-4, 1e-2, 0.3, 0.62, 1.0, 3.0, 10.0)])
    special = torch.tensor([0.0, -0.0, 0.625, -0.625, float("nan"), float("inf"), -float("inf"), 1e-38, 44.0, -44.0])
    x = torch.cat([x, special]).reshape(1, -1)
    dev = _device(backend)
    cm = dc.compile(TanhGelu(), backend=backend, cuda_graphs=False)
    with torch.no_grad():
        outs = [o.cpu() for o in cm(x.to(dev))]
        refs = TanhGelu()(x.double())
    assert all(k.impl == "kernel" for k in cm.report().kernels), cm.report().kernels
    eps = torch.finfo(torch.float32).eps
    for o, r, eager in zip(outs, refs, TanhGelu()(x), strict=True):
        # (GELU's float64 reference itself cancels in 1 + tanh(u) below x = -6: compared above it)
        fine = r.isfinite() & (r.abs() > 1e-30) & (x > -6.0)
        err = ((o.double() - r).abs() / r.abs())[fine]
        two_u = (1.5957691216057308 * (x.double() + 0.044715 * x.double() ** 3)).abs()[fine]
        bound = 4 * eps if o is outs[0] else ((eager.double() - r).abs() / r.abs())[fine] + (4 + two_u) * eps
        assert (err <= bound).all(), ((err - bound).max() / eps, x[fine][(err - bound).argmax()])
        e, want = o[0, -len(special):], r[0, -len(special):].float()
        torch.testing.assert_close(e, want, rtol=4 * eps, atol=0.0, equal_nan=True)
        signed = ~want.isnan()  # (a NaN's sign bit is no part of its value: a GPU's -inf * 0 gives +NaN, a CPU's -NaN)
        assert torch.equal(e.signbit()[signed], want.signbit()[signed]), (e, want)


class ScalarPowers(nn.Module):
    EXPONENTS = (0.5, -0.5, 0.0, 1.0, 2.0, 3.0, -2.0, -3.0, 4.0, 5.0, 9.0, 10.0, -9.0, 0.3, 1.5, -1.5, 2.5)

    def forward(self, x):
        return tuple(x**e * 1.0 for e in self.EXPONENTS)


@pytest.mark.parametrize("backend", ["interpret", pytest.param("triton", marks=pytest.mark.gpu)])
def test_scalar_powers_as_eager_computes_them(backend):
    """x ** e for a scalar e in a float32 kernel, against eager float32 element by element: within 4 epsilons,
    and the same signs, NaNs and infinities at -0.0, +-inf, NaN and negative x (an odd power keeps the sign, a
    fractional power of a finite negative x is NaN; before, every power above 8 of a negative x was NaN, and
    7 ** 10 was 1.1e-6 off)."""
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(256, generator=g) * s for s in (1e-3, 0.5, 1.0, 3.0, 7.0)])
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -2.0, -1.0, 1.0, 1e-30, -1e-30])
    x = torch.cat([x, special]).reshape(1, -1)
    dev = _device(backend)
    cm = dc.compile(ScalarPowers(), backend=backend, cuda_graphs=False)
    with torch.no_grad():
        outs = [o.cpu() for o in cm(x.to(dev))]
        eager = ScalarPowers()(x)
    assert all(k.impl == "kernel" for k in cm.report().kernels), cm.report().kernels
    eps = torch.finfo(torch.float32).eps
    for e, o, want in zip(ScalarPowers.EXPONENTS, outs, eager, strict=True):
        torch.testing.assert_close(o, want, rtol=4 * eps, atol=0.0, equal_nan=True, msg=f"x ** {e}")
        same = ~want.isnan()
        assert torch.equal(o[same].signbit(), want[same].signbit()), f"x ** {e}"


@pytest.mark.parametrize("backend,dtype", CASES)
@pytest.mark.parametrize("tokens", [1, 37])
def test_per_head_rms_norm_and_rotary_in_the_qkv_gemm(backend, dtype, tokens):
    """The same region compiled and run as the tuner would (on the GPU: Triton, half precision), against float64."""
    d = 64
    ang = _x(tokens, d // 2, seed=3)
    args = [_x(2, tokens, 128), torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)]
    _run(randomize_(QKNormRotary(128, 4, 2, d)), args, backend, dtype, expect_regions={"gemm": 1})


@pytest.mark.parametrize("tokens", [1, 3])
def test_gemm_one_row_tiles(tokens):
    """One-row (CUDA-core) tiles on every GEMM region of a Llama block: tiles narrower than a head (the
    rotation pairs gathered from both halves of the head), split-K, grouped rows, a partial last K step."""
    cfg = BlockConfig(hidden=256, intermediate=320, heads=4, kv_heads=2, head_dim=64)
    configs = [{"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk, "GROUP_M": 8 if tokens > 1 else 1,
                "num_warps": 4, "num_stages": 2, "TMA": 0, "MM": 0, "NORM_PASS": p, "PERSISTENT": 0, "WS": 0}
               for bn, bk, sk in [(16, 64, 1), (32, 32, 2), (64, 128, 1), (16, 128, 1), (128, 32, 2)] for p in (0, 1)]  # fmt: skip
    checked = _check_gemm_regions(cfg, tokens, configs)
    assert len({r for r, _, _ in checked}) == 4, checked
    assert any(c["BLOCK_N"] < 64 and "dl.rotary" in r for r, c, _ in checked)  # a tile narrower than a head
    assert any(k % (c["BLOCK_K"] * c["SPLIT_K"]) for _, c, k in checked)  # a partial last K step


def test_one_row_k_loop_gathers_the_norm_statistics():
    """At one token an RMSNorm before a GEMM (QKV, gate/up) has its sum of squares gathered by the one-row K loop
    from the x slices it loads (`ssq`), the split-K parts' sums added through the workspace after their products,
    instead of the tile's last program reading x again after the loop (bench/NOTES.md 153). Right against the
    region's float64 reference for 1, 2 and 4 parts, parts past K's end included (they add nothing), a partial
    last K step (K = 320 in 3 x 128), and the same as the row pass's (NORM_PASS) within rounding."""
    cfg = BlockConfig(hidden=320, intermediate=384, heads=5, kv_heads=1, head_dim=64)
    seen = 0
    with torch.no_grad():
        for step, tensors, refs in _gemm_regions(cfg, 1):
            if "dl.rms_norm" not in step.kernel.region_ir:
                continue
            seen += 1
            src = step.kernel.source
            assert "ssq += a.to(tl.float32) * a.to(tl.float32)" in src, src
            assert "elif RS_INLINE and (BLOCK_M == 1 and not MM):" in src
            for bk, sk in [(64, 1), (32, 2), (128, 4), (64, 4)]:
                outs = {}
                for normed in (0, 1):
                    c = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": bk, "SPLIT_K": sk, "GROUP_M": 1, "num_warps": 4,
                         "num_stages": 2, "TMA": 0, "MM": 0, "NORM_PASS": normed, "PERSISTENT": 0, "WS": 0}  # fmt: skip
                    outs[normed] = step.launch(step.private(tensors, every=True), c)
                    for o, r in zip(outs[normed], refs):
                        assert rel_error(o, r) <= tolerance(torch.float32), (step.choice.region, c)
                for a, b in zip(outs[0], outs[1]):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert seen == 2


@pytest.mark.parametrize("backend,dtype", CASES)
@pytest.mark.parametrize("tokens", [1, 7, 33])
def test_llama_block_five_kernels(backend, dtype, tokens):
    cfg = BlockConfig()
    x, cos, sin = llama_block_inputs(cfg, 1, tokens)
    cm = _run(randomize_(LlamaBlock(cfg)), [x, cos, sin], backend, dtype,
              expect_regions={"gemm": 4, "attention": 1, "row": 0})  # fmt: skip
    kernels = [k.to_dict() for k in cm.report().kernels if k.impl == "kernel"]
    assert len(kernels) == 5


@pytest.mark.parametrize("backend,dtype", CASES)
def test_attention_explicit_softmax_with_mask(backend, dtype):
    cfg = BlockConfig(attention="explicit")
    x, cos, sin = llama_block_inputs(cfg, 2, 9)
    cm = _run(randomize_(LlamaBlock(cfg)), [x, cos, sin], backend, dtype, expect_regions={"attention": 1})
    assert "mask" in cm.ir("after:recognize")


@pytest.mark.parametrize("backend,dtype", CASES)
def test_hf_llama_decoder_layer(backend, dtype):
    from ..hf import llama_layer_and_inputs

    layer, args, kwargs = llama_layer_and_inputs(tokens=6)
    dev = _device(backend)
    kwargs["position_embeddings"] = tuple(t.to(device=dev, dtype=dtype) for t in kwargs["position_embeddings"])
    _run(layer, list(args), backend, dtype, kwargs, expect_regions={"gemm": 4, "attention": 1})


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("offset,scale_f32", [(0.0, False), (1.0, True)])  # Llama, Gemma
def test_row_norm_pass_rounds_as_rms_norm(one_pass, offset, scale_f32):
    """The norm pass of NORM_PASS / MM configs equals dl.rms_norm's reference bit for bit in bf16 (rows read once
    or, past K_BLOCK columns, twice), and within fp32 rounding in fp32."""
    from dlblas_compiler.codegen.gemm import row_norm
    from dlblas_compiler.codegen.interpreter import launch
    from dlblas_compiler.dialects.compute import rms_norm_reference

    for dtype in (torch.bfloat16, torch.float32):
        m, k = 5, 100
        x, wt = _x(m, k).to(dtype), _x(k, seed=1).to(dtype)
        y = torch.empty_like(x)
        kb = 128 if one_pass else 32
        launch(row_norm, (m,), x.device, x, wt, y, m, k, 1e-6, offset, HAS_W=True, SCALE_F32=scale_f32, K_BLOCK=kb,
               ROWS=1, ONE_PASS=one_pass)  # fmt: skip
        ref = rms_norm_reference(x, wt, 1e-6, offset, scale_f32)
        if dtype == torch.bfloat16:
            assert torch.equal(y, ref)
        else:
            assert rel_error(y, ref) <= 1e-6


@pytest.mark.parametrize("one_pass", [True, False])
def test_row_layer_norm_pass_matches_torch(one_pass):
    """The LayerNorm pass of a GEMM with a LayerNorm prologue against F.layer_norm: bf16 within one rounding,
    fp32 within fp32 rounding; rows read once or (past K_BLOCK columns) in three passes, large mean included."""
    from dlblas_compiler.codegen.gemm import row_layer_norm
    from dlblas_compiler.codegen.interpreter import launch

    for dtype in (torch.bfloat16, torch.float32):
        m, k = 5, 100
        x, wt, b = (_x(m, k) + 30.0).to(dtype), _x(k, seed=1).to(dtype), _x(k, seed=2).to(dtype)
        y = torch.empty_like(x)
        launch(row_layer_norm, (m,), x.device, x, wt, b, y, m, k, 1e-5, K_BLOCK=128 if one_pass else 32, ROWS=1,
               ONE_PASS=one_pass)  # fmt: skip
        ref = F.layer_norm(x.double(), (k,), wt.double(), b.double(), 1e-5)
        assert rel_error(y, ref) <= (4e-3 if dtype == torch.bfloat16 else 1e-6), dtype


def test_gemm_seeds_only_on_the_devices_they_were_measured_on(monkeypatch):
    """The GEMM space's seed configs come from sweeps on sm90 cards: another device's quick search starts from the
    shape's default and the variants' own starts (the cuBLAS product with epilogue tiles of a fixed size), not
    from another card's table."""
    from dlblas_compiler.codegen import device
    from dlblas_compiler.codegen.gemm.space import EPILOGUE_TILE
    from dlblas_compiler.runtime.program import RegionStep

    def gemm_spaces():
        cm = dc.compile(randomize_(NormGLU(64, 40, F.silu)).eval(), backend="interpret", cuda_graphs=False)
        with torch.no_grad():
            cm(_x(300, 64))
        steps = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.choice.pattern == "gemm"]
        return [s.kernel.space for s in steps]

    (sm90,) = gemm_spaces()
    assert len(sm90.starts()) > 1  # the default, then the sweeps' seeds valid here
    monkeypatch.setattr(device, "capability", lambda: (8, 0))
    (sm80,) = gemm_spaces()
    default, *variants = sm80.starts()
    assert default == sm80.default() and variants and all(c["MM"] == 1 for c in variants)
    assert {c["BLOCK_M"] * c["BLOCK_N"] * 2 for c in variants} == {EPILOGUE_TILE}  # (two streams: gate, up)
    assert all(c in sm90.starts() for c in variants)


def test_gemm_spaces_without_tma_when_asked(monkeypatch):
    """`DLBLAS_GEMM_TMA=0` (a measurement switch) takes TMA configs out of every GEMM space, the default and the
    starts included, under a tuning-cache key of its own."""
    from dlblas_compiler.codegen.gemm.space import TMA_ENV
    from dlblas_compiler.runtime.program import RegionStep

    def gemm_space_at_300_rows():
        cm = dc.compile(randomize_(NormGLU(64, 40, F.silu)).eval(), backend="interpret", cuda_graphs=False)
        with torch.no_grad():
            cm(_x(300, 64))
        (step,) = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.choice.pattern == "gemm"]
        return step.kernel.space

    with_tma = gemm_space_at_300_rows()
    assert with_tma.default()["TMA"] == 1  # (tiles of 128 rows through TMA on an sm90-like device)
    monkeypatch.setenv(TMA_ENV, "0")
    without = gemm_space_at_300_rows()
    assert all(c["TMA"] == 0 for c in without.configs()) and without.size() > 0
    assert without.default()["TMA"] == 0 and all(c["TMA"] == 0 for c in without.starts())
    assert without.fingerprint() != with_tma.fingerprint()


def test_gemm_variant_starts_include_the_default_run_persistent():
    """Above 256 rows the device-independent starts offer the default's tile in the persistent variant (the first
    start; the space drops it where the shape has no more tiles than SMs), then the cuBLAS-product tiles."""
    from dlblas_compiler.codegen.gemm.space import _variant_starts

    default = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": 8,
               "num_stages": 3, "TMA": 1, "MM": 0, "NORM_PASS": 1, "PERSISTENT": 0, "WS": 0}  # fmt: skip
    first, *rest = _variant_starts(2048, 2, True, default=default)
    assert first == {**default, "PERSISTENT": 1, "WS": 0} and rest and all(c["MM"] == 1 for c in rest)
    assert all(c["MM"] == 1 for c in _variant_starts(256, 2, True, default=default))  # (a few tiles: not persistent)
    assert _variant_starts(16, 2, True, default=default) == []


def test_gemm_persistent_starts_gain_a_split_last_wave_twin(monkeypatch):
    """Where a shape's tiles leave a partly empty last wave, each persistent start of the quick search is followed by
    its twin with that wave split over K as finely as still makes one wave (and leaves each part 4 K steps); the
    space accepts a persistent split only there. Where the tiles fill whole waves, no twin."""
    from dlblas_compiler.codegen import device
    from dlblas_compiler.codegen.gemm.plan import whole_tiles
    from dlblas_compiler.codegen.gemm.space import _split_tails
    from dlblas_compiler.runtime.program import RegionStep

    def space_at(sms: int):
        monkeypatch.setattr(device, "sm_count", lambda: sms)
        cm = dc.compile(randomize_(nn.Linear(512, 256, bias=False)).eval(), backend="interpret", cuda_graphs=False)
        with torch.no_grad():
            cm(_x(300, 512))
        (step,) = [s for s in cm._spec().executor.steps if isinstance(s, RegionStep) and s.choice.pattern == "gemm"]
        return step.kernel.space

    def splits(space, sms: int) -> set:
        """The tiles of the space's persistent split configs, each checked against the rule."""
        seen = set()
        for c in space.configs():
            if c["PERSISTENT"] and c["SPLIT_K"] > 1:
                tail = -(-300 // c["BLOCK_M"]) * -(-256 // c["BLOCK_N"]) % sms
                assert 0 < tail and tail * c["SPLIT_K"] <= sms and 512 // c["SPLIT_K"] >= 4 * c["BLOCK_K"], c
                seen.add((c["BLOCK_M"], c["BLOCK_N"]))
        return seen

    space = space_at(5)  # (the 300 x 256 output in tiles of 128 x 128: 6 tiles, a last wave of 1 on 5 SMs)
    starts = space.starts()
    twins = [c for c in starts if c["PERSISTENT"] and c["SPLIT_K"] > 1]
    assert twins and all({**c, "SPLIT_K": 1} in starts for c in twins), starts
    assert all(c["SPLIT_K"] == 16 or not space.is_valid({**c, "SPLIT_K": 2 * c["SPLIT_K"]}) for c in twins)  # (finest)
    assert (128, 128) in splits(space, 5)
    assert (128, 128) not in splits(space_at(3), 3)  # (6 tiles on 3 SMs: two whole waves)
    # Qwen2.5-7B's QKV at 2048 tokens on 132 SMs: 288 tiles of 128 x 256, a last wave of 24 split 4 ways (8 would
    # overfill the wave); Llama-3-8B's: 384 tiles, a last wave of 120 that no split fits
    assert whole_tiles(288, 132, 4) == 264 and whole_tiles(288, 132, 8) == 288 and whole_tiles(384, 132, 2) == 384
    start = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "SPLIT_K": 1, "PERSISTENT": 1, "WS": 0}
    for t, k, want in [(288, 3584, [start, {**start, "SPLIT_K": 4}]), (384, 4096, [start])]:
        assert _split_tails([start], lambda c, t=t, k=k: whole_tiles(t, 132, c["SPLIT_K"]) < t
                            and k // c["SPLIT_K"] >= 4 * c["BLOCK_K"]) == want  # fmt: skip


def test_gemm_default_tile_fills_the_registers_where_a_wave_of_tiles_remains():
    """Above 256 rows the default accumulator tile is 128 x 256 over all streams (one stream 256 wide, the dual
    GEMM 128 each), where that still makes at least one tile per SM and the tile holds whole rotary heads;
    otherwise 128 wide. The config is valid in the shape's space either way."""
    from dlblas_compiler.codegen.gemm.space import _default_config

    def tile(m, n, rot=16, ns=1, sms=132):
        c = _default_config(m, n, 4096, rot, False, ns, sms, True, 227 * 1024 // 2, True)
        assert c["BLOCK_M"] * c["BLOCK_N"] * ns <= 128 * c["num_warps"] * 32  # (the space's register rule)
        return c["BLOCK_M"], c["BLOCK_N"]

    assert tile(2048, 6144, rot=128) == (128, 256)  # QKV with rotary heads of 128
    assert tile(2048, 4096) == (128, 256)  # o-proj
    assert tile(2048, 14336, ns=2) == (128, 128)  # gate/up: two accumulators
    assert tile(512, 4096) == (128, 128)  # 4 x 16 wide tiles would leave SMs idle
    assert tile(2048, 40 * 96, rot=96) == (128, 128)  # heads of 96 do not fit 256 columns
    assert tile(2048, 4096, sms=1000) == (128, 128)
    assert tile(128, 4096) == (64, 128)


class _PerRowPlus(nn.Module):
    """A reduction without keepdim, then an input broadcast against the reduced shape (not the row space)."""

    def forward(self, x, b):
        return x.softmax(-1).amax(-1) + b


class _FullPlusPerRow(nn.Module):
    """A reduction's per-row values broadcast along the row space's other dims (right-aligned to x's shape)."""

    def forward(self, x):
        return x + x.amax(-1)


@pytest.mark.parametrize("model, shapes", [
    (_PerRowPlus, [(2, 2, 1), (2, 1)]),  # fuzz seed 1902: b's rows were read along the wrong dim
    (_PerRowPlus, [(3, 2, 5), (3, 1)]),
    (_PerRowPlus, [(3, 4, 5), (4,)]),
    (_FullPlusPerRow, [(2, 2, 2)]),
])  # fmt: skip
def test_row_kernel_broadcasts_against_a_reductions_shape(model, shapes):
    """Values after a reduction without keepdim have one value per row: an operand combined with them broadcasts
    against the reduced shape (the rows), and such values are not broadcast along the row space's columns in a
    row kernel; float32 on the interpreter against float64 eager."""
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(s, generator=g) for s in shapes]
    ref = model()(*[a.double() for a in args])
    out = dc.compile(model(), backend="interpret", strict=True)(*args)
    assert rel_error(out, ref) <= 1e-6


class _InPlaceRowsRank(nn.Module):
    """An input of the rows' rank (not a reduction) updated in place inside a larger row region."""

    def forward(self, x, b, s):
        b.add_(s)
        return x + b


class _ColumnsOfRowsRank(nn.Module):
    """An output of the rows' rank that is not a reduction: right-aligned, so it varies along the columns."""

    def forward(self, x, c):
        return x * 2, c * 3 + 1


def test_row_kernel_stores_values_of_the_rows_rank_by_their_own_alignment():
    """Only a reduction's per-row values are stored aligned with the rows; another output of the same rank is
    broadcast against the row space (fuzz seed 1906: the in-place updated b [1, 2, 1] got b[0] in both places)."""
    g = torch.Generator().manual_seed(4)
    x, b, s = torch.randn(1, 2, 2, 16, generator=g), torch.randn(1, 2, 1, generator=g), torch.randn((), generator=g)
    b_eager, b_ours = b.clone(), b.clone()
    ref = _InPlaceRowsRank()(x.double(), b_eager.double(), s.double())
    out = dc.compile(_InPlaceRowsRank(), backend="interpret", strict=True)(x, b_ours, s)
    b_eager += s
    assert rel_error(out, ref) <= 1e-6 and rel_error(b_ours, b_eager.double()) <= 1e-6
    x, c = torch.randn(2, 2, 2, generator=g), torch.randn(2, 2, generator=g)
    outs = dc.compile(_ColumnsOfRowsRank(), backend="interpret", strict=True)(x, c)
    for o, r in zip(outs, _ColumnsOfRowsRank()(x.double(), c.double()), strict=True):
        assert rel_error(o, r) <= 1e-6
