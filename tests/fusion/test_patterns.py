"""The user pattern API's guard rails: a template name is checked at registration, a pattern that matches nothing
or whose lowering fails says so in the report (and a failed one leaves its ops to the built-in patterns), `P`
lists its ops, and a placeholder for a linear's bias matches linears with and without one."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler import P
from dlblas_compiler.fusion import TEMPLATES
from dlblas_compiler.numerics import rel_error


def ln_linear_gelu(x, w, b, W, bias):
    return P.gelu(P.linear(P.layer_norm(x, w, b), W, bias))


def run_ln_linear_gelu(x, w, b, W, bias, layer_norm_eps, gelu_approximate):
    return F.gelu(F.linear(F.layer_norm(x, x.shape[-1:], w, b, layer_norm_eps), W, bias), approximate=gelu_approximate)


def missing_attr(x, w, b, W, bias, layer_norm_eps):  # no gelu_approximate: cannot take the region's arguments
    raise AssertionError("never called")


class Block(nn.Module):
    def __init__(self, bias: bool, hidden: int = 32):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.proj = nn.Linear(hidden, 64, bias=bias)

    def forward(self, x):
        return F.gelu(self.proj(self.ln(x)))


@pytest.fixture
def pattern():
    """Registers ln_linear_gelu with the lowering the test passes; unregisters it afterwards."""
    yield lambda lowering: dc.register_fusion_pattern("ln_linear_gelu", ln_linear_gelu, lowering, priority=200)
    dc.unregister_fusion_pattern("ln_linear_gelu")


def _compile(model: nn.Module):
    x = torch.randn(4, 32)
    cm = dc.compile(model.eval(), backend="interpret")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    return cm.report()


def test_a_template_name_typo_fails_at_registration():
    with pytest.raises(ValueError, match=r"no template named 'gemmm'; registered templates: .*attention, gemm, .*row"):
        dc.register_fusion_pattern("typo", ln_linear_gelu, "gemmm")
    assert "typo" not in dc.fusion.PATTERNS


@pytest.mark.parametrize("bias", [True, False])
def test_a_bias_placeholder_matches_linears_with_and_without_bias(pattern, bias):
    pattern(run_ln_linear_gelu)
    rep = _compile(Block(bias))
    assert rep.patterns == ["ln_linear_gelu"] and rep.impls() == {"ln_linear_gelu_0": "callable"}


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_linear_gelu_lowers_to_one_generated_gemm_kernel(pattern, bias):
    """Registered with the GEMM template, LayerNorm→Linear(bias)→GELU is one generated kernel: the LayerNorm is
    the GEMM's prologue (a row pass writing the normalized rows), bias and GELU its epilogue."""
    pattern("gemm")
    rep = _compile(Block(bias))
    assert rep.patterns == ["ln_linear_gelu"] and rep.impls() == {"ln_linear_gelu_0": "kernel"}
    assert "1 fused region: 1 generated kernel" in str(rep)
    # bf16, 37 rows (ragged tiles): as close to a float64 reference as eager is
    model, x = Block(bias).eval(), torch.randn(37, 32)
    with torch.no_grad():
        ref = model.double()(x.double())
        model = model.to(torch.bfloat16)
        out, eager = dc.compile(model, backend="interpret")(x.bfloat16()), model(x.bfloat16())
    assert rel_error(out, ref) <= 1.05 * rel_error(eager, ref) + 1e-6


class NormGelu(nn.Module):  # a LayerNorm no linear reads: a row kernel
    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)

    def forward(self, x):
        return F.gelu(self.ln(x))


@pytest.mark.parametrize("kernel,rows", [("gemm", 9), ("gemm", 40), ("row", 9)],
                         ids=["ln-in-the-k-loop", "ln-prologue-pass", "ln-row-kernel"])  # fmt: skip
