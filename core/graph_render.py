"""How a model graph looks: node colours by a statistic (log scale), edge widths by the
gradient norm, and the pictures written without Qt (Graphviz ``.dot`` and ``.svg``).

The window draws the same colours and widths (``app/views/graph_view.py`` calls these
functions), so the headless pictures and the window agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from xml.sax.saxutils import escape

from core.errors import GradExplorerError
from core.graph import GraphView, ModelGraph
from core.graph_layout import Layout, node_label

#: Statistics a node can be coloured by, with their labels.
COLOR_BY = {
    "grad_l2": "gradient L2 norm",
    "grad_mean_abs": "mean |gradient|",
    "grad_rms": "gradient RMS",
    "activation_std": "activation std",
    "flags": "flags",
}
#: Colours of the flags, most serious first.
FLAG_COLORS = {
    "nan/inf": "#d62728", "no gradient": "#7f7f7f", "zero": "#9467bd",
    "exploding": "#ff7f0e", "vanishing": "#1f77b4",
}
NO_DATA = "#e8e8e8"
KIND_FILL = {"input": "#cfe8cf", "output": "#cfe8cf", "op": "#f4f0d8", "module": "#ffffff"}
#: Edge widths (scene units) for the smallest and largest gradient norm in view.
MIN_WIDTH, MAX_WIDTH = 0.8, 7.0

# Viridis at 9 stops: perceptually even, readable on white, and fine for colour blindness.
_VIRIDIS = [(68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141),
            (39, 173, 129), (92, 200, 99), (170, 220, 50), (253, 231, 37)]


def colormap(t: float) -> str:
    """``#rrggbb`` of viridis at ``t`` in [0, 1]."""
    t = min(1.0, max(0.0, t)) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    f = t - i
    a, b = _VIRIDIS[i], _VIRIDIS[i + 1]
    return "#{:02x}{:02x}{:02x}".format(*(round(a[k] + (b[k] - a[k]) * f) for k in range(3)))


@dataclass
class ColorScale:
    """A log colour scale over the values in view: ``lo``..``hi`` (positive), or None."""

    statistic: str
    lo: float | None
    hi: float | None

    def color(self, value: float | None) -> str:
        if value is None or not math.isfinite(value) or value <= 0 or self.lo is None or self.hi is None:
            return NO_DATA
        if self.hi <= self.lo:
            return colormap(1.0)
        return colormap((math.log10(value) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo)))


def node_value(graph: ModelGraph, node_id: str, statistic: str) -> float | None:
    """The number a node is coloured by (``None`` when it has none)."""
    stats = graph.nodes[node_id].stats
    if not stats:
        return None
    v = stats.get(statistic)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def color_scale(graph: ModelGraph, nodes: Iterable[str], statistic: str) -> ColorScale:
    """The log scale spanning the positive finite values of ``statistic`` on ``nodes``."""
    if statistic not in COLOR_BY:
        raise GradExplorerError(f"Unknown statistic '{statistic}' to colour by.", f"Use one of: {', '.join(COLOR_BY)}.")
    values = [v for n in nodes if (v := node_value(graph, n, statistic)) is not None and v > 0 and math.isfinite(v)]
    return ColorScale(statistic, min(values) if values else None, max(values) if values else None)


def node_colors(graph: ModelGraph, nodes: Iterable[str], statistic: str = "grad_l2") -> dict[str, str]:
    """Fill colour of each node: the statistic on a log scale, or the worst flag.

    Nodes without statistics keep their kind's neutral fill (inputs and outputs green,
    ops cream, modules white), so a graph without a capture still reads.
    """
    nodes = list(nodes)
    out: dict[str, str] = {}
    if statistic == "flags":
        for n in nodes:
            stats = graph.nodes[n].stats
            flags = (stats or {}).get("flags") or []
            color = next((FLAG_COLORS[f] for f in FLAG_COLORS if f in flags), None)
            out[n] = color or ("#bfe3bf" if stats else KIND_FILL[graph.nodes[n].kind])
        return out
    scale = color_scale(graph, nodes, statistic)
    for n in nodes:
        v = node_value(graph, n, statistic)
        out[n] = scale.color(v) if graph.nodes[n].stats else KIND_FILL[graph.nodes[n].kind]
    return out


def text_color(fill: str) -> str:
    """Black or white, whichever reads on ``fill``."""
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"


