"""Differential fuzzing: random modules built from the ops the compiler supports, checked against eager.

A *spec* is plain JSON data: named dims (`{"d0": 7, ...}`), inputs (a shape and how to fill it), a list
of ops over numbered values (the inputs first, then one value per op) and the outputs. Shapes are lists
of entries, each an int or a product of dim names ("d2*d3"), so a spec stays consistent when a dim is
shrunk. `build(spec)` turns a spec into an `nn.Module` (a fixed-signature forward that symbolic_trace
follows); `random_spec(rng)` draws one; `check(spec, backends)` compiles it with each backend and
compares with eager; `shrink(spec, ...)` reduces a failing spec while it keeps failing the same way.

The oracle: float64 eager on the same (dtype-rounded) inputs and weights is the truth. An output passes
when it has eager's dtype and shape, non-finite values exactly where the truth has them, and
    max |out - truth| <= ULPS[dtype] * eps(dtype) * scale + 4 * max |eager(dtype) - truth|,
where `scale` is the largest finite magnitude of any intermediate value: a forward-error bound (relative
error is meaningless after cancellation, as in x - mean(x) of a nearly constant row), widened by
eager's own error in the same dtype (an ill-conditioned op amplifies rounding in eager too). Measured on
fuzzed graphs, generated kernels stay within 1.5 eps * scale (fp32) and 0.7 eps * scale (fp16; kernels
compute in fp32 and round once per region output), so ULPS leaves a margin of about 10 and 6: a
kernel off by a few percent on some elements fails.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import operator
import random
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc

MAX_INPUTS = 8
ULPS = {torch.float32: 16, torch.float16: 4, torch.bfloat16: 4}
MAGNITUDE_LIMIT = 1e3  # specs whose float64 intermediates exceed this are redrawn (fp16 overflows at 65504)
REGRESSIONS = Path(__file__).parent / "regressions"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotary(x, cos, sin, dim: int | None, interleaved: bool):
    """x * cos + rotate(x) * sin on the first `dim` columns (all when None); half-split or interleaved pairs."""
    def rot(t):
        if interleaved:
            return torch.stack((-t[..., 1::2], t[..., ::2]), dim=-1).flatten(-2)
        return rotate_half(t)

    if dim is None:
        return x * cos + rot(x) * sin
    xr, xp = x[..., :dim], x[..., dim:]
    return torch.cat((xr * cos + rot(xr) * sin, xp), dim=-1)


UNARY = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": torch.relu,
    "abs": torch.abs,
    "neg": lambda x: -x,
    "sin": torch.sin,
    "cos": torch.cos,
    "exp_neg_abs": lambda x: torch.exp(-x.abs()),
    "rsqrt_sq1": lambda x: torch.rsqrt(x * x + 1.0),
    "log_sq1": lambda x: torch.log(x * x + 1.0),
    "sqrt_abs": lambda x: torch.sqrt(x.abs() + 0.25),
    "square": lambda x: x.pow(2),
    "recip": lambda x: 1.0 / (x.abs() + 1.0),
}
BINARY = {
    "add": torch.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}
SCALAR = {
    "add": lambda a, c: a + c,
    "mul": lambda a, c: a * c,
    "rsub": lambda a, c: c - a,
    "div": lambda a, c: a / c,
    "radd": lambda a, c: c + a,
    "rmul": lambda a, c: c * a,
}
ACT = {
    "none": lambda y: y,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
}


# -- shapes -----------------------------------------------------------------------------------------


def size(entry: int | str, dims: dict[str, int]) -> int:
    """An int, or a product of dim names and ints ("d1*d2", "1*d3")."""
    if isinstance(entry, int):
        return entry
    return math.prod(int(d) if d.isdigit() else dims[d] for d in entry.split("*"))


def shape(entries: list, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(size(e, dims) for e in entries)


# -- the module -------------------------------------------------------------------------------------


def _reduce(x, kind: str, keep: bool):
    """Over the last dim; "all_*" over every dim (a 0-d result)."""
    if kind == "sum":
        return x.sum(-1, keepdim=keep)
    if kind == "mean":
        return x.mean(-1, keepdim=keep)
    if kind == "amax":
        return x.amax(-1, keepdim=keep)
    if kind == "all_sum":
        return x.sum()
    if kind == "all_mean":
        return x.mean()
    return torch.max(x)


def _rmsnorm(x, w, eps: float, upcast: bool, weight_first: bool):
    h = x.to(torch.float32) if upcast else x
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = h.to(x.dtype) if upcast else h
    return w * h if weight_first else h * w


def _layernorm(x, w, b, eps: float, functional: bool):
    if functional:
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / torch.sqrt(var + eps) * w + b


def _softmax(x, how: str):
    if how == "torch":
        return torch.softmax(x, dim=-1)
    if how == "fp32":
        return F.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _explicit_attention(q, k, v, causal: bool, scale: float):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        n, m = s.shape[-2], s.shape[-1]
        s = s + torch.full((n, m), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
    return torch.matmul(torch.softmax(s, dim=-1), v)


def _inplace(x, y, fn: str):
    """In-place ops symbolic_trace records (item assignment needs dynamo, which cannot follow this
    data-driven forward: tests/test_reliability.py covers it)."""
    if fn == "add_":
        return x.add_(y)
    if fn == "copy_":
        return x.copy_(y)
    if fn == "mul_":
        return x.mul_(0.5)
    return F.relu(x, inplace=True)


class FuzzModule(nn.Module):
    """The module a spec describes. Weights are filled from the spec's seed (never ones or zeros)."""

    def __init__(self, spec: dict):
        super().__init__()
        self.ops = spec["ops"]
        self.outputs = spec["outputs"]
        self.dims = dims = dict(spec["dims"])
        g = torch.Generator().manual_seed(spec["seed"])
        for i, op in enumerate(self.ops):
            kind = op["op"]
            if kind == "linear":
                n, k = shape(op["w"], dims)
                lin = nn.Linear(k, n, bias=op["bias"])
                with torch.no_grad():
                    lin.weight.copy_(torch.randn(n, k, generator=g) / math.sqrt(k))
                    if op["bias"]:
                        lin.bias.copy_(0.1 * torch.randn(n, generator=g))
                if op["module"]:
                    setattr(self, f"lin{i}", lin)
                else:
                    setattr(self, f"w{i}", lin.weight)
                    if op["bias"]:
                        setattr(self, f"b{i}", lin.bias)
            elif kind == "glu":
                n, k = shape(op["w"], dims)
                for name in ("lin", "up"):
                    lin = nn.Linear(k, n, bias=False)
                    with torch.no_grad():
                        lin.weight.copy_(torch.randn(n, k, generator=g) / math.sqrt(k))
                    setattr(self, f"{name}{i}", lin)
            elif kind in ("rmsnorm", "layernorm"):
                (n,) = shape(op["w"], dims)
                setattr(self, f"w{i}", nn.Parameter(1.0 + 0.1 * torch.randn(n, generator=g)))
                if kind == "layernorm":
                    setattr(self, f"b{i}", nn.Parameter(0.1 * torch.randn(n, generator=g)))

    def forward(self, a0, a1=None, a2=None, a3=None, a4=None, a5=None, a6=None, a7=None):
        return tuple(self.values([a0, a1, a2, a3, a4, a5, a6, a7])[j] for j in self.outputs)

    def values(self, args: list) -> list:
        """Every value of the graph: the inputs, then one per op."""
        vals = [a for a in args if a is not None]
        for i, op in enumerate(self.ops):
            vals.append(self._op(i, op, vals))
        return vals

    def _op(self, i: int, op: dict, vals: list):
        kind, a = op["op"], op["args"]
        x = vals[a[0]]
        if kind == "unary":
            return UNARY[op["fn"]](x)
        if kind == "binary":
            return BINARY[op["fn"]](x, vals[a[1]])
        if kind == "scalar":
            return SCALAR[op["fn"]](x, op["c"])
        if kind == "reduce":
            return _reduce(x, op["kind"], op["keepdim"])
        if kind == "rmsnorm":
            return _rmsnorm(x, getattr(self, f"w{i}"), op["eps"], op["upcast"], op["weight_first"])
        if kind == "layernorm":
            return _layernorm(x, getattr(self, f"w{i}"), getattr(self, f"b{i}"), op["eps"], op["functional"])
        if kind == "linear":
            if op["module"]:
                y = getattr(self, f"lin{i}")(x)
            else:
                y = F.linear(x, getattr(self, f"w{i}"), getattr(self, f"b{i}", None))
            y = ACT[op["act"]](y)
            if op["residual"] is not None:
                y = y + vals[op["residual"]]
            return y * op["scale"] if op["scale"] != 1.0 else y
        if kind == "reshape":
            return x.reshape(shape(op["shape"], self.dims))
        if kind == "transpose":
            return x.transpose(*op["dims"])
        if kind == "rotary":
            return _rotary(x, vals[a[1]], vals[a[2]], op.get("dim"), op.get("interleaved", False))
        if kind == "glu":  # act(x W_g^T) * (x W_u^T): a dual GEMM
            return ACT[op["act"]](getattr(self, f"lin{i}")(x)) * getattr(self, f"up{i}")(x)
        if kind == "softmax":
            return _softmax(x, op["how"])
        if kind == "sdpa":
            mask = vals[a[3]] if len(a) > 3 else None
            return F.scaled_dot_product_attention(
                x, vals[a[1]], vals[a[2]], attn_mask=mask, is_causal=op["causal"], scale=op["scale"],
                enable_gqa=op["gqa"],
            )  # fmt: skip
        if kind == "attention":
            return _explicit_attention(x, vals[a[1]], vals[a[2]], op["causal"], op["scale"])
        if kind == "inplace":  # writes x: every later reader of x sees the new value
            return _inplace(x, vals[a[1]] if len(a) > 1 else None, op["fn"])
        raise ValueError(f"unknown op {kind!r}")


