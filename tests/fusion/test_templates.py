"""The template protocol: a user template registered with `register_template` lowers a user pattern without
touching the package, exactly as the built-in templates (registered the same way) lower theirs."""

import torch
import torch.nn as nn

import dlblas_compiler as dc
from dlblas_compiler import P
from dlblas_compiler.codegen.kernel import Kernel
from dlblas_compiler.dialects.types import dtype_of, shape_of
from dlblas_compiler.fusion import TEMPLATES, PATTERNS, KernelTemplate, WhyNot
from dlblas_compiler.tuning import SearchSpace

SOURCE = """@triton.jit
def {name}(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    t = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    tl.store(out_ptr + offs, (t * y).to(out_ptr.dtype.element_ty), mask=mask)
"""


class TanhGate(KernelTemplate):
    """tanh(x) * y over two equal-shaped tensors, one flat program per block of elements."""

    name = "tanh_gate"
    params = {"BLOCK": [64, 128, 256], "num_warps": [1, 2, 4]}

    def can_lower(self, ops, inputs):
        kinds = sorted(o.name for o in ops)
        if kinds != ["dl.mul", "dl.tanh"] or len(inputs) != 2 or shape_of(inputs[0]) != shape_of(inputs[1]):
            return WhyNot("tanh_gate takes tanh(x) * y of one shape")
        return {"n": _numel(inputs[0])}

    def emit(self, fused, plan, name):
        out = fused.yielded.values[0]
        shape, dtype, n = shape_of(out), dtype_of(out), plan["n"]

        def launch(kernel, tensors, config):
            x, y = tensors
            res = torch.empty(shape, dtype=dtype, device=x.device)
            kernel[(-(-n // config["BLOCK"]),)](x, y, res, n, BLOCK=config["BLOCK"], num_warps=config["num_warps"])
            return [res]

        return Kernel(name, SOURCE.format(name=name), launch, str(fused), {"rows": n})

    def space(self, plan):
        return SearchSpace(self.params, default={"BLOCK": 128, "num_warps": 4})


def _numel(v) -> int:
    n = 1
    for d in shape_of(v):
        n *= d
    return n


def tanh_gate(x, y):
    return P.mul(P.tanh(x), y)


class Gate(nn.Module):
    def forward(self, x, y):
        return torch.tanh(x) * y + 1.0


def test_a_user_template_lowers_a_user_pattern():
    dc.register_template(TanhGate())
    dc.register_fusion_pattern("tanh_gate", tanh_gate, "tanh_gate", priority=500)
    try:
        x, y = torch.randn(5, 37), torch.randn(5, 37)
        cm = dc.compile(Gate(), backend="interpret", strict=True)
        with torch.no_grad():
            out = cm(x, y)
        torch.testing.assert_close(out, Gate()(x, y), rtol=1e-6, atol=1e-6)
        rep = cm.report()
        assert "tanh_gate" in rep.patterns and rep.impls()["tanh_gate_0"] == "kernel"
        assert next(r for r in rep.regions if r.pattern == "tanh_gate").template == "tanh_gate"
    finally:
        dc.unregister_fusion_pattern("tanh_gate")
        dc.unregister_template("tanh_gate")
    assert "tanh_gate" not in TEMPLATES and "tanh_gate" not in PATTERNS


def test_what_the_user_template_refuses_is_not_fused_by_it():
    dc.register_template(TanhGate())
    dc.register_fusion_pattern("tanh_gate", tanh_gate, "tanh_gate", priority=500)
    try:
        x, y = torch.randn(5, 37), torch.randn(37)  # y broadcasts: the template says no at planning time
        cm = dc.compile(Gate(), backend="interpret", strict=True)
        with torch.no_grad():
            out = cm(x, y)
        torch.testing.assert_close(out, Gate()(x, y), rtol=1e-6, atol=1e-6)
        rep = cm.report()
        assert "tanh_gate" not in rep.patterns and "tanh_gate takes tanh(x) * y of one shape" in str(rep)
    finally:
        dc.unregister_fusion_pattern("tanh_gate")
        dc.unregister_template("tanh_gate")


def test_the_builtin_templates_are_registered_the_same_way():
    from dlblas_compiler.codegen import attention, gemm, row
    from dlblas_compiler.fusion.templates import PlannedTemplate

    for name, mod in (("row", row), ("gemm", gemm), ("attention", attention)):
        t = TEMPLATES[name]
        assert isinstance(t, PlannedTemplate) and PATTERNS[name].template == name and t.params is mod.PARAMS
        assert (t._analyze, t._build, t._space) == (mod.analyze, mod.build, mod.space)
