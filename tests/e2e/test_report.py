"""`cm.report(html=...)`: the text report and the HTML page with the graph drawn as an SVG."""

import io
import json
import re
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler import P
from dlblas_compiler.dialects import make_context
from dlblas_compiler.lowering import TritonTarget
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_
from dlblas_compiler.report import Fallback

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def llama_block():
    cfg = BlockConfig()
    return randomize_(LlamaBlock(cfg)).eval(), llama_block_inputs(cfg, batch=1, seq=8)


def _page(model, inputs, backend, path):
    cm = dc.compile(model, backend=backend)
    with torch.no_grad():
        cm(*inputs)
    text = str(cm.report(html=str(path)))
    page = path.read_text()
    svg = ET.fromstring(page[page.index("<svg") : page.index("</svg>") + len("</svg>")])  # well-formed XML
    return cm, text, page, svg


def _rect(el) -> tuple[float, float, float, float]:
    return tuple(float(el.get(k)) for k in ("x", "y", "width", "height"))


def _inside(inner, outer) -> bool:
    (x, y, w, h), (X, Y, W, H) = inner, outer
    return X <= x and Y <= y and x + w <= X + W and y + h <= Y + H


def _overlap(a, b) -> bool:
    (x, y, w, h), (X, Y, W, H) = a, b
    return x < X + W and X < x + w and y < Y + H and Y < y + h


def test_html_draws_regions_as_labelled_clusters(llama_block, tmp_path):
    model, inputs = llama_block
    cm, text, page, svg = _page(model, inputs, "interpret", tmp_path / "report.html")
    clusters = [r for r in svg.iter(SVG + "rect") if r.get("class") == "cluster"]
    assert [c.get("data-pattern") for c in clusters] == ["gemm", "attention", "gemm", "gemm", "gemm"]
    labels = [t.text for t in svg.iter(SVG + "text") if t.get("class") == "cluster-label"]
    kernels = [k.to_dict() for k in cm.report().kernels]
    assert len(kernels) == 5
    for i, k in enumerate(kernels):  # pattern and kernel name, then the chosen config
        assert f"[{i}] {k['pattern']} · {k['name']}" in labels
        key, value = next(iter(k["config"].items()))  # (BLOCK_M, or BLOCK_N for the decode attention kernel)
        assert f"{key.removeprefix('num_')}={value}" in page and k["name"] in page
    assert "warps=4" in page
    # the text report follows the picture, escaped
    assert re.search(r"<pre>dlblas_compiler report: LlamaBlock \(backend interpret", page)
    assert text.splitlines()[0] in page and "fused regions: 5" in page


def test_layout_nodes_inside_their_cluster_and_nothing_overlaps(llama_block, tmp_path):
    model, inputs = llama_block
    _, _, _, svg = _page(model, inputs, "interpret", tmp_path / "report.html")
    boxes = {int(r.get("data-region")): _rect(r) for r in svg.iter(SVG + "rect") if r.get("class") == "cluster"}
    nodes = [
        (g.get("data-region"), _rect(g.find(SVG + "rect"))) for g in svg.iter(SVG + "g") if g.get("class") == "node"
    ]
    labels = {t.text for g in svg.iter(SVG + "g") if g.get("class") == "node" for t in g.iter(SVG + "text")}
    assert {"rms_norm", "linear", "rotary", "sdpa", "glu", "x", "output", "q_proj.weight"} <= labels
    for region, rect in nodes:
        if region is not None:
            assert _inside(rect, boxes[int(region)])
        else:
            assert not any(_overlap(rect, box) for box in boxes.values())
    rects = [r for _, r in nodes]
    assert not any(_overlap(a, b) for i, a in enumerate(rects) for b in rects[i + 1 :])
    assert not any(_overlap(a, b) for a in boxes.values() for b in boxes.values() if a is not b)
    width, height = float(svg.get("width")), float(svg.get("height"))
    assert all(_inside(r, (0, 0, width, height)) for r in [*rects, *boxes.values()])
    edges = [p for p in svg.iter(SVG + "path") if p.get("class") == "edge"]
    assert len(edges) >= len(rects) - 1  # connected: every op is fed by or feeds something