def build(spec: dict) -> FuzzModule:
    """The nn.Module (float32) of a spec."""
    return FuzzModule(spec).eval()


def make_inputs(spec: dict, dtype: torch.dtype) -> list[torch.Tensor]:
    """The spec's inputs, drawn from its seed: normal values, cos/sin of shared angles, masks."""
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    dims, out, angles = spec["dims"], [], {}
    for inp in spec["inputs"]:
        s, kind = shape(inp["shape"], dims), inp["kind"]
        if kind == "randn":
            out.append((inp.get("scale", 1.0) * torch.randn(s, generator=g)).to(dtype))
        elif kind in ("cos", "sin"):
            key = (inp["angle"], s)
            ang = angles.setdefault(key, 3.0 * torch.rand(s, generator=g))
            out.append((ang.cos() if kind == "cos" else ang.sin()).to(dtype))
        elif kind == "mask_bool":
            m = torch.rand(s, generator=g) > 0.3
            m[..., 0] = True  # no fully masked row (eager gives NaN there)
            out.append(m)
        else:  # mask_add: 0 where kept, -inf where masked
            keep = torch.rand(s, generator=g) > 0.3
            keep[..., 0] = True
            out.append(torch.where(keep, 0.0, float("-inf")).to(dtype))
    return out


def valid(spec: dict) -> bool:
    """Whether the spec's graph runs (shapes agree) and every value is non-empty: an eager run on meta tensors."""
    try:
        m = build(spec).to("meta")
        dtypes = [torch.bool if i["kind"] == "mask_bool" else torch.float32 for i in spec["inputs"]]
        shapes = [shape(i["shape"], spec["dims"]) for i in spec["inputs"]]
        args = [torch.empty(s, device="meta", dtype=dt) for s, dt in zip(shapes, dtypes)]
        with torch.no_grad():
            vals = m.values(args + [None] * (MAX_INPUTS - len(args)))
        return len(spec["inputs"]) <= MAX_INPUTS and all(v.numel() > 0 for v in vals)
    except Exception:  # noqa: BLE001 - any failure means the shapes do not fit
        return False


