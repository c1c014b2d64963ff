"""The report's picture: an SVG drawn here (no graphviz) of the final IR's ops as boxes, data flow as arrows,
and each `dl.fused` region as a coloured cluster labelled with its pattern, kernel and chosen config (see
`_Drawing` for the layout), in an HTML page with the report's text.
"""

from __future__ import annotations

import html as html_lib
from dataclasses import dataclass, field

import networkx as nx
from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue

from ..dialects import VIEW_OPS, ConstantOp, FusedOp, ParamOp, TorchCallOp, YieldOp
from ..dialects.traits import kind_of
from .text import regions_line


@dataclass
class Node:
    label: str
    detail: str  # the result's shape and dtype
    kind: str  # a mapping kind, or "input", "param", "output"
    region: int | None = None  # index into Report.regions


@dataclass
class Graph:
    """The final IR as a drawing needs it: ops (constants left out), data-flow edges, region membership."""

    nodes: list[Node] = field(default_factory=list)
    edges: set[tuple[int, int]] = field(default_factory=set)

    @classmethod
    def of(cls, fn: func.FuncOp) -> Graph:
        g = cls()
        made: dict[SSAValue, int] = {}  # value -> node that produces it

        def add(node: Node, results, operands=()) -> int:
            i = len(g.nodes)
            g.nodes.append(node)
            g.edges.update((made[v], i) for v in operands if v in made)
            made.update((r, i) for r in results)
            return i

        for a in fn.body.block.args:
            add(Node(a.name_hint or f"arg{a.index}", _type_text(a), "input"), [a])
        fused_index = 0
        for op in fn.body.block.ops:
            if isinstance(op, func.ReturnOp):
                add(Node("output", ", ".join(_type_text(v) for v in op.operands), "output"), [], op.operands)
            elif isinstance(op, FusedOp):
                # a block argument is drawn as the outer value it stands for, a region's result as its yielded value
                made.update((a, made[v]) for a, v in zip(op.block.args, op.inputs, strict=True) if v in made)
                for inner in op.block.ops:
                    if isinstance(inner, YieldOp):
                        made.update((r, made[v]) for r, v in zip(op.results, inner.operands, strict=True) if v in made)
                    elif not isinstance(inner, (ConstantOp, ParamOp)):
                        add(_op_node(inner, fused_index), inner.results, inner.operands)
                fused_index += 1
            elif not isinstance(op, ConstantOp):
                add(_op_node(op, None), op.results, op.operands)
        return g


def traffic_saved(fused: FusedOp) -> int:
    """Estimated bytes eager execution would move for the region's intermediates: each value computed and
    consumed inside the region written once and read once per use (views are free in eager, so not counted)."""

    yielded = set(fused.yielded.values)
    total = 0
    for op in fused.block.ops:
        if isinstance(op, (YieldOp, ConstantOp, ParamOp)) or isinstance(op, VIEW_OPS):
            continue
        for r in op.results:
            if r in yielded or not isinstance(r.type, TensorType):
                continue
            nbytes = 1
            for d in r.type.get_shape():
                nbytes *= d
            nbytes *= getattr(r.type.element_type, "bitwidth", 32) // 8
            total += nbytes * (1 + r.uses.get_length())
    return total


def _type_text(v: SSAValue) -> str:
    t = v.type
    if isinstance(t, TensorType):
        shape = "×".join(str(d) for d in t.get_shape()) or "scalar"
        return f"{shape} {t.element_type}"
    return str(t)


def _op_node(op: Operation, region: int | None) -> Node:
    detail = _type_text(op.results[0]) if op.results else ""
    if isinstance(op, ParamOp):
        return Node(op.pname, detail, "param", region)
    if isinstance(op, TorchCallOp):
        return Node("torch " + op.callee.data.rsplit(".", 1)[-1], detail, "opaque", region)
    k = kind_of(op)
    return Node(op.name.removeprefix("dl."), detail, k.value if k else "other", region)


def page(report, text: str) -> str:
    """The HTML page: a legend, the graph as an SVG, then the report's text."""
    title = html_lib.escape(f"dlblas_compiler: {report.title} ({report.backend})")
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title>\n"
        "<style>body{font-family:sans-serif;margin:16px;color:#222} pre{background:#f6f6f6;padding:10px;"
        "font-size:12px;overflow-x:auto} .graph{overflow:auto;border:1px solid #ddd}"
        " .legend{font-size:13px;line-height:1.8} .sw{display:inline-block;width:14px;height:12px;"
        "border:2px solid;border-radius:3px;margin:0 4px 0 12px;vertical-align:middle}</style></head>\n"
        f"<body><h2>{title}</h2>\n{_legend(report)}\n<div class='graph'>\n{svg(report)}\n</div>\n"
        f"<h3>Report</h3>\n<pre>{html_lib.escape(text)}</pre>\n</body></html>\n"
    )