def test_reference_backend_says_no_kernel_runs(llama_block, tmp_path):
    model, inputs = llama_block
    _, text, page, svg = _page(model, inputs, "reference", tmp_path / "report.html")
    labels = [t.text for t in svg.iter(SVG + "text") if t.get("class") == "cluster-label"]
    assert labels.count("no kernel launched (reference backend)") == 5
    assert "[1] attention · attention_4" in labels
    # counted as references, not kernels, in the text and the page's legend
    assert "5 fused regions: 0 generated kernels, 5 references (cuBLAS, SDPA, torch ops)" in text
    assert "5 fused regions: 0 generated kernels, 5 references" in page and "one kernel each" not in page
    assert "  [1] attention (sdpa): reference: reference backend" in text.splitlines()


def test_concise_text_by_default_detailed_on_request(llama_block):
    """`str(report)`: the model's class, the counts, one line per region saying what runs it; the weight
    preparation (the q/k/v and gate/up weights concatenated once) apart; `text(detail=True)` has every op."""
    model, inputs = llama_block
    cm = dc.compile(model, backend="interpret")
    with torch.no_grad():
        cm(*inputs)
    rep = cm.report()
    lines = str(rep).splitlines()
    assert lines[0].startswith("dlblas_compiler report: LlamaBlock (backend interpret, compiled in")
    assert lines[1] == ("5 fused regions: 5 generated kernels, 0 references (cuBLAS, SDPA, torch ops); "
                        "0 torch fallbacks (opaque calls); 2 ops computed once (weight preparation)")  # fmt: skip
    regions = [ln for ln in lines if re.match(r"  \[\d\] ", ln)]
    assert regions == [
        "  [0] gemm (rms_norm linear rotary×2): kernel gemm_0",
        "  [1] attention (sdpa): kernel attention_4",
        "  [2] gemm (linear add): kernel gemm_1",
        "  [3] gemm (rms_norm linear glu): kernel gemm_2",
        "  [4] gemm (linear add): kernel gemm_3",
    ]
    assert "computed once (weight preparation): dl.cat ×2" in lines and rep.once == {"dl.cat": 2}
    assert "BLOCK_M" not in str(rep)  # configs are detail
    detail = rep.text(detail=True)
    assert rep.detailed() == detail and len(detail.splitlines()) > len(lines)
    assert "gemm_0 [kernel]: {'BLOCK_M'" in detail and "dl.slice dl.reshape dl.permute" in detail
    assert "top-level ops each call: dl.fused x5" in detail
    assert "computed once (weight preparation): dl.cat x2" in detail
    assert "BLOCK_M" in rep  # `in` searches the detailed text
    counts = rep.to_dict()["counts"]
    assert counts == {"regions": 5, "kernels": 5, "callables": 0, "references": 0, "torch_fallbacks": 0,
                      "unfused": 0, "computed_once": 2}  # fmt: skip
    assert json.loads(rep.to_json())["computed_once"] == {"dl.cat": 2}


class _IntPositions(nn.Module):
    """Integer position arithmetic (not `dl` ops: torch fallbacks, their converters' notes spanning lines) and a
    function the frontend does not know (`torch.cumsum`), beside a fused softmax."""

    def __init__(self, n_int: int):
        super().__init__()
        self.n_int = n_int

    def forward(self, x, pos):
        for _ in range(self.n_int):
            pos = pos + 1
        return F.softmax(torch.cumsum(x, dim=-1), dim=-1), pos