# -- random specs -----------------------------------------------------------------------------------


def _ragged(rng: random.Random, lo: int = 1, hi: int = 48) -> int:
    """A dim in lo..hi, not a multiple of 16, small more often (the interpreter is slow)."""
    while True:
        v = min(hi, max(lo, int(rng.triangular(lo, hi, lo))))
        if v % 16:
            return v


@dataclass
class _Draft:
    """A spec being drawn. Values have stable ids while drawing; `spec()` numbers them (inputs first)."""

    rng: random.Random
    dims: dict[str, int] = field(default_factory=dict)
    inputs: list[tuple[int, dict]] = field(default_factory=list)
    ops: list[tuple[int, dict]] = field(default_factory=list)
    shapes: dict[int, list] = field(default_factory=dict)  # value id -> shape entries
    floats: set[int] = field(default_factory=set)  # ids of float values (masks are not)
    views: dict[int, int] = field(default_factory=dict)  # value id -> the value it is a view of
    extra_outputs: list[int] = field(default_factory=list)  # values returned besides the last one
    angle_pairs: int = 0

    def dim(self, value: int) -> str:
        name = f"d{len(self.dims)}"
        self.dims[name] = value
        return name

    def _new(self, shp: list, is_float: bool) -> int:
        vid = len(self.shapes)
        self.shapes[vid] = shp
        if is_float:
            self.floats.add(vid)
        return vid

    def inp(self, shp: list, kind: str = "randn", **kw) -> int:
        vid = self._new(shp, kind != "mask_bool")
        self.inputs.append((vid, {"shape": shp, "kind": kind, **kw}))
        return vid

    def op(self, shp: list, **op) -> int:
        vid = self._new(shp, True)
        self.ops.append((vid, op))
        if op["op"] in ("reshape", "transpose", "inplace"):
            self.views[vid] = self.views.get(op["args"][0], op["args"][0])
        return vid

    def pick(self, pred=lambda s: True) -> int | None:
        """A float value satisfying pred, recent ones more often."""
        cands = [i for i, s in self.shapes.items() if i in self.floats and pred(s)]
        if not cands:
            return None
        return cands[-1] if self.rng.random() < 0.5 else self.rng.choice(cands)

    def size(self, entry) -> int:
        return size(entry, self.dims)

    def spec(self, seed: int, dtype: str, outputs: list[int]) -> dict:
        order = {vid: k for k, vid in enumerate([v for v, _ in self.inputs] + [v for v, _ in self.ops])}
        ops = []
        for _, op in self.ops:
            op = dict(op, args=[order[a] for a in op["args"]])
            if op.get("residual") is not None:
                op["residual"] = order[op["residual"]]
            ops.append(op)
        inputs = [i for _, i in self.inputs]
        return {"seed": seed, "dtype": dtype, "dims": dict(self.dims), "inputs": inputs, "ops": ops,
                "outputs": [order[o] for o in outputs]}  # fmt: skip