def edge_widths(view: GraphView) -> dict[tuple[str, str], float]:
    """Width of each visible edge: log of its gradient norm, between MIN and MAX_WIDTH."""
    norms = {(e.src, e.dst): e.grad_l2 for e in view.edges}
    logs = [math.log10(v) for v in norms.values() if v is not None and v > 0 and math.isfinite(v)]
    out = {}
    lo, hi = (min(logs), max(logs)) if logs else (0.0, 0.0)
    for key, v in norms.items():
        if v is None or not (v > 0 and math.isfinite(v)):
            out[key] = MIN_WIDTH if v is None else MIN_WIDTH * 0.6
        elif hi <= lo:
            out[key] = (MIN_WIDTH + MAX_WIDTH) / 2
        else:
            out[key] = MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * (math.log10(v) - lo) / (hi - lo)
    return out


def fmt_shape(shape: Iterable[int] | None) -> str:
    return "×".join(str(d) for d in shape) if shape is not None else "?"


def node_tooltip(graph: ModelGraph, node_id: str) -> str:
    """Name, type, call, shape and statistics of a node, on several lines."""
    n = graph.nodes[node_id]
    lines = [n.name or "(model)", f"{n.kind}: {n.type}" + (f", call {n.call + 1}" if n.call else "")]
    lines.append(f"output {fmt_shape(n.shape)} {n.dtype or ''}".rstrip())
    if graph.is_container(node_id):
        lines.append(f"{len(graph.descendants(node_id))} nodes inside")
    for key, label in COLOR_BY.items():
        v = (n.stats or {}).get(key)
        if key == "flags":
            if v:
                lines.append("flags: " + ", ".join(v))
        elif v is not None:
            lines.append(f"{label}: {v:.4g}")
    return "\n".join(lines)


# -- pictures without Qt -----------------------------------------------------------