def _legend(report) -> str:
    """What the colours mean: a box per fused region (coloured by pattern), op boxes by mapping kind."""
    patterns = [r.pattern for r in report.regions]
    swatch = "<span class='sw' style='background:{};border-color:{}'></span>{}"
    regions = [swatch.format("#fff", pattern_color(p, patterns), p) for p in sorted(set(patterns))]
    kinds = [swatch.format(KIND_FILLS[k], "#444", k) for k in KIND_FILLS if k != "other"]
    return (
        f"<p class='legend'>{html_lib.escape(regions_line(report.counts()))}; framed by pattern: "
        f"{' '.join(regions) or 'none'}<br>ops filled by mapping kind: {' '.join(kinds)}</p>"
    )


def svg(report) -> str:
    labels = [_region_label(report, i, r) for i, r in enumerate(report.regions)]
    return _Drawing(report.graph, labels, [r.pattern for r in report.regions]).svg()


def _region_label(report, i: int, region) -> list[str]:
    """Title line (pattern and kernel), then the chosen config (or why no kernel runs), wrapped."""
    name = region.kernel or region.pattern
    lines = [f"[{i}] {region.pattern} · {name}"]
    choice = next((k for k in report.kernels if k.region == name), None)
    if choice is None or (report.backend == "reference" and choice.impl == "reference"):
        lines.append("no kernel launched (reference backend)" if report.backend == "reference" else "no kernel")
        return lines
    if choice.impl != "kernel":
        lines.append(f"runs as {choice.impl}" + (f": {choice.reason}" if choice.reason else ""))
    if choice.config:
        words = [f"{k.removeprefix('num_')}={v}" for k, v in choice.config.items()]
        lines.extend(_wrap(words, 34))
    return [ln if len(ln) <= 60 else ln[:57] + "..." for ln in lines]


def _wrap(words: list[str], width: int) -> list[str]:
    lines: list[str] = []
    for w in words:
        if lines and len(lines[-1]) + 1 + len(w) <= width:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines


PATTERN_COLORS = {"gemm": "#3b75af", "attention": "#e1812c", "row": "#3a923a", "elementwise": "#8c613c"}
OTHER_PATTERN_COLORS = ["#9372b2", "#c03d3e", "#d684bd", "#7f7f7f"]
KIND_FILLS = {
    "one-to-one": "#eef6ff", "one-to-many": "#eafaf1", "many-to-many": "#fff1dc", "reorganize": "#f4f4f4",
    "shuffle": "#f7ecff", "opaque": "#ffe3e3", "input": "#ffffff", "param": "#fbfbe8", "output": "#ffffff",
    "other": "#ffffff",
}  # fmt: skip


def pattern_color(pattern: str, patterns: list[str]) -> str:
    """A fixed colour for the built-in patterns; the others (user patterns) share a small palette."""
    if pattern in PATTERN_COLORS:
        return PATTERN_COLORS[pattern]
    others = sorted({p for p in patterns if p not in PATTERN_COLORS})
    return OTHER_PATTERN_COLORS[others.index(pattern) % len(OTHER_PATTERN_COLORS)]


CHAR_W, NODE_H, ROW_GAP, COL_GAP, PAD, LANE = 6.6, 30, 26, 18, 10, 9
LABEL_LINE = 14