def _broadcast_partner(d: _Draft, s: list, grow: bool = True) -> tuple[int, list]:
    """A value to combine with a value of shape s, and the shape of the result: an existing value whose
    shape broadcasts with s (maybe the same value, maybe 0-d; with `grow`, maybe to a larger shape), or a
    new input that broadcasts to s."""
    rng = d.rng
    cs, fits = shape(s, d.dims), []
    for v, t in d.shapes.items():
        if v not in d.floats:
            continue
        try:
            b = torch.broadcast_shapes(cs, shape(t, d.dims))
        except RuntimeError:
            continue
        if b == cs:
            fits.append((v, s))
        elif grow and b == shape(t, d.dims):
            fits.append((v, t))
    if fits and rng.random() < 0.5:
        return rng.choice(fits)
    choices = [s, s[-1:], [*s[:-1], 1], []] if s else [[]]
    if len(s) > 1:
        choices.append([1, *s[1:]])
    return d.inp(rng.choice(choices)), s


def _gen_attention(d: _Draft, explicit: bool) -> None:
    rng = d.rng
    src = d.pick(lambda t: len(t) == 3) if rng.random() < 0.6 else None
    if src is not None:
        b, s, e = d.shapes[src]
    else:
        b, s = d.dim(_ragged(rng, 1, 3)), d.dim(_ragged(rng, 1, 24))
    hk = d.dim(rng.choice([1, 2]))
    groups = 1 if explicit else rng.choice([1, 1, 2])
    hq = hk if groups == 1 else f"{hk}*{d.dim(groups)}"
    hd = d.dim(rng.choice([16, 16, 32, 8, 12]))  # powers of two >= 16 run the template; others its reference
    causal = rng.random() < 0.5
    length = s if causal or src is not None or rng.random() < 0.5 else d.dim(_ragged(rng, 1, 24))

    def heads(h: str) -> int:
        if src is not None and rng.random() < 0.8:  # project, split heads, transpose
            y = d.op([b, s, f"{h}*{hd}"], op="linear", args=[src], w=[f"{h}*{hd}", e], bias=rng.random() < 0.3,
                     module=rng.random() < 0.5, act="none", residual=None, scale=1.0)  # fmt: skip
            y = d.op([b, s, h, hd], op="reshape", args=[y], shape=[b, s, h, hd])
            return d.op([b, h, s, hd], op="transpose", args=[y], dims=[1, 2])
        return d.inp([b, h, s if h == hq else length, hd])

    q, k, v = heads(hq), heads(hk), heads(hk)
    out_shape = [b, hq, s, hd]
    if explicit:
        o = d.op(out_shape, op="attention", args=[q, k, v], causal=causal, scale=1.0 / math.sqrt(d.size(hd)))
    else:
        args = [q, k, v]
        if not causal and rng.random() < 0.4:
            args.append(d.inp(rng.choice([[s, length], [b, 1, s, length]]), rng.choice(["mask_bool", "mask_add"])))
        o = d.op(out_shape, op="sdpa", args=args, causal=causal, scale=rng.choice([None, 0.3]), gqa=groups > 1)
    if rng.random() < 0.7:  # merge the heads back
        o = d.op([b, s, hq, hd], op="transpose", args=[o], dims=[1, 2])
        d.op([b, s, f"{hq}*{hd}"], op="reshape", args=[o], shape=[b, s, f"{hq}*{hd}"])


