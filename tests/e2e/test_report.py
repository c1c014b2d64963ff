"""`cm.report(html=...)`: the text report and the HTML page with the graph drawn as an SVG."""

import io
import re
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc
from dlblas_compiler import P
from dlblas_compiler.lowering import TritonTarget
from dlblas_compiler.dialects import make_context
from dlblas_compiler.models import BlockConfig, LlamaBlock, llama_block_inputs, randomize_

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
    assert "fused regions: 5" in text


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