def test_constant_rows_normalize_to_the_bias_exactly(kernel, rows):
    """Rows whose values are all equal (here an expanded input) have deviations of exactly 0, as in eager: every
    LayerNorm kernel (a GEMM's K loop normalizing a few rows itself, its prologue pass, the row kernel) corrects the
    mean once by the mean of the deviations from it, where sum / n alone leaves an ulp that the rsqrt of a zero
    variance magnifies ~300x."""
    model = (Block(True, hidden=18) if kernel == "gemm" else NormGelu(18)).eval()  # 18: a sum of equal values rounds
    x = (torch.randn(rows, 1) * 3 + 0.7).expand(rows, 18)
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad():
        out, eager = cm(x), model(x)
    torch.testing.assert_close(out, eager, rtol=1e-6, atol=1e-6)
    (step,) = [s for s in cm._spec().executor.steps if getattr(s, "kernel", None) is not None]
    assert step.kernel.name.startswith(kernel)
    if kernel == "gemm":  # (a few rows: no pass)
        assert step.choice.config["NORM_PASS"] == (rows > 16)


def test_a_pattern_without_the_bias_does_not_match_a_linear_with_one():
    dc.register_fusion_pattern("no_bias", lambda x, W: P.gelu(P.linear(x, W)), lambda x, W, gelu_approximate: None)
    try:
        rep = _compile(Block(True))
    finally:
        dc.unregister_fusion_pattern("no_bias")
    assert rep.patterns == ["gemm"]  # (the built-in GEMM pattern takes the LayerNorm as its prologue)
    assert "pattern 'no_bias' matched nothing" in str(rep)


def test_a_failing_lowering_leaves_the_ops_to_the_builtin_patterns(pattern):
    """Without the user pattern, the built-in GEMM pattern takes LayerNorm → linear → GELU too. A lowering that
    cannot take the region's arguments is found while planning, and the built-in pattern's kernel runs."""
    pattern(missing_attr)
    rep = _compile(Block(True))
    assert rep.patterns == ["gemm"]
    assert set(rep.impls().values()) == {"kernel"}
    text = str(rep)
    assert "ln_linear_gelu at dl.gelu %gelu: lowering failed (TypeError: the lowering 'missing_attr'" in text
    assert "unexpected keyword argument 'gelu_approximate'" in text and "left to the other patterns" in text


def test_a_failing_template_lowering_leaves_the_ops_too(pattern):
    class Broken:
        name = "broken"

        def can_lower(self, ops, inputs):
            return ops

        def lower(self, fused, plan, name):
            raise NotImplementedError("emit is missing")

    dc.register_template(Broken())
    try:
        pattern("broken")
        rep = _compile(Block(False))
    finally:
        dc.unregister_template("broken")
    assert rep.patterns == ["gemm"]
    assert "lowering failed (NotImplementedError: emit is missing)" in str(rep)


def test_a_pattern_that_matches_nothing_says_so(pattern):
    pattern(run_ln_linear_gelu)

    class Relu(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    rep = _compile(Relu())
    assert rep.patterns == ["row"]
    assert "pattern 'ln_linear_gelu' matched nothing" in str(rep)


def test_P_lists_its_ops():
    names = dir(P)
    assert {"linear", "layer_norm", "rms_norm", "gelu", "silu", "rotary", "sdpa", "glu"} <= set(names)
    assert "fused" not in names and "yield" not in names
    assert P.ops()["linear"] == "input, weight, bias?"
    assert P.ops()["rms_norm"] == "input, weight?; eps, offset, scale_in_f32"
    assert P.linear.__doc__.startswith("dl.linear(input, weight, bias?)")
    with pytest.raises(AttributeError, match="no dl op named dl.gemm; P's ops: abs, add"):
        P.gemm  # noqa: B018
    assert set(TEMPLATES) >= {"gemm", "row", "attention"}


def test_the_readme_table_lists_every_op_of_P():
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    table = readme[readme.index("| `P.<op>` |") :].split("\n\n")[0]
    listed = {name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert listed == set(dir(P))