def _gen_op(d: _Draft) -> None:
    rng = d.rng
    kind = rng.choices(
        ["unary", "binary", "scalar", "reduce", "rmsnorm", "layernorm", "linear", "reshape", "transpose", "rotary",
         "softmax", "sdpa", "attention", "inplace", "glu", "add_rmsnorm"],
        weights=[14, 12, 6, 6, 6, 4, 14, 4, 4, 5, 5, 3, 2, 5, 3, 3],
    )[0]  # fmt: skip
    if kind in ("sdpa", "attention"):
        _gen_attention(d, kind == "attention")
        return
    pointwise = kind in ("unary", "binary", "scalar")
    x = d.pick(lambda t: pointwise or len(t) >= 1)  # 0-d values (full reductions, scalars) feed pointwise ops only
    if x is None:
        return
    s = d.shapes[x]
    if kind == "unary":
        d.op(s, op="unary", args=[x], fn=rng.choice(sorted(UNARY)))
    elif kind == "binary":
        y, shp = _broadcast_partner(d, s)
        d.op(shp, op="binary", args=[x, y] if rng.random() < 0.7 else [y, x], fn=rng.choice(sorted(BINARY)))
    elif kind == "scalar":
        d.op(s, op="scalar", args=[x], fn=rng.choice(sorted(SCALAR)), c=rng.choice([0.5, 2.0, -1.5, 3.0]))
    elif kind == "reduce":
        keep = rng.random() < 0.6
        if rng.random() < 0.2:
            d.op([], op="reduce", args=[x], kind=rng.choice(["all_sum", "all_mean", "all_max"]), keepdim=False)
        else:
            kind = rng.choice(["sum", "mean", "amax"])
            d.op(s[:-1] + [1] if keep else s[:-1], op="reduce", args=[x], kind=kind, keepdim=keep)
    elif kind == "rmsnorm":
        d.op(s, op=kind, args=[x], w=s[-1:], eps=rng.choice([1e-5, 1e-6]), upcast=rng.random() < 0.5,
             weight_first=rng.random() < 0.5)  # fmt: skip
    elif kind == "layernorm":
        d.op(s, op=kind, args=[x], w=s[-1:], eps=rng.choice([1e-5, 1e-6]), functional=rng.random() < 0.3)
    elif kind == "linear" and len(s) >= 2:
        if rng.random() < 0.7:
            n = d.dim(_ragged(rng))
        else:  # heads * head dim, which a later reshape may split
            n = f"{d.dim(rng.choice([2, 3]))}*{d.dim(rng.choice([2, 4, 6, 8]))}"
        out = [*s[:-1], n]
        res = _broadcast_partner(d, out, grow=False)[0] if rng.random() < 0.35 else None
        d.op(out, op="linear", args=[x], w=[n, s[-1]], bias=rng.random() < 0.5, module=rng.random() < 0.5,
             act=rng.choice(sorted(ACT)), residual=res, scale=rng.choice([1.0, 1.0, 0.5]))  # fmt: skip
    elif kind == "reshape":
        if len(s) >= 2 and rng.random() < 0.5:  # merge the two leading dims
            t = [f"{s[0]}*{s[1]}", *s[2:]]
        elif isinstance(s[-1], str) and "*" in s[-1]:  # split a product dim (heads)
            t = [*s[:-1], *s[-1].split("*", 1)]
        else:
            t = [*s[:-1], 1, s[-1]]
        d.op(t, op="reshape", args=[x], shape=t)
    elif kind == "transpose" and len(s) >= 2:
        i, j = rng.sample(range(len(s)), 2)
        t = list(s)
        t[i], t[j] = t[j], t[i]
        d.op(t, op="transpose", args=[x], dims=[i, j])
    elif kind == "rotary":
        x = d.pick(lambda t: len(t) >= 2 and d.size(t[-1]) % 2 == 0)
        if x is None:
            return
        s = d.shapes[x]
        last = d.size(s[-1])
        partial = [r for r in (2, 4, 8, 16) if r < last and last % r == 0]
        dim = rng.choice(partial) if partial and rng.random() < 0.3 else None
        cs = [*rng.choice([s[-2:-1], [], s[:-1]]), dim if dim is not None else s[-1]]
        d.angle_pairs += 1
        c, sn = d.inp(cs, "cos", angle=d.angle_pairs), d.inp(cs, "sin", angle=d.angle_pairs)
        d.op(s, op="rotary", args=[x, c, sn], dim=dim, interleaved=rng.random() < 0.3)
    elif kind == "glu" and len(s) >= 2:
        n = d.dim(_ragged(rng))
        d.op([*s[:-1], n], op="glu", args=[x], w=[n, s[-1]], act=rng.choice(["silu", "gelu", "gelu_tanh"]))
    elif kind == "add_rmsnorm":  # a residual stream: both the sum and its norm live on
        total = d.op(s, op="binary", args=[x, _broadcast_partner(d, s, grow=False)[0]], fn="add")
        d.op(s, op="rmsnorm", args=[total], w=s[-1:], eps=1e-6, upcast=rng.random() < 0.5, weight_first=True)
        d.extra_outputs.append(total)
    elif kind == "softmax":
        d.op(s, op="softmax", args=[x], how=rng.choice(["torch", "explicit", "fp32"]))
    elif kind == "inplace":
        # an op's own result that no view shares (eager writes through views; the compiler refuses that)
        inputs = {v for v, _ in d.inputs}
        x = d.pick(lambda t: True)
        shared = x in inputs or x in d.views or x in d.views.values()
        if not shared:
            fn = rng.choice(["add_", "copy_", "mul_", "relu"])
            y = [d.inp(rng.choice([s, s[-1:], [*s[:-1], 1], []]))] if fn in ("add_", "copy_") else []
            d.op(s, op="inplace", args=[x, *y], fn=fn)