def test_fallbacks_have_readable_names_and_notes_are_one_line():
    cm = dc.compile(_IntPositions(2), backend="interpret")
    with torch.no_grad():
        cm(torch.randn(4, 16), torch.arange(4))
    rep = cm.report()
    names = [f.name for f in rep.fallbacks]
    assert names == ["operator.add", "operator.add", "torch.cumsum"]
    assert rep.fallbacks[2].callee == "torch._VariableFunctionsClass.cumsum"  # (the IR's path)
    text = str(rep)
    assert "torch fallbacks (run by PyTorch each call): operator.add ×2, torch.cumsum" in text
    assert "  torch_call cumsum: no converter for function torch.cumsum" in text.splitlines()
    assert "_VariableFunctionsClass" not in text and "_VariableFunctionsClass" not in rep.text(detail=True)
    assert "3 torch fallbacks (opaque calls)" in text and "1 generated kernel," in text
    multi = [n for n in rep.notes if "\n" in n]  # the converters' verifier text spans lines ...
    assert multi
    for note in multi:  # ... the text gives each on one line
        one = " ".join(note.replace("_operator.", "operator.").split())
        assert f"  {one}" in text.splitlines() and f"  {one}" in rep.text(detail=True).splitlines()
    assert rep.to_dict()["fallbacks"][2] == {"name": "torch.cumsum", "callee": "torch._VariableFunctionsClass.cumsum",
                                             "node": "cumsum", "where": rep.fallbacks[2].where}  # fmt: skip
    assert "test_report.py" in rep.fallbacks[2].where and "torch.cumsum(x, dim=-1)" in rep.fallbacks[2].where


def test_many_alike_notes_are_summarized_in_the_concise_text():
    cm = dc.compile(_IntPositions(6), backend="reference")
    with torch.no_grad():
        cm(torch.randn(4, 16), torch.arange(4))
    rep = cm.report()
    refused = [n for n in rep.notes if n.startswith("torch_call ")]
    assert len(refused) == 7  # six integer adds, and cumsum
    text = str(rep)
    summary = [ln for ln in text.splitlines() if "torch calls the converters refused" in ln]
    assert summary == ["  7 torch calls the converters refused (some later removed, as a mask found causal is; those "
                       "still run are the fallbacks above): the detailed text says why"]  # fmt: skip
    rep.notes.append("a verifier's text\n  over two lines")
    assert rep.to_dict()["notes"][-1] == "a verifier's text over two lines"  # one line each in the JSON too
    assert not any(ln.startswith("  torch_call ") for ln in text.splitlines())
    assert sum(ln.startswith("  torch_call ") for ln in rep.text(detail=True).splitlines()) == 7


@pytest.mark.parametrize(
    ("callee", "name"),
    [
        ("torch._VariableFunctionsClass.addmm", "torch.addmm"),
        ("torch._C._nn.gelu", "torch.nn.functional.gelu"),
        ("_operator.getitem", "operator.getitem"),
        ("torch.Tensor.unsqueeze", "torch.Tensor.unsqueeze"),
        ("builtins.getattr", "getattr"),
        ("my_pkg.ops.fancy", "my_pkg.ops.fancy"),
    ],
)
def test_readable_callee_names(callee, name):
    assert Fallback(callee, "n").name == name


def test_user_pattern_region_is_labelled_as_a_callable(tmp_path):
    """A user pattern lowered to a Python callable: its own colour, "runs as callable" in the picture, and
    `dl-opt -t triton` says it has no generated kernel."""

    def square_tanh(x):
        return P.tanh(P.mul(x, x))

    def run_square_tanh(x):
        return torch.tanh(x * x)

    class M(nn.Module):
        def forward(self, x):
            return F.softmax(torch.tanh(x * x), dim=-1)

    dc.register_fusion_pattern("test_square_tanh", square_tanh, run_square_tanh, priority=300)
    try:
        cm, _, page, svg = _page(M(), (torch.randn(4, 16),), "interpret", tmp_path / "report.html")
        out = io.StringIO()
        TritonTarget().emit(make_context(), cm._spec().pipeline.module, out)
    finally:
        dc.unregister_fusion_pattern("test_square_tanh")
    patterns = {r.get("data-pattern"): r.get("stroke") for r in svg.iter(SVG + "rect") if r.get("class") == "cluster"}
    assert set(patterns) == {"test_square_tanh", "row"} and len(set(patterns.values())) == 2
    labels = [t.text for t in svg.iter(SVG + "text") if t.get("class") == "cluster-label"]
    assert "runs as callable" in labels
    text = out.getvalue()
    assert "not a generated kernel: the pattern lowers to the Python callable" in text and "run_square_tanh" in text
    assert "@triton.jit" in text  # the softmax row kernel is still printed
