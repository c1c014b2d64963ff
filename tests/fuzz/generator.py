"""Differential fuzzing: random modules built from the ops the compiler supports, checked against eager.

A *spec* is plain JSON data: named dims (`{"d0": 7, ...}`), inputs (a shape and how to fill it), a list
of ops over numbered values (the inputs first, then one value per op), the outputs and the structure
they come back in. Shapes are lists of entries, each an int or a product of dim names ("d2*d3"), so a
spec stays consistent when a dim is shrunk. `build(spec)` turns a spec into an `nn.Module` (a
fixed-signature forward that symbolic_trace follows); `random_spec(rng)` draws one; `check(spec,
backends)` compiles it with each backend and compares with eager; `shrink(spec, ...)` reduces a failing
spec while it keeps failing the same way.

Besides fresh dense tensors, specs hold the inputs and outputs everyday models see:
- attention masks, bool or additive (-inf), random or as models build them (causal, a band, a padded tail: whole
  key tiles kept or dropped), on SDPA and on the explicit softmax(q k^T s + mask) v, with
  padded and fully masked query rows (`"masked_rows": true`; eager gives 0 there for SDPA, NaN for the
  explicit form);
- an input that is another input passed again (`{"kind": "same", "of": k}`: `cm(x, x)`), maybe written
  in place; in-place writes through views (slices, reshapes, transposes) and to tensors views share, read
  through every name afterwards (strided slices among those views);
- inputs given as views (`"layout"`): "transpose" (last two dims), "step" (every other element of a
  wider tensor, NaN between), "offset" (a storage offset, NaN before) and "expand" (`expand()`-ed along
  `expand_dim`, stride 0);
- int64 index inputs, sliced and `.contiguous().view(...)`-ed into torch.gather and cross_entropy, and
  float slices and `.contiguous().view(...)` chains;
- cache writes: `dest.index_copy_(dim, positions, x)` into an input along a leading dim, at distinct positions
  in any order (`"positions"`: a static KV cache's update, which the GEMM epilogue and the row kernel store);
- outputs eager returns as fresh tensors where the IR sees one value: x.clone(), x * 1.0, x + 0.0, a
  parameter's clone, the same expression twice, y beside y.clone(); one value returned twice;
- outputs wrapped in a namedtuple, a dataclass, a dict or a list (`"structure"`);
- calls passing the inputs by keyword, in any order (`"call"`), an input passed twice then by two keywords;
- fp32 graphs called inside `torch.autocast` to bf16 (`"autocast"`), eager's calls and the compiled ones alike.

The oracle: float64 eager on the same (dtype-rounded) inputs and weights is the truth (specs where eager
in the dtype puts NaN or inf elsewhere than the truth are out of range). An output passes when it has
eager's container types, dtype and shape, is contiguous where eager's is, has NaN and inf exactly where
the truth has them, and on the finite elements
    max |out - truth| <= ULPS[dtype] * eps(dtype) * scale + 4 * max |eager(dtype) - truth|,
where `scale` is the largest finite magnitude of any intermediate value: a forward-error bound (relative
error is meaningless after cancellation, as in x - mean(x) of a nearly constant row), widened by
eager's own error in the same dtype (an ill-conditioned op amplifies rounding in eager too), the larger of
eager on the inputs as given and on contiguous copies of them (torch.mean of a constant row of 8 floats is
exact on an expanded input and an ulp off on its contiguous copy: a compiled program may copy). Measured on
fuzzed graphs, generated kernels stay within 1.5 eps * scale (fp32) and 0.7 eps * scale (fp16; kernels
compute in fp32 and round once per region output), so ULPS leaves a margin of about 10 and 6: a
kernel off by a few percent on some elements fails. A graph called inside autocast takes bf16's ULPS and eps: its
linears, and the ops after them in their dtype, compute in bf16.

Beyond values: the inputs after the call equal eager's (in-place writes); outputs eager returns as
distinct storages are distinct, and share no storage with an input or a parameter where eager's do not;
writing into them changes neither the inputs, nor the parameters, nor what the next call returns. And no
fallback: every `dl.fused` region runs its generated kernel (a region on its reference counts as a
fallback unless its reason is one EXPECTED_REFERENCE lists) and the call emits no dlblas_compiler warning.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
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
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

import dlblas_compiler as dc

MAX_INPUTS = 8
ULPS = {torch.float32: 16, torch.float16: 4, torch.bfloat16: 4}
MAGNITUDE_LIMIT = 1e3  # specs whose float64 intermediates exceed this are redrawn (fp16 overflows at 65504)
REGRESSIONS = Path(__file__).parent / "regressions"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
LAYOUTS = ("transpose", "step", "offset", "expand")
STRUCTURES = ("tuple", "namedtuple", "dataclass", "dict", "list")
# The reasons a region may run its reference without counting as a fallback, by backend (start of the text).
EXPECTED_REFERENCE = {
    "reference": ("reference backend", "empty tensors"),
    "interpret": ("empty tensors",),
    "triton": ("empty tensors", "a lone GEMM runs on cuBLAS", "the reference (torch / cuBLAS) measured faster"),
}


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
    "pow_odd": lambda x: x.pow(9),  # (a power past the cube: NaN for negative x before NOTES 153)
    "pow_frac": lambda x: x.abs() ** 1.5,
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
# Values equal to x that eager returns as fresh tensors (x itself for .contiguous() of a contiguous x).
IDENTITY = {
    "clone": lambda x: x.clone(),
    "mul1": lambda x: x * 1.0,
    "add0": lambda x: x + 0.0,
    "contiguous": lambda x: x.contiguous(),
}


# -- shapes -----------------------------------------------------------------------------------------


def size(entry: int | str, dims: dict[str, int]) -> int:
    """An int, or a product of dim names and ints ("d1*d2", "1*d3")."""
    if isinstance(entry, int):
        return entry
    return math.prod(int(d) if d.isdigit() else dims[d] for d in entry.split("*"))


def shape(entries: list, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(size(e, dims) for e in entries)


def product(entries: list) -> int | str:
    """One entry for the product of entries (1 for none)."""
    return "*".join(str(e) for e in entries) if entries else 1


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


def _explicit_attention(q, k, v, causal: bool, scale: float, mask=None):
    """softmax(q k^T * scale + mask) v: NaN on a row whose keys are all masked, as in eager."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        n, m = s.shape[-2], s.shape[-1]
        s = s + torch.full((n, m), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
    if mask is not None:
        s = s + mask
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


def _slice_index(dim: int, start: int, n: int, step: int) -> tuple:
    """x[index] takes n elements of dim `dim` from `start` on, every `step`-th (fewer where x is too short:
    valid() rejects that)."""
    return (slice(None),) * dim + (slice(start, start + step * (n - 1) + 1, step),)


FuzzPair = collections.namedtuple("FuzzPair", "main rest")


@dataclass
class FuzzResult:
    main: torch.Tensor
    rest: list


def _structure(outs: tuple, how: str):
    """The outputs as the spec's structure returns them (a namedtuple or dataclass: the first, then the rest)."""
    if how == "namedtuple":
        return FuzzPair(outs[0], outs[1:])
    if how == "dataclass":
        return FuzzResult(outs[0], list(outs[1:]))
    if how == "dict":
        return {f"o{k}": o for k, o in enumerate(outs)}
    if how == "list":
        return list(outs)
    return outs


def leaves(out) -> list:
    """The tensors of a (structured) output, in the order the spec lists them."""
    if isinstance(out, torch.Tensor):
        return [out]
    if dataclasses.is_dataclass(out):
        return [t for f in dataclasses.fields(out) for t in leaves(getattr(out, f.name))]
    if isinstance(out, dict):
        return [t for v in out.values() for t in leaves(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in leaves(v)]
    return []


def _structure_diff(out, ref, where: str = "the result") -> str | None:
    """Why `out` is not built like eager's `ref` (container types, fields, keys, lengths), or None."""
    if type(out) is not type(ref):
        return f"{where} is a {type(out).__name__}, eager's a {type(ref).__name__}"
    if isinstance(ref, torch.Tensor):
        return None
    if dataclasses.is_dataclass(ref):
        pairs = [(getattr(out, f.name), getattr(ref, f.name), f"{where}.{f.name}") for f in dataclasses.fields(ref)]
    elif isinstance(ref, dict):
        if list(out) != list(ref):
            return f"{where} has keys {list(out)}, eager's {list(ref)}"
        pairs = [(out[k], ref[k], f"{where}[{k!r}]") for k in ref]
    elif isinstance(ref, (list, tuple)):
        if len(out) != len(ref):
            return f"{where} has {len(out)} items, eager's {len(ref)}"
        pairs = [(o, r, f"{where}[{k}]") for k, (o, r) in enumerate(zip(out, ref))]
    else:
        return None if out == ref else f"{where} is {out!r}, eager's {ref!r}"
    return next((d for d in (_structure_diff(*p) for p in pairs) if d), None)


class FuzzModule(nn.Module):
    """The module a spec describes. Weights are filled from the spec's seed (never ones or zeros)."""

    def __init__(self, spec: dict):
        super().__init__()
        self.ops = spec["ops"]
        self.outputs = spec["outputs"]
        self.structure = spec.get("structure", "tuple")
        self.dims = dims = dict(spec["dims"])
        # a lengths spec (`with_lengths`): its moving dim read from an input's size at each call, as models read
        # a length from x.shape (the graph then holds the arithmetic on it)
        moving = (spec.get("lengths") or {}).get("dim")
        self.sized = next(((k, j) for k, inp in enumerate(spec["inputs"]) if inp["kind"] != "same"
                           for j, e in enumerate(inp["shape"]) if e == moving), None)  # fmt: skip
        self.moving = moving
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
            elif kind == "param":
                setattr(self, f"p{i}", nn.Parameter(torch.randn(shape(op["w"], dims), generator=g)))

    def forward(self, a0, a1=None, a2=None, a3=None, a4=None, a5=None, a6=None, a7=None):
        vals = self.values([a0, a1, a2, a3, a4, a5, a6, a7])
        return _structure(tuple(vals[j] for j in self.outputs), self.structure)

    def values(self, args: list) -> list:
        """Every value of the graph: the inputs, then one per op."""
        vals = [a for a in args if a is not None]
        dims = self.dims
        if self.sized is not None:
            k, j = self.sized
            dims = {**self.dims, self.moving: vals[k].shape[j]}
        for i, op in enumerate(self.ops):
            vals.append(self._op(i, op, vals, dims))
        return vals

    def _op(self, i: int, op: dict, vals: list, dims: dict):
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
            return x.reshape(shape(op["shape"], dims))
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
            mask = vals[a[3]] if len(a) > 3 else None
            return _explicit_attention(x, vals[a[1]], vals[a[2]], op["causal"], op["scale"], mask)
        if kind == "inplace":  # writes x: every later reader of x sees the new value
            return _inplace(x, vals[a[1]] if len(a) > 1 else None, op["fn"])
        if kind == "identity":
            return IDENTITY[op["fn"]](x)
        if kind == "param":  # a copy of a parameter; x only gives its shape (dropping the op keeps shapes)
            p = getattr(self, f"p{i}")
            return p.clone() if op["fn"] == "clone" else p * 1.0
        if kind == "slice":
            return x[_slice_index(op["dim"], op["start"], size(op["len"], dims), op["step"])]
        if kind == "cat":
            return torch.cat([vals[j] for j in a], dim=op["dim"])
        if kind == "view":  # the .contiguous().view(...) idiom (a plain .view fails on a non-contiguous x)
            x = x.contiguous()
            return x.view(-1) if op["flat"] else x.view(shape(op["shape"], dims))
        if kind == "gather":
            return torch.gather(x, -1, vals[a[1]])
        if kind == "cache_write":  # writes the destination in place and returns it, as HF's StaticLayer.update
            return x.index_copy_(op["dim"], vals[a[1]], vals[a[2]])
        if kind == "cross_entropy":  # HF's loss: logits flattened to rows, labels a flat index tensor
            return F.cross_entropy(x.reshape(-1, size(op["classes"], dims)), vals[a[1]])
        raise ValueError(f"unknown op {kind!r}")


def build(spec: dict) -> FuzzModule:
    """The nn.Module (float32) of a spec."""
    return FuzzModule(spec).eval()


def _keep(s: tuple, g: torch.Generator, masked_rows: bool, pattern: str | None = None) -> torch.Tensor:
    """Which keys each query row attends to: random, the first key always kept, or a `pattern` as models build
    them, which keeps or drops whole key tiles (causal with the queries last, a band of a third of the keys before
    each query, the first two thirds of the keys); with `masked_rows`, padding (the first keys of one sequence,
    maybe all of them) and one query row that sees no key at all."""
    keep = torch.rand(s, generator=g) > 0.3
    keep[..., 0] = True
    if pattern is not None:
        n, l_ = s[-2], s[-1]
        i, j = torch.arange(n)[:, None] + max(l_ - n, 0), torch.arange(l_)[None, :]
        keep = {"causal": j <= i, "band": (j <= i) & (j > i - max(1, l_ // 3)),
                "tail": (j < max(1, 2 * l_ // 3)).expand(n, l_)}[pattern].expand(s).clone()  # fmt: skip
    if masked_rows and len(s) >= 2:
        pad = int(torch.randint(1, s[-1] + 1, (), generator=g))
        seq = keep[int(torch.randint(s[0], (), generator=g))] if len(s) == 4 else keep
        seq[..., :pad] = False
        keep[..., int(torch.randint(s[-2], (), generator=g)), :] = False
    return keep


def _layout(t: torch.Tensor, inp: dict) -> torch.Tensor:
    """The tensor as the view the input's layout names (the same values; "expand" repeats the first slice)."""
    how = inp.get("layout")
    junk = float("nan") if t.is_floating_point() else True if t.dtype == torch.bool else -1
    if how == "transpose" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "step" and t.dim() >= 1:
        wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), junk, dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    if how == "offset":
        flat = torch.full((t.numel() + 3,), junk, dtype=t.dtype, device=t.device)
        view = flat[3:].view(t.shape)
        view.copy_(t)
        return view
    dim = inp.get("expand_dim", 0)
    if how == "expand" and dim < t.dim():
        return t.narrow(dim, 0, 1).expand(t.shape)
    return t


def make_inputs(spec: dict, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    """The spec's inputs, drawn from its seed (normal values, cos/sin of shared angles, masks, indices), in
    their layouts; an input of kind "same" is an earlier input's tensor again."""
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    dims, out, angles = spec["dims"], [], {}
    for inp in spec["inputs"]:
        kind = inp["kind"]
        if kind == "same":
            out.append(out[inp["of"]])
            continue
        s = shape(inp["shape"], dims)
        if kind == "randn":
            t = (inp.get("scale", 1.0) * torch.randn(s, generator=g)).to(dtype)
        elif kind in ("cos", "sin"):
            key = (inp["angle"], s)
            ang = angles.setdefault(key, 3.0 * torch.rand(s, generator=g))
            t = (ang.cos() if kind == "cos" else ang.sin()).to(dtype)
        elif kind == "index":
            t = torch.randint(size(inp["high"], dims), s, generator=g)
        elif kind == "positions":  # distinct, in range, in any order
            t = torch.randperm(size(inp["high"], dims), generator=g)[: s[0]]
        elif kind == "mask_bool":
            t = _keep(s, g, inp.get("masked_rows", False), inp.get("pattern"))
        else:  # mask_add: 0 where kept, -inf where masked
            t = torch.where(_keep(s, g, inp.get("masked_rows", False), inp.get("pattern")), 0.0, float("-inf")).to(dtype)
        out.append(_layout(t.to(device), inp))
    return out


def _meta_inputs(spec: dict) -> list[torch.Tensor]:
    """The spec's inputs as meta tensors (dtypes, shapes and layouts; no values)."""
    out = []
    for inp in spec["inputs"]:
        if inp["kind"] == "same":
            if shape(inp["shape"], spec["dims"]) != tuple(out[inp["of"]].shape):
                raise ValueError("an input passed twice with two shapes")
            out.append(out[inp["of"]])
            continue
        dt = {"mask_bool": torch.bool, "index": torch.int64, "positions": torch.int64}.get(inp["kind"], torch.float32)
        out.append(_layout(torch.empty(shape(inp["shape"], spec["dims"]), device="meta", dtype=dt), inp))
    return out


def valid(spec: dict) -> bool:
    """Whether the spec's graph runs (shapes agree, slices are as long as they say) and every value is
    non-empty: an eager run on meta tensors."""
    try:
        m = build(spec).to("meta")
        args = _meta_inputs(spec)
        with torch.no_grad():
            vals = m.values(args + [None] * (MAX_INPUTS - len(args)))
        n_in = len(args)
        for i, op in enumerate(spec["ops"]):
            if op["op"] in ("slice", "cat") and vals[n_in + i].shape[op["dim"]] != size(op["len"], spec["dims"]):
                return False
        fit = all(size(i["high"], spec["dims"]) >= size(i["shape"][0], spec["dims"]) for i in spec["inputs"]
                  if i["kind"] == "positions")  # (distinct positions: no more than the destination holds)
        return fit and len(spec["inputs"]) <= MAX_INPUTS and all(v.numel() > 0 for v in vals)
    except Exception:  # noqa: BLE001 - any failure means the shapes do not fit
        return False


# -- random specs -----------------------------------------------------------------------------------


def _ragged(rng: random.Random, lo: int = 1, hi: int = 48) -> int:
    """A dim in lo..hi, not a multiple of 16, small more often (the interpreter is slow)."""
    while True:
        v = min(hi, max(lo, int(rng.triangular(lo, hi, lo))))
        if v % 16:
            return v


# Ops whose result may share its operand's storage in eager (in-place results included).
VIEW_OPS = ("reshape", "transpose", "inplace", "slice", "view")


@dataclass
class _Draft:
    """A spec being drawn. Values have stable ids while drawing; `spec()` numbers them (inputs first)."""

    rng: random.Random
    dims: dict[str, int] = field(default_factory=dict)
    inputs: list[tuple[int, dict]] = field(default_factory=list)
    ops: list[tuple[int, dict]] = field(default_factory=list)
    shapes: dict[int, list] = field(default_factory=dict)  # value id -> shape entries
    floats: set[int] = field(default_factory=set)  # ids of float values (masks and indices are not)
    views: dict[int, int] = field(default_factory=dict)  # value id -> the value it is a view of
    twins: dict[int, int] = field(default_factory=dict)  # input id -> the input it is passed as again
    readonly: set[int] = field(default_factory=set)  # expand()-ed inputs (and their twins): never written
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
        """A new input; sometimes an earlier one of the same shape passed again, sometimes given as a view."""
        rng = self.rng
        if kind == "randn" and not kw and rng.random() < 0.15:
            same = [v for v, i in self.inputs if i["kind"] == "randn" and i["shape"] == shp]
            if same:
                return self.twin(rng.choice(same))
        vid = self._new(shp, kind not in ("mask_bool", "index", "positions"))
        info = {"shape": shp, "kind": kind, **kw}
        if rng.random() < 0.2:
            info["layout"] = rng.choice([h for h in LAYOUTS if len(shp) >= {"transpose": 2, "offset": 0}.get(h, 1)])
            if info["layout"] == "expand":
                info["expand_dim"] = rng.randrange(len(shp))
                self.readonly.add(vid)
        self.inputs.append((vid, info))
        return vid

    def twin(self, of: int) -> int:
        """A new input that is input `of` passed again (the same tensor)."""
        of = self.twins.get(of, of)
        vid = self._new(self.shapes[of], True)
        self.inputs.append((vid, {"shape": self.shapes[of], "kind": "same", "of": of}))
        self.twins[vid] = of
        if of in self.readonly:
            self.readonly.add(vid)
        return vid

    def op(self, shp: list, is_float: bool = True, **op) -> int:
        vid = self._new(shp, is_float)
        self.ops.append((vid, op))
        if op["op"] in VIEW_OPS or (op["op"] == "identity" and op["fn"] == "contiguous"):
            self.views[vid] = self.views.get(op["args"][0], op["args"][0])
        return vid

    def writable(self, x: int) -> bool:
        """Whether an in-place write to x stays within what the compiler supports: x is not expand()-ed; for an
        input passed twice, no view of any of its names is alive; otherwise x may be a view or have views (a write
        through one is put back into the tensor and its other views taken again: frontend/mutation.py; through a
        strided slice, by PyTorch: `importer.TorchView`)."""
        root = self.twins.get(x, x)
        names = {root, *(v for v, r in self.twins.items() if r == root)}
        viewed = set(self.views) | set(self.views.values())
        base = self.views.get(x, x)
        if x in self.readonly or base in self.readonly or (len(names) > 1 and names & viewed):
            return False  # (nor through a view of an expand()-ed input: eager refuses that as well)
        return True

    def pick(self, pred=lambda s: True, ok=lambda v: True) -> int | None:
        """A float value whose shape satisfies pred (and whose id, ok), recent ones more often."""
        cands = [i for i, s in self.shapes.items() if i in self.floats and pred(s) and ok(i)]
        if not cands:
            return None
        return cands[-1] if self.rng.random() < 0.5 else self.rng.choice(cands)

    def size(self, entry) -> int:
        return size(entry, self.dims)

    def spec(self, seed: int, dtype: str, outputs: list[int], structure: str = "tuple") -> dict:
        order = {vid: k for k, vid in enumerate([v for v, _ in self.inputs] + [v for v, _ in self.ops])}
        ops = []
        for _, op in self.ops:
            op = dict(op, args=[order[a] for a in op["args"]])
            if op.get("residual") is not None:
                op["residual"] = order[op["residual"]]
            ops.append(op)
        inputs = [dict(i, of=order[i["of"]]) if i["kind"] == "same" else i for _, i in self.inputs]
        return {"seed": seed, "dtype": dtype, "dims": dict(self.dims), "inputs": inputs, "ops": ops,
                "outputs": [order[o] for o in outputs], "structure": structure}  # fmt: skip


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
    # multiples of 16 run the template (48 in pieces of 32 + 16); others stay unfused; v's head dim may differ
    hd = d.dim(rng.choice([16, 16, 32, 48, 8, 12]))
    hdv = hd if rng.random() < 0.7 else d.dim(rng.choice([16, 32, 48, 8]))
    causal = rng.random() < 0.4
    length = s if causal or src is not None or rng.random() < 0.5 else d.dim(_ragged(rng, 1, 24))

    def heads(h: str, n: str, hd: str) -> int:
        if src is not None and rng.random() < 0.8:  # project, split heads, transpose
            y = d.op([b, s, f"{h}*{hd}"], op="linear", args=[src], w=[f"{h}*{hd}", e], bias=rng.random() < 0.3,
                     module=rng.random() < 0.5, act="none", residual=None, scale=1.0)  # fmt: skip
            y = d.op([b, s, h, hd], op="reshape", args=[y], shape=[b, s, h, hd])
            return d.op([b, h, s, hd], op="transpose", args=[y], dims=[1, 2])
        return d.inp([b, h, n, hd])

    q, k, v = heads(hq, s, hd), heads(hk, length, hd), heads(hk, length, hdv)
    out_shape = [b, hq, s, hdv]
    args = [q, k, v]
    if not causal and rng.random() < 0.8:  # a padding mask, mostly with fully masked rows
        kind = "mask_add" if explicit else rng.choice(["mask_bool", "mask_add"])
        mshape = rng.choice([[s, length], [b, 1, s, length], [b, hq, s, length]])
        pattern = {"pattern": p} if (p := rng.choice([None, None, "causal", "band", "tail"])) else {}
        args.append(d.inp(mshape, kind, masked_rows=rng.random() < 0.7, **pattern))
    if explicit:
        o = d.op(out_shape, op="attention", args=args, causal=causal, scale=1.0 / math.sqrt(d.size(hd)))
    else:
        o = d.op(out_shape, op="sdpa", args=args, causal=causal, scale=rng.choice([None, 0.3]), gqa=groups > 1)
    if rng.random() < 0.7:  # merge the heads back
        o = d.op([b, s, hq, hdv], op="transpose", args=[o], dims=[1, 2])
        if rng.random() < 0.5:
            d.op([b, s, f"{hq}*{hdv}"], op="reshape", args=[o], shape=[b, s, f"{hq}*{hdv}"])
        else:
            d.op([b, s, f"{hq}*{hdv}"], op="view", args=[o], shape=[b, s, f"{hq}*{hdv}"], flat=False)


def _view_target(d: _Draft, s: list) -> tuple[list, bool]:
    """The shape of a .view of a value of shape s: flat (view(-1)), the two leading dims merged, a product
    dim split, or a unit dim inserted; and whether it is the flat one."""
    r = d.rng.random()
    if r < 0.3 or not s:
        return [product(s)], True
    if len(s) >= 2 and r < 0.65:
        return [f"{s[0]}*{s[1]}", *s[2:]], False
    if isinstance(s[-1], str) and "*" in s[-1]:
        return [*s[:-1], *s[-1].split("*", 1)], False
    return [*s[:-1], 1, s[-1]], False


def _index_chain(d: _Draft, rows: int | str, cols: str, high: int | str) -> int:
    """Indices below size(high), of shape [rows, cols]: an int64 input [rows, W] sliced to `cols` columns
    (from column 1 on, or every other column), as HF's shifted labels are. The slice is not contiguous."""
    rng = d.rng
    start, step = rng.choice([(1, 1), (0, 2), (1, 2)])
    width = d.dim(start + step * (d.size(cols) - 1) + 1 + rng.choice([0, 0, 1]))
    base = d.inp([rows, width], "index", high=high)
    return d.op([rows, cols], is_float=False, op="slice", args=[base], dim=1, start=start, len=cols, step=step)


def _gen_op(d: _Draft) -> None:
    rng = d.rng
    kind = rng.choices(
        ["unary", "binary", "scalar", "reduce", "rmsnorm", "layernorm", "linear", "reshape", "transpose", "rotary",
         "softmax", "sdpa", "attention", "inplace", "glu", "add_rmsnorm", "identity", "dup", "param", "slice",
         "view", "gather", "cross_entropy", "twice", "cat", "cache_write"],
        weights=[14, 12, 6, 6, 6, 4, 14, 4, 4, 5, 5, 6, 5, 5, 3, 3, 4, 2, 2, 3, 3, 2, 2, 2, 3, 3],
    )[0]  # fmt: skip
    if kind in ("sdpa", "attention"):
        _gen_attention(d, kind == "attention")
        return
    pointwise = kind in ("unary", "binary", "scalar", "identity")
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
        y = d.op(t, op="transpose", args=[x], dims=[i, j])
        if rng.random() < 0.4:  # x.transpose(..).contiguous().view(..)
            t, flat = _view_target(d, t)
            d.op(t, op="view", args=[y], shape=t, flat=flat)
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
        # an input (maybe passed twice) or an op's result, maybe a view or viewed (a strided slice among those),
        # never an expand()-ed input (eager refuses that)
        x = d.pick(ok=d.writable)
        if x is not None:
            s = d.shapes[x]
            fn = rng.choice(["add_", "copy_", "mul_", "relu"])
            y = [d.inp(rng.choice([s, s[-1:], [*s[:-1], 1], []]))] if fn in ("add_", "copy_") else []
            d.op(s, op="inplace", args=[x, *y], fn=fn)
    elif kind == "twice":  # cm(x, x) writing one name, then reading both (eager: the write shows through both)
        cands = [v for v, i in d.inputs if i["kind"] == "randn" and d.writable(v)]
        a = rng.choice(cands) if cands and rng.random() < 0.5 else d.inp(s)
        if d.writable(a):
            first, second = rng.sample([a, d.twin(a)], 2)
            s = d.shapes[a]
            fn = rng.choice(["add_", "copy_", "mul_", "relu"])
            y = [d.inp(rng.choice([s, s[-1:], []]))] if fn in ("add_", "copy_") else []
            w = d.op(s, op="inplace", args=[first, *y], fn=fn)
            d.op(s, op="binary", args=rng.sample([w, second], 2), fn=rng.choice(["add", "sub", "mul"]))
    elif kind == "identity":  # a fresh copy of x (x itself for .contiguous() of a contiguous x), often beside x
        y = d.op(s, op="identity", args=[x], fn=rng.choice(sorted(IDENTITY)))
        if rng.random() < 0.5 and x not in {v for v, _ in d.inputs}:
            d.extra_outputs += [x, y]
    elif kind == "dup":  # the same expression again, both returned: fresh tensors even where the IR sees one value
        same = [(v, op) for v, op in d.ops if v in d.floats and op["op"] in ("unary", "binary", "scalar", "identity")]
        if same:
            v, op = rng.choice(same)
            d.extra_outputs += [v, d.op(d.shapes[v], **copy.deepcopy(op))]
    elif kind == "param":  # a parameter's copy, returned (and maybe written or computed with later)
        d.extra_outputs.append(d.op(s, op="param", args=[x], w=s, fn=rng.choice(["clone", "mul1"])))
    elif kind == "slice":  # a strided slice, maybe made contiguous and viewed
        dim = rng.randrange(len(s))
        n = d.size(s[dim])
        start, step = rng.choice([0, 1, 1, 2]), rng.choice([1, 1, 2])
        length = len(range(start, n, step)) - rng.choice([0, 0, 1])
        if length >= 1:
            t = list(s)
            t[dim] = d.dim(length)
            y = d.op(t, op="slice", args=[x], dim=dim, start=start, len=t[dim], step=step)
            if rng.random() < 0.5:
                t, flat = _view_target(d, t)
                d.op(t, op="view", args=[y], shape=t, flat=flat)
    elif kind == "view":
        t, flat = _view_target(d, s)
        d.op(t, op="view", args=[x], shape=t, flat=flat)
    elif kind == "cat":  # mostly along the last dim (a row op); parts of any layout, the same value maybe twice
        dim = len(s) - 1 if rng.random() < 0.75 else rng.randrange(len(s))
        fits = lambda t: len(t) == len(s) and all(a == b for i, (a, b) in enumerate(zip(t, s)) if i != dim)  # noqa: E731
        parts = [x]
        for _ in range(rng.choice([1, 1, 2])):
            y = d.pick(fits)
            parts.append(x if y is None or rng.random() < 0.2 else y)
        rng.shuffle(parts)
        t = list(s)
        t[dim] = d.dim(sum(d.size(d.shapes[p][dim]) for p in parts))
        d.op(t, op="cat", args=parts, dim=dim, len=t[dim])
    elif kind == "gather" and len(s) >= 2:  # indices sliced, made contiguous and viewed: x.gather(-1, idx)
        k = d.dim(_ragged(rng, 1, 8))
        idx = _index_chain(d, product(s[:-1]), k, s[-1])
        idx = d.op([*s[:-1], k], is_float=False, op="view", args=[idx], shape=[*s[:-1], k], flat=False)
        d.op([*s[:-1], k], op="gather", args=[x, idx])
    elif kind == "cache_write" and len(s) >= 2:
        # dest.index_copy_(dim, positions, x) along a leading dim (a static KV cache's update at the tokens'
        # positions): dest an input as long or longer there, the positions distinct and in range, in any order
        dim = rng.randrange(len(s) - 1)
        t = list(s)
        t[dim] = d.dim(d.size(s[dim]) + rng.choice([0, 1, 3, 9]))
        dest = d.inp(t)
        pos = d.inp([s[dim]], "positions", high=t[dim])
        d.inputs[-1][1].pop("expand_dim", None)  # (positions repeated by an expand() would race)
        if d.inputs[-1][1].get("layout") == "expand":
            del d.inputs[-1][1]["layout"]
        if d.writable(dest):
            d.op(t, op="cache_write", args=[dest, pos, x], dim=dim)
    elif kind == "cross_entropy" and len(s) >= 2:  # cross_entropy(x rows, labels[..., 1:].contiguous().view(-1))
        labels = _index_chain(d, product(s[:-2]), s[-2], s[-1])
        labels = d.op([product(s[:-1])], is_float=False, op="view", args=[labels], shape=[product(s[:-1])], flat=True)
        d.op([], op="cross_entropy", args=[x, labels], classes=s[-1])


def default_dtypes() -> list[str]:
    """fp32, fp16 and bf16 (the interpreter emulates bf16 correctly)."""
    return ["float32", "float16", "bfloat16"]


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
        op_ids = [v for v, _ in d.ops if v in d.floats]
        if not op_ids:
            continue
        outs = [op_ids[-1], *(v for v in d.extra_outputs if v != op_ids[-1])]
        if len(op_ids) > 1 and rng.random() < 0.3:
            outs.append(rng.choice(op_ids[:-1]))
        outs = list(dict.fromkeys(outs))
        if rng.random() < 0.1:  # one value returned twice
            outs.append(rng.choice(outs))
        structure = rng.choices(STRUCTURES, weights=[6, 1, 1, 1, 1])[0]
        spec = d.spec(seed, dt, outs, structure)
        if valid(spec):  # (how the call passes the inputs: drawn apart, so the graphs of a seed stay as they were)
            spec["call"] = random.Random(f"{seed}-call").choice(["positional", "keywords"])
            if dt == "float32" and random.Random(f"{seed}-autocast").random() < 0.2:
                spec["autocast"] = True  # (eager and compiled calls inside torch.autocast to bf16)
            return spec


# -- the differential check ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one backend did with a spec: None, or the kind ("error" / "mismatch" / "fallback") and a message."""

    backend: str
    failure: str | None = None
    message: str = ""
    kernels: Counter = field(default_factory=Counter)  # kernels launched, by pattern
    fallbacks: list[str] = field(default_factory=list)  # unexpected fallbacks and dlblas_compiler warnings


def _values64(spec: dict) -> tuple[list, list[torch.Tensor]]:
    """(the float64 inputs, every value of the graph) of the spec computed in float64."""
    dtype = DTYPES[spec["dtype"]]
    m64 = build(spec).to(dtype).to(torch.float64)  # weights rounded to the dtype, computed exactly
    wide: dict[int, torch.Tensor] = {}  # an input passed twice stays one tensor (a write shows through both)
    x64 = [wide.setdefault(id(x), x.double() if x.is_floating_point() else x) for x in make_inputs(spec, dtype)]
    with torch.no_grad():
        return x64, m64.values(x64 + [None] * (MAX_INPUTS - len(x64)))


def reference_values(spec: dict) -> tuple[list[torch.Tensor], list[torch.Tensor], float] | None:
    """(the float64 inputs after the call (a graph may write them), float64 outputs, scale), or None when the graph
    is out of range in float64. The outputs may hold NaN (a fully masked attention row); `scale` is over finite
    values."""
    x64, vals = _values64(spec)
    outs = [vals[j] for j in spec["outputs"]]
    if any(op["op"] == "sdpa" and any(not torch.isfinite(vals[a]).all() for a in op["args"][:3]) for op in spec["ops"]):
        # torch's own SDPA kernels can disagree on non-finite q, k or v: on the CPU the math kernel gives NaN for a
        # query row whose scores are all NaN, the flash kernel 0, and which one eager runs depends on the operands'
        # layout (seed 4702, bench/NOTES.md 152). Where the math kernel alone gives other non-finite values, eager
        # has no one answer to compare with: out of range
        with sdpa_kernel([SDPBackend.MATH]):
            _, math = _values64(spec)
        if any(v.is_floating_point() and not (torch.equal(v.isnan(), w.isnan()) and torch.equal(v.isinf(), w.isinf()))
               for v, w in zip(vals, math)):
            return None
    finite = [v[torch.isfinite(v)] for v in vals if v.is_floating_point()]
    scale = max((f.abs().max().item() for f in finite if f.numel()), default=0.0)
    if scale > MAGNITUDE_LIMIT:
        return None
    return x64, outs, scale


def _unread_nonfinite_key(op: dict, vals: list) -> bool:
    """Whether an attention's k or v holds NaN or Inf at a key its mask drops for every query row: eager's math
    turns those rows NaN (NaN + -inf), but the generated attention kernels read no K/V tile the mask drops for
    every row of a block (a static cache's unused tail costs nothing), so whether they see that key depends on the
    tile size. docs/bad-inputs.md states this limit; `check` leaves such a graph out where an attention kernel ran
    and the NaN differ (fuzz finding 610f94b809cb, seed 5501)."""
    if op["op"] not in ("sdpa", "attention") or len(op["args"]) < 4:
        return False
    q, k, v, mask = (vals[a] for a in op["args"][:4])
    dropped = ~mask if mask.dtype == torch.bool else mask == float("-inf")
    rows = q.shape[:-1]  # [..., Hq, S]
    every_row = dropped.expand(*rows, k.shape[-2]).all(-2)  # [..., Hq, L]: the key dropped for every query row
    groups = q.shape[-3] // k.shape[-3]
    bad = ((~torch.isfinite(k)).any(-1) | (~torch.isfinite(v)).any(-1)).repeat_interleave(groups, dim=-2)
    return bool((every_row & bad).any())


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over the elements where b is finite."""
    keep = torch.isfinite(b)
    return (a[keep].double() - b[keep].double()).abs().max().item() if keep.any() else 0.0


def _nonfinite_diff(o: torch.Tensor, t: torch.Tensor) -> str | None:
    """Where o's NaN and inf differ from t's, or None."""
    for name, test in (("NaN", torch.isnan), ("inf", torch.isinf)):
        a, b = test(o), test(t)
        if not torch.equal(a, b):
            return f"{name} at {int(a.sum())} elements, float64 eager at {int(b.sum())} ({int((a != b).sum())} differ)"
    inf = torch.isinf(t)
    if not torch.equal(o[inf].double(), t[inf]):
        return "inf of the other sign than float64 eager's"
    return None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN."""
    nan = a.isnan()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


def _storage(t) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and t.numel() else None


def _alias_diff(outs: list, eager: list, xs: list, eager_xs: list, params: dict, eager_params: dict) -> str | None:
    """Where compiled outputs share a storage that eager's keep apart: another output, an input, a parameter."""
    for i, (o, e) in enumerate(zip(outs, eager)):
        so, se = _storage(o), _storage(e)
        if so is None:
            continue
        for j in range(i):
            if so == _storage(outs[j]) and se != _storage(eager[j]):
                return f"outputs {j} and {i} share storage where eager's do not"
        for k, (x, ex) in enumerate(zip(xs, eager_xs)):
            if so == _storage(x) and se != _storage(ex):
                return f"output {i} shares storage with input {k} where eager's does not"
        for name, p in params.items():
            if so == _storage(p) and se != _storage(eager_params[name]):
                return f"output {i} shares storage with parameter {name!r} where eager's does not"
    return None


def _write_diff(
    call, outs: list, eager: list, xs: list, eager_xs: list, params: dict, eager_params: dict
) -> str | None:
    """The caller writes every output eager returns as its own storage (out.add_(1)): the inputs, the
    parameters and the next call's outputs (`call()`, on fresh inputs) must not change."""
    inputs_before = [x.clone() for x in xs]
    params_before = {n: p.detach().clone() for n, p in params.items()}
    outs_before = [o.clone() for o in outs]
    theirs = {_storage(x) for x in eager_xs} | {_storage(p) for p in eager_params.values()}
    with torch.no_grad():
        for i, (o, e) in enumerate(zip(outs, eager)):
            if _storage(e) not in theirs and o.is_floating_point():
                try:
                    o.add_(1)
                except RuntimeError as err:  # an expanded or otherwise unwritable tensor
                    return f"output {i} cannot be written in place as eager's can ({str(err).splitlines()[0]})"
    for k, (x, before) in enumerate(zip(xs, inputs_before)):
        if not _same(x, before):
            return f"writing the outputs changed input {k}"
    for name, p in params.items():
        if not _same(p.detach(), params_before[name]):
            return f"writing the outputs changed parameter {name!r}"
    again = leaves(call())
    for i, (o, before) in enumerate(zip(again, outs_before)):
        if not _same(o, before):
            return f"output {i} of a second call differs from the first's (which the caller then wrote)"
    return None


def _fallbacks(cm, backend: str, caught: list) -> list[str]:
    """dlblas_compiler warnings (a region falling back, a call run eagerly), and regions running their
    reference for a reason EXPECTED_REFERENCE does not list."""
    found = [str(w.message) for w in caught if str(w.message).startswith("dlblas_compiler")]
    expected = EXPECTED_REFERENCE.get(backend, ())
    for k in cm.report().kernels:
        reason = k.reason
        if k.impl == "reference" and not reason.startswith(expected) and not any(reason in f for f in found):
            found.append(f"region {k.region} ({k.pattern}) runs its reference: {reason or 'no reason given'}")
    return found


def _value_diff(outs: list, eager: list, truth: list, bounds: list[float], xs: list, eager_xs: list,
                written: list, contiguous: list[bool]) -> str | None:  # fmt: skip
    """Where the inputs after the call or the outputs differ from eager's (dtype, shape, contiguity, NaN and
    inf positions, error bound), or None. An input eager leaves alone must be left alone; one eager writes
    ((float64 value after the call, bound) in `written`) is held to the outputs' rule: a chain of in-place ops
    fused into one kernel rounds once in half precision, where eager rounds after each op. `contiguous`: whether
    eager's outputs are contiguous on the backend's device (torch's CUDA SDPA pads a head of under 8 dims and
    returns a slice of its result, where the CPU's is contiguous: fuzz finding 23b7a548ab8b)."""
    for k, (x, ex, w) in enumerate(zip(xs, eager_xs, written)):
        x = x.cpu()
        if _same(x, ex):
            continue
        off = w is None or x.dtype != ex.dtype or x.shape != ex.shape or _nonfinite_diff(x, w[0]) is not None
        if off or _max_err(x, w[0]) > w[1]:
            return f"input {k} after the call differs from eager's by up to {_max_err(x, ex):.3g}"
    for i, (o, e, t, bound, c) in enumerate(zip(outs, eager, truth, bounds, contiguous)):
        if o.dtype != e.dtype or o.shape != e.shape:
            return f"output {i}: {o.dtype}{tuple(o.shape)} vs eager {e.dtype}{tuple(e.shape)}"
        if c and not o.is_contiguous():
            return f"output {i} is not contiguous, eager's is"
        if (bad := _nonfinite_diff(o.cpu(), t)) is not None:
            return f"output {i}: {bad}"
        if (err := _max_err(o.cpu(), t)) > bound:
            return f"output {i}: max error {err:.3g} > bound {bound:.3g}"
    return None


def call(fn, spec: dict, xs: list):
    """`fn(*xs)`, or by keyword (`a0=...`, in an order drawn from the spec's seed, the first input sometimes
    positional) where the spec says so: a compiled module keys and feeds keyword calls its own way."""
    if spec.get("call") != "keywords":
        return fn(*xs)
    rng = random.Random(f"{spec['seed']}-order")
    lead = 1 if len(xs) > 1 and rng.random() < 0.5 else 0
    order = list(range(lead, len(xs)))
    rng.shuffle(order)
    return fn(*xs[:lead], **{f"a{i}": xs[i] for i in order})


def autocast(spec: dict, device: str = "cpu"):
    """The spec's calls' autocast region: bf16 on `device` where the spec says so, else a region that does nothing."""
    return torch.autocast(device, dtype=torch.bfloat16, enabled=bool(spec.get("autocast")))


EAGER_SDPA = [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


class _AlignedSdpa(TorchFunctionMode):
    """Eager's SDPA on a GPU through the math kernel wherever q, k or v is not 16-byte aligned, which torch 2.11's
    fused kernels do not check and fault on (a fault poisons the process): cuDNN's on such a q or v (seed 3902
    graph 183, bench/NOTES.md 132: hence never cuDNN here, `EAGER_SDPA`), flash's on such a k ("misaligned
    address": seed 4901 graph 72, NOTES 154); the memory-efficient kernel refuses such a q ("p.query_ptr is not
    correctly aligned": seed 4701 graph 11, NOTES 152)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            qkv = [*args[:3], *(kwargs[n] for n in ("query", "key", "value") if n in kwargs)]
            if any(t.data_ptr() % 16 for t in qkv):
                with sdpa_kernel([SDPBackend.MATH]):
                    return func(*args, **kwargs)
        return func(*args, **kwargs)


def _check_backend(spec: dict, backend: str, model: nn.Module, want: _Expected) -> Outcome:
    """Compile and call under no_grad, then compare with eager: structure, values, aliasing, writes into
    the outputs and a second call; and collect unexpected fallbacks over both calls."""
    eager_out, eager_xs, truth, bounds, written = want.eager_out, want.eager_xs, want.truth, want.bounds, want.written
    res = Outcome(backend)
    dtype = DTYPES[spec["dtype"]]
    dev = "cuda" if backend == "triton" else "cpu"
    m = model if dev == "cpu" else copy.deepcopy(model).to(dev)
    params, eager_params = dict(m.named_parameters()), dict(model.named_parameters())
    xs = make_inputs(spec, dtype, dev)
    contiguous = [e.is_contiguous() for e in leaves(eager_out)]
    try:
        if dev != "cpu":  # eager's layouts on the device (a copy of the model: a graph may write its parameters)
            # (not through cuDNN's attention, and through the math kernel where q, k or v is not 16-byte aligned:
            # `_AlignedSdpa`; eager's own faults there, not the backend's)
            with torch.no_grad(), _AlignedSdpa(), sdpa_kernel(EAGER_SDPA), autocast(spec, dev):
                on_dev = copy.deepcopy(model).to(dev)(*make_inputs(spec, dtype, dev))
            contiguous = [e.is_contiguous() for e in leaves(on_dev)]
        cm = dc.compile(m, backend=backend, cuda_graphs=False)
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught, autocast(spec, dev):
            warnings.simplefilter("always")
            out = call(cm, spec, xs)
            res.kernels.update(k.pattern for k in cm.report().kernels if k.impl == "kernel")
            outs, eager = leaves(out), leaves(eager_out)
            why = (
                _structure_diff(out, eager_out)
                or _value_diff(outs, eager, truth, bounds, xs, eager_xs, written, contiguous)
                or _alias_diff(outs, eager, xs, eager_xs, params, eager_params)
                or _write_diff(lambda: call(cm, spec, make_inputs(spec, dtype, dev)), outs, eager, xs, eager_xs, params,
                               eager_params)
            )  # fmt: skip
            res.fallbacks = _fallbacks(cm, backend, caught)
    except Exception as e:  # noqa: BLE001 - every exception is a finding
        text = str(e).strip()
        res.failure, res.message = "error", f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
        return res
    if why is not None:
        res.failure, res.message = "mismatch", why
    elif res.fallbacks:
        res.failure, res.message = "fallback", res.fallbacks[0]
    return res


def check(spec: dict, backends: list[str]) -> list[Outcome] | None:
    """Compile the spec with each backend and compare with eager; None when the spec is out of range."""
    if spec.get("lengths"):
        return check_lengths(spec, backends)
    ref = reference_values(spec)
    if ref is None:
        return None
    dtype = DTYPES[spec["dtype"]]
    model = build(spec).to(dtype)
    want = _expected(spec, model, ref)
    if want is None:
        return None
    results = [_check_backend(spec, b, model, want) for b in backends]
    if any(r.failure == "mismatch" and "NaN at" in r.message and r.kernels["attention"] for r in results):
        _, vals = _values64(spec)
        if any(_unread_nonfinite_key(op, vals) for op in spec["ops"]):
            return None  # the attention kernels' documented limit (`_unread_nonfinite_key`)
    return results


@dataclass
class _Expected:
    """What a call of a spec's module must give: eager's outputs and inputs after it, the float64 truth, the bound
    per output and per written input."""

    eager_out: Any
    eager_xs: list
    truth: list
    bounds: list[float]
    written: list


def _expected(spec: dict, model: nn.Module, ref: tuple) -> _Expected | None:
    """Eager's call of `model` on the spec's inputs and the bounds a compiled call is held to (None: out of range)."""
    truth_xs, truth, scale = ref
    dtype = DTYPES[spec["dtype"]]
    eager_xs = make_inputs(spec, dtype)
    try:
        with torch.no_grad(), autocast(spec):
            eager_out = model(*eager_xs)  # a graph that writes an input writes these
    except RuntimeError:
        if spec.get("autocast"):  # eager's own error under autocast (bf16 written into an fp32 tensor): out of range
            return None
        raise
    eager = leaves(eager_out)
    if any(_nonfinite_diff(e, t) for e, t in zip(eager, truth)):
        return None  # eager overflows (or loses a NaN) in the dtype where float64 does not
    copies: dict[int, torch.Tensor] = {}  # one copy per tensor: an input passed twice stays one tensor
    contiguous = [copies.setdefault(id(t), t.contiguous()) for t in make_inputs(spec, dtype)]
    with torch.no_grad(), autocast(spec):  # eager on contiguous copies: torch's own rounding can depend on the layout
        eager_c = leaves(model(*contiguous))
    # (under autocast the linears, and the ops after them in their dtype, compute in bf16: eager rounds each of those
    # ops to bf16 where a region rounds once, so the bound is bf16's; a mean of such values can land nearer the truth
    # in eager by chance than 4x eager's own error allows: fuzz finding a022cc527aca)
    low = torch.bfloat16 if spec.get("autocast") else dtype
    tol = ULPS[low] * torch.finfo(low).eps
    bounds = [tol * scale + 4 * max(_max_err(e, t), _max_err(c, t)) for e, c, t in zip(eager, eager_c, truth)]
    written = [None if not x.is_floating_point() or _same(x, x0) else (t, tol * scale + 4 * _max_err(x, t))
               for x, x0, t in zip(eager_xs, make_inputs(spec, dtype), truth_xs)]  # fmt: skip
    return _Expected(eager_out, eager_xs, truth, bounds, written)


# -- lengths: one compiled module called at several sizes of one dim (shape families) ---------------------------


def _variant(spec: dict, value: int) -> dict:
    """The lengths spec with its moving dim at `value`."""
    return {**spec, "dims": {**spec["dims"], spec["lengths"]["dim"]: value}}


def with_lengths(spec: dict, rng: random.Random, calls: int = 4) -> dict | None:
    """The spec as a lengths spec: a dim read from an input's size (in no parameter's shape) takes `calls` values of
    its power-of-two bucket in turn, the spec's own first (a compile), then others: the second compiles too, the
    rest are a shape family's instances where the two compiles form one. None where no dim qualifies."""
    in_params = {n for op in spec["ops"] for e in op.get("w", []) if isinstance(e, str) for n in e.split("*")}
    plain = {e for inp in spec["inputs"] if inp["kind"] != "same" for e in inp["shape"] if isinstance(e, str)
             and "*" not in e}  # fmt: skip
    for d in rng.sample(sorted(plain - in_params), len(plain - in_params)):
        v = spec["dims"][d]
        top = 1 << (v - 1).bit_length() if v > 1 else 1  # (the bucket of v: `tuning.cache.bucket`)
        lo = top // 2 + 1
        others = [x for x in range(lo, top + 1) if x != v]
        rng.shuffle(others)
        lengths = {**spec, "lengths": {"dim": d}}
        values = [v] + [x for x in others if valid(_variant(lengths, x))][: calls - 1]
        if len(values) == calls and valid(lengths):
            lengths["lengths"]["values"] = values
            return lengths
    return None


def check_lengths(spec: dict, backends: list[str]) -> list[Outcome] | None:
    """A lengths spec (`with_lengths`): per backend one compiled module called at each of its values in turn, each
    call held to eager's answer at that size (values and structure); the message names the length. None where a
    value is out of range."""
    if not all(valid(_variant(spec, v)) for v in spec["lengths"]["values"]):
        return None
    dtype = DTYPES[spec["dtype"]]
    model = build(spec).to(dtype)
    wants = []
    for v in spec["lengths"]["values"]:
        s = _variant(spec, v)
        ref = reference_values(s)
        want = _expected(s, model, ref) if ref is not None else None
        if want is None:
            return None
        wants.append((v, s, want))
    results = []
    for backend in backends:
        res = Outcome(backend)
        try:
            cm = dc.compile(model, backend=backend, cuda_graphs=False)
            with torch.no_grad(), warnings.catch_warnings(record=True) as caught, autocast(spec):
                warnings.simplefilter("always")
                for v, s, want in wants:
                    xs = make_inputs(s, dtype)
                    out = call(cm, s, xs)
                    contiguous = [e.is_contiguous() for e in leaves(want.eager_out)]
                    why = _structure_diff(out, want.eager_out) or _value_diff(
                        leaves(out), leaves(want.eager_out), want.truth, want.bounds, xs, want.eager_xs, want.written,
                        contiguous)  # fmt: skip
                    res.kernels.update(k.pattern for k in cm.report().kernels if k.impl == "kernel")
                    if why is not None:
                        res.failure, res.message = "mismatch", f"{spec['lengths']['dim']} = {v}: {why}"
                        break
                res.kernels["instances"] = cm.instances
                res.fallbacks = [] if res.failure else _fallbacks(cm, backend, caught)
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            text = str(e).strip()
            res.failure, res.message = "error", f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
        if res.fallbacks and not res.failure:
            res.failure, res.message = "fallback", res.fallbacks[0]
        results.append(res)
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
    s["outputs"] = list(dict.fromkeys(remap(j) for j in s["outputs"]))
    if not s["ops"] or any(j < n_in for j in s["outputs"]):
        return None
    return _drop_unused_inputs(s)


def _drop_unused_inputs(spec: dict) -> dict:
    inputs = spec["inputs"]
    used = {j for op in spec["ops"] for j in op["args"]}
    used |= {op["residual"] for op in spec["ops"] if op.get("residual") is not None}
    used |= {inputs[j]["of"] for j in used if j < len(inputs) and inputs[j]["kind"] == "same"}
    keep = [i for i in range(len(inputs)) if i in used]
    if len(keep) == len(inputs):
        return spec
    n_in = len(inputs)
    new = {old: k for k, old in enumerate(keep)}

    def remap(j):
        return new[j] if j < n_in else j - (n_in - len(keep))

    for op in spec["ops"]:
        op["args"] = [remap(j) for j in op["args"]]
        if op.get("residual") is not None:
            op["residual"] = remap(op["residual"])
    spec["outputs"] = [remap(j) for j in spec["outputs"]]
    spec["inputs"] = [dict(inputs[i], of=new[inputs[i]["of"]]) if inputs[i]["kind"] == "same" else inputs[i]
                      for i in keep]  # fmt: skip
    return spec


def _plainer_inputs(spec: dict):
    """The spec with one input plainer: contiguous, its own tensor rather than another passed again, a
    mask without fully masked rows."""
    for k, inp in enumerate(spec["inputs"]):
        plain = None
        if "layout" in inp:
            plain = {key: v for key, v in inp.items() if key not in ("layout", "expand_dim")}
        elif inp["kind"] == "same":
            plain = {"shape": inp["shape"], "kind": "randn"}
        elif inp.get("masked_rows"):
            plain = dict(inp, masked_rows=False)
        if plain is not None:
            s = copy.deepcopy(spec)
            s["inputs"][k] = plain
            yield s


def _candidates(spec: dict):
    """Smaller specs: fewer ops, fewer outputs, plainer inputs and outputs, smaller dims, float32."""
    for i in reversed(range(len(spec["ops"]))):
        s = _drop_op(spec, i)
        if s is not None:
            yield s
    if len(spec["outputs"]) > 1:
        for j in dict.fromkeys(spec["outputs"]):
            s = copy.deepcopy(spec)
            s["outputs"] = [j]
            yield s
    if spec.get("structure", "tuple") != "tuple":
        yield dict(copy.deepcopy(spec), structure="tuple")
    if spec.get("autocast"):
        yield {k: copy.deepcopy(v) for k, v in spec.items() if k != "autocast"}
    yield from _plainer_inputs(spec)
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
            try:
                out = first_failure(cand, [failure.backend])
            except RuntimeError as e:  # eager itself cannot run the candidate (a shape rule valid() does not know)
                print(f"shrink: candidate skipped, eager raised {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
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


def features(spec: dict) -> set[str]:
    """The everyday inputs and outputs a spec exercises (for coverage counts)."""
    n_in, inputs, f = len(spec["inputs"]), spec["inputs"], {f"dtype {spec['dtype']}"}
    f.add(f"structure {spec.get('structure', 'tuple')}")
    for inp in inputs:
        f.add(f"input {inp['kind']}")
        if "layout" in inp:
            f.add(f"layout {inp['layout']}")
        if inp.get("masked_rows"):
            f.add(f"fully masked rows {inp['kind']}")
        if inp.get("pattern"):
            f.add(f"mask pattern {inp['pattern']}")
    views = {n_in + i for i, op in enumerate(spec["ops"]) if op["op"] in ("reshape", "transpose", "slice", "view")}
    viewed = {spec["ops"][v - n_in]["args"][0] for v in views}
    for op in spec["ops"]:
        f.add(f"op {op['op']}" + (f" {op['fn']}" if op["op"] == "identity" else ""))
        if op["op"] == "inplace" and op["args"][0] in views:
            f.add("in-place write through a view")
        elif op["op"] == "inplace" and op["args"][0] in viewed:
            f.add("in-place write to a viewed tensor")
        if op["op"] == "inplace" and op["args"][0] < n_in:
            x = op["args"][0]
            twice = any(i["kind"] == "same" and x in (k, i["of"]) for k, i in enumerate(inputs))
            f.add("in-place write to an input" + (" passed twice" if twice else ""))
        if op["op"] in ("sdpa", "attention") and len(op["args"]) > 3:
            f.add(f"{op['op']} with {inputs[op['args'][3]]['kind']}")
    if len(set(spec["outputs"])) < len(spec["outputs"]):
        f.add("a value returned twice")
    if spec.get("call") == "keywords":
        f.add("call by keyword")
    if spec.get("autocast"):
        f.add("autocast bf16")
    if spec.get("lengths"):
        f.add("lengths")
    return f