def default_dtypes() -> list[str]:
    """fp32 and fp16; bf16 only with CUDA (the interpreter computes bf16 dots wrongly)."""
    return ["float32", "float16"] + (["bfloat16"] if torch.cuda.is_available() else [])


def random_spec(rng: random.Random, dtype: str | None = None, max_ops: int = 7) -> dict:
    """A random valid spec: 1..max_ops drawing steps (an attention draws its projections and views too)."""
    while True:
        d = _Draft(rng)
        seed = rng.randrange(2**31)
        dt = dtype or rng.choice(default_dtypes())
        rank = rng.choice([2, 3, 3])
        lead = [d.dim(_ragged(rng, 1, 4)), d.dim(_ragged(rng, 1, 12))][: rank - 1]
        d.inp([*lead, d.dim(_ragged(rng))])
        for _ in range(rng.randint(1, max_ops)):
            _gen_op(d)
        if not d.ops:
            continue
        op_ids = [v for v, _ in d.ops]
        outs = [op_ids[-1], *(v for v in d.extra_outputs if v != op_ids[-1])]
        if len(op_ids) > 1 and rng.random() < 0.3:
            outs.append(rng.choice(op_ids[:-1]))
        outs = list(dict.fromkeys(outs))
        spec = d.spec(seed, dt, outs)
        if valid(spec):
            return spec