def _dot_id(node_id: str) -> str:
    return '"' + node_id.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: ModelGraph, view: GraphView, statistic: str = "grad_l2") -> str:
    """Graphviz source of a view (collapsed containers are boxes with a double border)."""
    colors = node_colors(graph, view.nodes, statistic)
    widths = edge_widths(view)
    lines = ["digraph model {",
             '  rankdir=TB; node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8, color="#555555"];']
    for n in view.nodes:
        node = graph.nodes[n]
        label = node_label(graph, n).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        shape = "ellipse" if node.kind == "op" else ("box" if node.kind == "module" else "parallelogram")
        periph = 2 if graph.is_container(n) else 1
        fill = colors[n]
        lines.append(f'  {_dot_id(n)} [label="{label}", shape={shape}, peripheries={periph}, '
                     f'fillcolor="{fill}", fontcolor="{text_color(fill)}"];')
    for e in view.edges:
        lab = fmt_shape(e.shape)
        g = e.grad_l2
        if g is not None:
            lab += f"\\n|g|={g:.3g}"
        lines.append(f'  {_dot_id(e.src)} -> {_dot_id(e.dst)} [label="{lab}", penwidth={widths[(e.src, e.dst)]:.2f}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_svg(graph: ModelGraph, view: GraphView, layout: Layout, statistic: str = "grad_l2",
           title: str | None = None) -> str:
    """An SVG picture of a laid-out view: nodes, edges with widths, a colour-bar legend."""
    colors = node_colors(graph, view.nodes, statistic)
    widths = edge_widths(view)
    x0, y0, x1, y1 = layout.bounds()
    pad = 20.0
    legend_h = 40.0
    w, h = x1 - x0 + 2 * pad, y1 - y0 + 2 * pad + legend_h
    ox, oy = pad - x0, pad - y0 + legend_h
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
            f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="Helvetica, Arial, sans-serif">'),
           f'<rect width="{w:.0f}" height="{h:.0f}" fill="#ffffff"/>',
           ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="5" markerHeight="5" '
            'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555555"/></marker></defs>')]
    if title:
        out.append(f'<text x="{pad:.0f}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>')
    out.extend(_svg_legend(graph, view, statistic, pad, w))
    for e in view.edges:
        pts = clip_route(layout, e.src, e.dst)
        xy = [f"{x + ox:.1f} {y + oy:.1f}" for x, y in pts]
        if layout.engine == "dot" and len(pts) > 1 and (len(pts) - 1) % 3 == 0:
            d = f"M {xy[0]} C " + " ".join(xy[1:])  # Graphviz routes are cubic Bézier controls
        else:
            d = "M " + " L ".join(xy)
        tip = f"{fmt_shape(e.shape)}" + (f" |g|={e.grad_l2:.3g}" if e.grad_l2 is not None else "")
        out.append(f'<path d="{d}" fill="none" stroke="#555555" stroke-width="{widths[(e.src, e.dst)]:.2f}" '
                   f'marker-end="url(#arrow)"><title>{escape(tip)}</title></path>')
    for n in view.nodes:
        node = graph.nodes[n]
        (cx, cy), (nw, nh) = layout.pos[n], layout.size[n]
        cx, cy = cx + ox, cy + oy
        fill = colors[n]
        stroke_w = 2.5 if graph.is_container(n) else 1.0
        if node.kind == "op":
            out.append(f'<ellipse cx="{cx:.1f}" cy="{cy:.1f}" rx="{nw / 2:.1f}" ry="{nh / 2:.1f}" fill="{fill}" '
                       f'stroke="#333333" stroke-width="{stroke_w}">')
        else:
            out.append(f'<rect x="{cx - nw / 2:.1f}" y="{cy - nh / 2:.1f}" width="{nw:.1f}" height="{nh:.1f}" rx="5" '
                       f'fill="{fill}" stroke="#333333" stroke-width="{stroke_w}">')
        out.append(f"<title>{escape(node_tooltip(graph, n))}</title>")
        out.append("</ellipse>" if node.kind == "op" else "</rect>")
        lines = node_label(graph, n).split("\n")
        tc = text_color(fill)
        for i, line in enumerate(lines):
            dy = (i - (len(lines) - 1) / 2) * 13 + 4
            size = 11 if i == 0 else 9
            out.append(f'<text x="{cx:.1f}" y="{cy + dy:.1f}" font-size="{size}" text-anchor="middle" '
                       f'fill="{tc}">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _svg_legend(graph: ModelGraph, view: GraphView, statistic: str, x: float, width: float) -> list[str]:
    if statistic == "flags":
        parts, cx = [], x
        for flag, color in FLAG_COLORS.items():
            parts.append(f'<rect x="{cx:.0f}" y="26" width="12" height="12" fill="{color}"/>'
                         f'<text x="{cx + 16:.0f}" y="36" font-size="10">{flag}</text>')
            cx += 90
        return parts
    scale = color_scale(graph, view.nodes, statistic)
    if scale.lo is None:
        return [f'<text x="{x:.0f}" y="36" font-size="10">no statistics (run with --capture)</text>']
    bar_w = min(240.0, width - 2 * x - 160)
    stops = "".join(f'<stop offset="{i / 8:.3f}" stop-color="{colormap(i / 8)}"/>' for i in range(9))
    return [f'<defs><linearGradient id="cbar">{stops}</linearGradient></defs>',
            f'<rect x="{x:.0f}" y="26" width="{bar_w:.0f}" height="10" fill="url(#cbar)"/>',
            f'<text x="{x:.0f}" y="22" font-size="9">{scale.lo:.3g}</text>',
            f'<text x="{x + bar_w:.0f}" y="22" font-size="9" text-anchor="end">{scale.hi:.3g}</text>',
            f'<text x="{x + bar_w + 8:.0f}" y="35" font-size="10">{escape(COLOR_BY[statistic])} (log)</text>']


def clip_route(layout: Layout, src: str, dst: str) -> list[tuple[float, float]]:
    """The edge's points, with the ends moved from the node centres to their borders
    (Graphviz routes already end there)."""
    pts = list(layout.routes.get((src, dst)) or [layout.pos[src], layout.pos[dst]])
    if len(pts) < 2:
        pts = [layout.pos[src], layout.pos[dst]]
    pts[0] = _border(layout, src, pts[0], pts[1])
    pts[-1] = _border(layout, dst, pts[-1], pts[-2])
    return pts


def _border(layout: Layout, node: str, p: tuple[float, float], toward: tuple[float, float]) -> tuple[float, float]:
    cx, cy = layout.pos[node]
    w, h = layout.size[node]
    if abs(p[0] - cx) > w / 2 + 1 or abs(p[1] - cy) > h / 2 + 1:
        return p  # already outside (a Graphviz route)
    dx, dy = toward[0] - cx, toward[1] - cy
    if dx == 0 and dy == 0:
        return (cx, cy)
    t = min((w / 2) / abs(dx) if dx else math.inf, (h / 2) / abs(dy) if dy else math.inf)
    return (cx + dx * t, cy + dy * t)