class _Drawing:
    """Layered layout of a Graph and its SVG text (sizes in px, text in a monospace font).

    Units (regions, and nodes outside regions) sit in rows, each as late as its consumers allow, ordered
    in a row by the mean x of what feeds them; a region's nodes sit in rows inside its box the same way.
    An edge between adjacent rows is a curve; a longer one runs down a lane beside the drawing (one lane
    per source node) so it does not cut through the boxes in between.
    """

    def __init__(self, graph: Graph, labels: list[list[str]], patterns: list[str]):
        self.g, self.labels, self.patterns = graph, labels, patterns
        self.pos: dict[int, tuple[float, float]] = {}  # node -> top-left corner
        self.boxes: list[tuple[float, float, float, float]] = [(0, 0, 0, 0)] * len(labels)  # region -> x, y, w, h
        self.unit_of = {i: ("r", n.region) if n.region is not None else ("n", i) for i, n in enumerate(graph.nodes)}
        self.layer: dict[tuple, int] = {}
        self.bands: list[tuple[float, float]] = []  # row of units -> top, bottom
        self.lanes: dict[int, float] = {}  # source node of a long edge -> x of its lane
        self.width = self.height = 0.0
        self._layout()

    def node_w(self, i: int) -> float:
        n = self.g.nodes[i]
        return max(len(n.label), len(n.detail) * 0.85) * CHAR_W + 14

    def centre(self, i: int) -> float:
        return self.pos[i][0] + self.node_w(i) / 2

    def color(self, r: int) -> str:
        return pattern_color(self.patterns[r], self.patterns)

    def _order(self, items: list, preds) -> None:
        """Sort a row by the mean centre of the already placed nodes feeding each item (barycenter)."""
        items.sort(key=lambda u: _mean([self.centre(p) for p in preds(u) if p in self.pos], default=0.0))

    def _layout(self) -> None:
        g = self.g
        units = nx.DiGraph()
        units.add_nodes_from(dict.fromkeys(self.unit_of.values()))
        units.add_edges_from(
            (self.unit_of[a], self.unit_of[b]) for a, b in g.edges if self.unit_of[a] != self.unit_of[b]
        )
        self.layer = _alap(units)
        feeds: dict[int, list[int]] = {}
        for a, b in g.edges:
            feeds.setdefault(b, []).append(a)
        inner: dict[tuple, list[list[int]]] = {}
        size: dict[tuple, tuple[float, float]] = {}
        for u in units:
            if u[0] == "n":
                size[u] = (self.node_w(u[1]), NODE_H)
                continue
            sub = nx.DiGraph()
            sub.add_nodes_from(i for i, v in self.unit_of.items() if v == u)
            sub.add_edges_from((a, b) for a, b in g.edges if a in sub and b in sub)
            rows = _rows(_alap(sub))
            inner[u] = rows
            label_w = self._label_w(u[1])
            rows_w = max(sum(self.node_w(i) for i in row) + COL_GAP * (len(row) - 1) for row in rows)
            h = self._label_h(u[1]) + len(rows) * (NODE_H + ROW_GAP) - ROW_GAP + PAD
            size[u] = (max(label_w, rows_w) + 2 * PAD, h)
        y = PAD
        for row in _rows(self.layer):
            self._order(row, lambda u: [p for m in self._members(u) for p in feeds.get(m, []) if self.unit_of[p] != u])
            x = -(sum(size[u][0] for u in row) + 3 * COL_GAP * (len(row) - 1)) / 2
            for u in row:
                w, h = size[u]
                if u[0] == "n":
                    self.pos[u[1]] = (x, y)
                else:
                    self.boxes[u[1]] = (x, y, w, h)
                    yy = y + self._label_h(u[1])
                    for r in inner[u]:
                        self._order(r, lambda i: feeds.get(i, []))
                        xx = x + (w - sum(self.node_w(i) for i in r) - COL_GAP * (len(r) - 1)) / 2
                        for i in r:
                            self.pos[i] = (xx, yy)
                            xx += self.node_w(i) + COL_GAP
                        yy += NODE_H + ROW_GAP
                x += w + 3 * COL_GAP
            bottom = y + max(size[u][1] for u in row)
            self.bands.append((y, bottom))
            y = bottom + 2 * ROW_GAP
        # lanes for long edges, one per source node, on the side the source is on
        left = min([x for x, _ in self.pos.values()] + [b[0] for b in self.boxes], default=0.0)
        right = max(
            [x + self.node_w(i) for i, (x, _) in self.pos.items()] + [b[0] + b[2] for b in self.boxes], default=0.0
        )
        sources = sorted({a for a, b in g.edges if self._long(a, b)}, key=lambda a: (self.pos[a][1], self.centre(a)))
        sides = {a: self.centre(a) < (left + right) / 2 for a in sources}
        n_left = sum(sides.values())
        n_right = len(sources) - n_left
        shift = PAD + LANE * n_left - left
        self.pos = {i: (x + shift, y) for i, (x, y) in self.pos.items()}
        self.boxes = [(x + shift, y, w, h) for x, y, w, h in self.boxes]
        k = {True: 0, False: 0}
        for a in sources:
            k[sides[a]] += 1
            self.lanes[a] = left + shift - LANE * k[sides[a]] if sides[a] else right + shift + LANE * k[sides[a]]
        self.width = right - left + 2 * PAD + LANE * (n_left + n_right)
        self.height = y - 2 * ROW_GAP + PAD

    def _label_w(self, r: int) -> float:
        """The label's width on its white ground (the first line is bold and one point larger)."""
        return max(len(s) * CHAR_W * (12 / 11 if k == 0 else 1) for k, s in enumerate(self.labels[r])) + 8

    def _label_h(self, r: int) -> float:
        return PAD + len(self.labels[r]) * LABEL_LINE + ROW_GAP

    def _members(self, u: tuple) -> list[int]:
        return [i for i, v in self.unit_of.items() if v == u]

    def _long(self, a: int, b: int) -> bool:
        ua, ub = self.unit_of[a], self.unit_of[b]
        return ua != ub and self.layer[ub] - self.layer[ua] > 1

    def _edge_path(self, a: int, b: int) -> str:
        x1, y1 = self.centre(a), self.pos[a][1] + NODE_H
        x2, y2 = self.centre(b), self.pos[b][1]
        if not self._long(a, b):
            dy = max(ROW_GAP, (y2 - y1) / 2)
            return f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + dy:.1f} {x2:.1f},{y2 - dy:.1f} {x2:.1f},{y2:.1f}"
        lane = self.lanes[a]
        below = self.bands[self.layer[self.unit_of[a]]][1] + ROW_GAP  # the gap under the source's row
        above = y2 - ROW_GAP / 2  # the gap over the target (inside its region's box if it is in one)
        return (f"M{x1:.1f},{y1:.1f} L{x1:.1f},{below:.1f} L{lane:.1f},{below:.1f} L{lane:.1f},{above:.1f} "
                f"L{x2:.1f},{above:.1f} L{x2:.1f},{y2:.1f}")  # fmt: skip

    def svg(self) -> str:
        out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
            f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" font-family="DejaVu Sans Mono, Menlo, monospace">',
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        ]
        for r, (x, y, w, h) in enumerate(self.boxes):
            c = self.color(r)
            out.append(f'<rect class="cluster" data-region="{r}" data-pattern="{_esc(self.patterns[r])}" x="{x:.1f}" '
                       f'y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="8" fill="{c}" fill-opacity="0.10" '
                       f'stroke="{c}" stroke-width="2"/>')  # fmt: skip
        for a, b in sorted(self.g.edges):
            out.append(f'<path class="edge" d="{self._edge_path(a, b)}" fill="none" stroke="#555" stroke-opacity="0.6" '
                       f'stroke-width="1.2" marker-end="url(#arrow)"/>')  # fmt: skip
        for r, (x, y, _, _) in enumerate(self.boxes):  # labels over the edges, on a white ground
            lines = self.labels[r]
            out.append(f'<rect x="{x + PAD - 4:.1f}" y="{y + PAD - 3:.1f}" width="{self._label_w(r):.1f}" '
                       f'height="{len(lines) * LABEL_LINE + 5}" rx="3" fill="#fff" fill-opacity="0.9"/>')  # fmt: skip
            for k, line in enumerate(lines):
                weight = ' font-weight="bold" font-size="12"' if k == 0 else ' font-size="11"'
                ty = y + PAD + 10 + k * LABEL_LINE
                out.append(f'<text class="cluster-label" x="{x + PAD:.1f}" y="{ty:.1f}"{weight} '
                           f'fill="{self.color(r)}">{_esc(line)}</text>')  # fmt: skip
        for i, n in enumerate(self.g.nodes):
            x, y = self.pos[i]
            w = self.node_w(i)
            shape = 'rx="14"' if n.kind in ("input", "output", "param") else 'rx="3"'
            region = f' data-region="{n.region}"' if n.region is not None else ""
            out.append(f'<g class="node" data-kind="{n.kind}"{region}>'
                       f'<title>{_esc(n.label)}: {_esc(n.detail)} ({n.kind})</title>')  # fmt: skip
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{NODE_H}" {shape} '
                       f'fill="{KIND_FILLS.get(n.kind, "#fff")}" stroke="#444" stroke-width="1"/>')  # fmt: skip
            out.append(
                f'<text x="{x + w / 2:.1f}" y="{y + 12:.1f}" font-size="11" text-anchor="middle">{_esc(n.label)}</text>'
            )
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + 24:.1f}" font-size="9" fill="#555" '
                       f'text-anchor="middle">{_esc(n.detail)}</text></g>')  # fmt: skip
        out.append("</svg>")
        return "\n".join(out)


def _alap(dag: nx.DiGraph) -> dict:
    """Each node's row, as late as its successors allow (sinks in the last row)."""
    depth = {u: k for k, gen in enumerate(nx.topological_generations(dag.reverse(copy=False))) for u in gen}
    last = max(depth.values(), default=0)
    return {u: last - d for u, d in depth.items()}


def _rows(layer: dict) -> list[list]:
    """Nodes by row (ALAP rows are contiguous: none is empty)."""
    rows: list[list] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for u in sorted(layer):
        rows[layer[u]].append(u)
    return rows


def _mean(xs: list[float], default: float) -> float:
    return sum(xs) / len(xs) if xs else default


def _esc(s: str) -> str:
    return html_lib.escape(s, quote=True)