# -- the differential check ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one backend did with a spec: None, or the kind ("error" / "mismatch") and a message."""

    backend: str
    failure: str | None = None
    message: str = ""
    kernels: Counter = field(default_factory=Counter)  # kernels launched, by pattern
    fallbacks: int = 0


def reference_values(spec: dict) -> tuple[list[torch.Tensor], list[torch.Tensor], float] | None:
    """(inputs in the spec's dtype, float64 outputs, scale), or None when the graph is out of range in float64."""
    dtype = DTYPES[spec["dtype"]]
    inputs = make_inputs(spec, dtype)
    m64 = build(spec).to(dtype).to(torch.float64)  # weights rounded to the dtype, computed exactly
    x64 = [x.double() if x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        vals = m64.values(x64 + [None] * (MAX_INPUTS - len(x64)))
    outs = [vals[j] for j in spec["outputs"]]
    if not all(torch.isfinite(o).all() for o in outs):
        return None
    finite = [v[torch.isfinite(v)] for v in vals if v.is_floating_point()]
    scale = max((f.abs().max().item() for f in finite if f.numel()), default=0.0)
    if scale > MAGNITUDE_LIMIT:
        return None
    return inputs, outs, scale


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def check(spec: dict, backends: list[str]) -> list[Outcome] | None:
    """Compile the spec with each backend and compare with eager; None when the spec is out of range."""
    ref = reference_values(spec)
    if ref is None:
        return None
    inputs, truth, scale = ref
    dtype = DTYPES[spec["dtype"]]
    model = build(spec).to(dtype)
    eager_inputs = [x.clone() for x in inputs]
    with torch.no_grad():
        eager = model(*eager_inputs)  # a graph that writes an input writes this copy
    if not all(torch.isfinite(e).all() for e in eager):
        return None
    eager_err = [_max_err(e, t) for e, t in zip(eager, truth)]
    tol = ULPS[dtype] * torch.finfo(dtype).eps
    results = []
    for backend in backends:
        if backend == "interpret" and dtype == torch.bfloat16:
            continue  # the Triton interpreter computes bf16 dots wrongly
        res = Outcome(backend)
        results.append(res)
        dev = "cuda" if backend == "triton" else "cpu"
        m = model if dev == "cpu" else copy.deepcopy(model).to(dev)
        xs = [x.to(dev, copy=True) for x in inputs]
        try:
            cm = dc.compile(m, backend=backend, cuda_graphs=False)
            with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outs = cm(*xs)
            res.fallbacks = sum("dlblas_compiler" in str(w.message) for w in caught)
            summaries = getattr(cm._spec().executor, "kernel_summaries", lambda: [])()
            res.kernels.update(k["pattern"] for k in summaries if k["impl"] == "kernel")
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            text = str(e).strip()
            res.failure, res.message = "error", f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
            continue
        if any(not torch.equal(a.cpu(), b) for a, b in zip(xs, eager_inputs)):
            res.failure, res.message = "mismatch", "the inputs after the call differ from eager's"
            continue
        for i, (o, e, t, ee) in enumerate(zip(outs, eager, truth, eager_err)):
            o = o.cpu()
            if o.dtype != e.dtype or o.shape != e.shape:
                got, want = f"{o.dtype}{tuple(o.shape)}", f"{e.dtype}{tuple(e.shape)}"
                res.failure, res.message = "mismatch", f"output {i}: {got} vs eager {want}"
                break
            if not torch.equal(torch.isfinite(o), torch.isfinite(t)):
                res.failure, res.message = "mismatch", f"output {i}: non-finite values where float64 eager has none"
                break
            err, bound = _max_err(o, t), tol * scale + 4 * ee
            if err > bound:
                res.failure = "mismatch"
                res.message = f"output {i}: max error {err:.3g} > bound {bound:.3g} (scale {scale:.3g}, eager {ee:.3g})"
                break
    return results


def first_failure(spec: dict, backends: list[str]) -> Outcome | None:
    results = check(spec, backends)
    return next((r for r in results or [] if r.failure), None)


# -- shrinking ------------------------------------------------------------------------------------------


def _drop_op(spec: dict, i: int) -> dict | None:
    """The spec without op i; its users read its first operand instead (None if that is impossible)."""
    s = copy.deepcopy(spec)
    n_in = len(s["inputs"])
    v = n_in + i
    sub = s["ops"][i]["args"][0]
    del s["ops"][i]

    def remap(j):
        return sub if j == v else j - 1 if j > v else j

    for op in s["ops"]:
        op["args"] = [remap(j) for j in op["args"]]
        if op.get("residual") is not None:
            op["residual"] = remap(op["residual"])
    s["outputs"] = sorted({remap(j) for j in s["outputs"]})
    if not s["ops"] or any(j < n_in for j in s["outputs"]):
        return None
    return _drop_unused_inputs(s)


def _drop_unused_inputs(spec: dict) -> dict:
    used = {j for op in spec["ops"] for j in op["args"]}
    used |= {op["residual"] for op in spec["ops"] if op.get("residual") is not None}
    keep = [i for i in range(len(spec["inputs"])) if i in used]
    if len(keep) == len(spec["inputs"]):
        return spec
    n_in = len(spec["inputs"])
    new = {old: k for k, old in enumerate(keep)}

    def remap(j):
        return new[j] if j < n_in else j - (n_in - len(keep))

    for op in spec["ops"]:
        op["args"] = [remap(j) for j in op["args"]]
        if op.get("residual") is not None:
            op["residual"] = remap(op["residual"])
    spec["outputs"] = [remap(j) for j in spec["outputs"]]
    spec["inputs"] = [spec["inputs"][i] for i in keep]
    return spec


def _candidates(spec: dict):
    """Smaller specs: fewer ops, fewer outputs, smaller dims, float32 instead of float16."""
    for i in reversed(range(len(spec["ops"]))):
        s = _drop_op(spec, i)
        if s is not None:
            yield s
    if len(spec["outputs"]) > 1:
        for j in spec["outputs"]:
            s = copy.deepcopy(spec)
            s["outputs"] = [j]
            yield s
    for name, value in spec["dims"].items():
        for smaller in sorted({1, value // 2, value - 1}):
            if 1 <= smaller < value:
                s = copy.deepcopy(spec)
                s["dims"][name] = smaller
                yield s
    if spec["dtype"] != "float32":
        s = copy.deepcopy(spec)
        s["dtype"] = "float32"
        yield s


def shrink(spec: dict, failure: Outcome, backends: list[str], budget: int = 200) -> dict:
    """The smallest spec found (greedy, up to `budget` checks) that fails with the same backend and kind."""
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for cand in _candidates(spec):
            if tries >= budget:
                break
            if not valid(cand):
                continue
            tries += 1
            out = first_failure(cand, [failure.backend])
            if out is not None and out.failure == failure.failure:
                spec, improved = cand, True
                break
    return spec


# -- regressions ------------------------------------------------------------------------------------------


def save_regression(spec: dict, failure: Outcome, directory: Path = REGRESSIONS) -> Path:
    """Write the spec (with what it did) as JSON under `directory`, named by its content."""
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(spec, sort_keys=True)
    path = directory / f"{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    record = {"spec": spec, "backend": failure.backend, "failure": failure.failure, "message": failure.message}
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load_regressions(directory: Path = REGRESSIONS) -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def default_backends() -> list[str]:
    return ["reference", "interpret"] + (["triton"] if torch.cuda.is_available() else [])
