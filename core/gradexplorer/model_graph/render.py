"""How a model graph looks: node colours by a statistic (log scale), edge widths by the
gradient norm, and the pictures written without Qt (Graphviz ``.dot`` and ``.svg``).

The window draws the same colours and widths (``app/gradexplorer_app/views/graph_view.py`` calls these
functions), so the headless pictures and the window agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.model_graph.graph import GraphView, ModelGraph
from gradexplorer.model_graph.layout import Layout, node_label
from gradexplorer.model_graph.statistics import DIVERGENCE_BY, RATIOS, STATISTIC_LABELS

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
    return _interpolate(_VIRIDIS, t)


#: A diverging map (blue, white, red: ColorBrewer RdBu reversed) for ratios around 1.
_DIVERGING = [(33, 102, 172), (67, 147, 195), (146, 197, 222), (209, 229, 240), (247, 247, 247),
              (253, 219, 199), (244, 165, 130), (214, 96, 77), (178, 24, 43)]


def diverging_colormap(t: float) -> str:
    """``#rrggbb`` of the diverging map at ``t`` in [0, 1] (0.5 is white)."""
    return _interpolate(_DIVERGING, t)


def _interpolate(stops: list[tuple[int, int, int]], t: float) -> str:
    t = min(1.0, max(0.0, t)) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    a, b = stops[i], stops[i + 1]
    return "#{:02x}{:02x}{:02x}".format(*(round(a[k] + (b[k] - a[k]) * f) for k in range(3)))


def log_ticks(lo: float, hi: float) -> list[float]:
    """The powers of ten between ``lo`` and ``hi`` (both positive), smallest first.

    A range inside one decade has none; a range over many decades keeps every
    ``step``-th power so that at most 7 labels share the bar.
    """
    if not (lo > 0 and hi >= lo and math.isfinite(lo) and math.isfinite(hi)):
        return []
    # A tolerance of 1e-9 decades: 0.1 computed as 10**-1 must count as inside [0.1, 1].
    first, last = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    step = max(1, math.ceil((last - first + 1) / 7))
    return [10.0 ** k for k in range(first, last + 1, step)]


def minor_log_ticks(lo: float, hi: float) -> list[float]:
    """``2·10^k`` and ``5·10^k`` between ``lo`` and ``hi``: the labels a bar needs when its
    range holds fewer than two powers of ten."""
    if not (lo > 0 and hi >= lo and math.isfinite(lo) and math.isfinite(hi)):
        return []
    out = []
    for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (2.0, 5.0):
            v = m * 10.0 ** k
            if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9):
                out.append(v)
    return out


def tick_label(value: float) -> str:
    """``1e-05``, ``0.001``, ``1``, ``200``, ``1e+04``: short labels for the ticks."""
    return f"{value:g}" if 1e-3 <= value < 1e4 else f"{value:.0e}"


def constant_label(lo: float, hi: float) -> str | None:
    """``"constant 1.0"`` when a scale's ends are one value (equal to 7 significant digits:
    a bar had read "1.0000001 … 1.0000001"), else None. Every colour bar says it so: the
    window's, the graph's and the exported SVG's."""
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if hi != lo and abs(hi - lo) > 1e-7 * max(abs(lo), abs(hi)):
        return None
    v = (lo + hi) / 2
    if v == 0:
        return "constant 0"
    text = f"{v:.4g}"
    if "." not in text and "e" not in text:
        text += ".0"
    return f"constant {text}"


def range_labels(lo: float, hi: float) -> tuple[str, str]:
    """Labels of the two ends of a bar, with as many digits (3 to 8) as it takes for them
    to differ from each other and, unless they are, from 1 (a ratio of 1.003 is not "1")."""
    for p in range(3, 9):
        a, b = f"{lo:.{p}g}", f"{hi:.{p}g}"
        if a != b and (lo == 1 or float(a) != 1) and (hi == 1 or float(b) != 1):
            return a, b
    return f"{lo:.8g}", f"{hi:.8g}"


@dataclass
class ColorScale:
    """A log colour scale over the values in view: ``lo``..``hi`` (positive), or None.

    ``diverging`` scales are for ratios: symmetric around 1 in log space
    (``lo == 1 / hi``), white at 1, blue below, red above.
    """

    statistic: str
    lo: float | None
    hi: float | None
    diverging: bool = False
    #: An exact 0 is the low end (a difference of 0: identical), not "no data".
    zero_low: bool = False

    def position(self, value: float | None) -> float | None:
        """Where ``value`` sits on the bar, 0 (``lo``) to 1 (``hi``), or None."""
        if value == 0 and self.zero_low:
            return 0.0
        if value is None or not math.isfinite(value) or value <= 0 or self.lo is None or self.hi is None:
            return None
        if self.hi <= self.lo:
            return 0.5 if self.diverging else 1.0
        return (math.log10(value) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))

    def color(self, value: float | None) -> str:
        t = self.position(value)
        if t is None:
            return NO_DATA
        return diverging_colormap(t) if self.diverging else colormap(t)

    def gradient(self, stops: int = 9) -> list[tuple[float, str]]:
        """``(offset, colour)`` pairs that draw the bar."""
        cmap = diverging_colormap if self.diverging else colormap
        return [(i / (stops - 1), cmap(i / (stops - 1))) for i in range(stops)]

    def ticks(self, minor: bool = True) -> list[tuple[float, float, str]]:
        """``(position, value, label)`` of each power of ten on the bar, left to right;
        with ``minor``, also 2 and 5 times them when the range holds fewer than two
        powers of ten (a bar with one label cannot be read)."""
        if self.lo is None or self.hi is None:
            return []
        values = log_ticks(self.lo, self.hi)
        if minor and len(values) < 2:
            values = sorted(values + minor_log_ticks(self.lo, self.hi))
        out = []
        for v in values:
            t = self.position(v)
            out.append((min(1.0, max(0.0, t if t is not None else 0.0)), v, tick_label(v)))
        return out


def node_value(graph: ModelGraph, node_id: str, statistic: str) -> float | None:
    """The number a node is coloured by (``None`` when it has none)."""
    stats = graph.shown_stats(node_id)
    if not stats:
        return None
    v = stats.get(statistic)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def color_scale(graph: ModelGraph, nodes: Iterable[str], statistic: str) -> ColorScale:
    """The log scale spanning the positive finite values of ``statistic`` on ``nodes``.

    A comparison's differences (``gradexplorer.model_graph.compare``) colour an exact 0 (B equals A) as
    the low end; its ratios get a diverging scale symmetric around 1 (``lo == 1 / hi``).
    """
    if statistic not in STATISTIC_LABELS:
        raise GradExplorerError(f"Unknown statistic '{statistic}' to colour by.",
                                f"Use one of: {', '.join(STATISTIC_LABELS)}.")
    values = [v for n in nodes if (v := node_value(graph, n, statistic)) is not None and v > 0 and math.isfinite(v)]
    if values and max(values) - min(values) <= 1e-7 * max(values):
        # One value up to float rounding (every norm 1.0000001): one colour, not the whole
        # map spread over differences in the seventh digit.
        values = [max(values)]
    if statistic in RATIOS:
        if not values:
            return ColorScale(statistic, None, None, diverging=True)
        m = max(max(values), 1.0 / min(values))
        if m - 1.0 <= 1e-7:  # 1 up to float rounding: white, not the map's two ends
            return ColorScale(statistic, 1.0, 1.0, diverging=True)
        return ColorScale(statistic, 1.0 / m, m, diverging=True)
    return ColorScale(statistic, min(values) if values else None, max(values) if values else None,
                      zero_low=statistic in DIVERGENCE_BY)


def node_colors(graph: ModelGraph, nodes: Iterable[str], statistic: str = "grad_l2") -> dict[str, str]:
    """Fill colour of each node: the statistic on a log scale, or the worst flag.

    Nodes without statistics keep their kind's neutral fill (inputs and outputs green,
    ops cream, modules white), so a graph without a capture still reads.
    """
    nodes = list(nodes)
    out: dict[str, str] = {}
    if statistic == "flags":
        for n in nodes:
            stats = graph.shown_stats(n)
            flags = (stats or {}).get("flags") or []
            color = next((FLAG_COLORS[f] for f in FLAG_COLORS if f in flags), None)
            out[n] = color or ("#bfe3bf" if stats else KIND_FILL[graph.nodes[n].kind])
        return out
    scale = color_scale(graph, nodes, statistic)
    for n in nodes:
        v = node_value(graph, n, statistic)
        out[n] = scale.color(v) if graph.shown_stats(n) else KIND_FILL[graph.nodes[n].kind]
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
    stats = graph.shown_stats(node_id)
    if stats is not None and n.stats is None:
        producer = graph.nodes[graph.output_producer(node_id) or node_id]
        lines.append(f"statistics of its output, from {producer.label} ({producer.type})")
    for key, label in STATISTIC_LABELS.items():
        v: Any = (stats or {}).get(key)
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
    legend_h = 52.0
    # The legend needs about 640 units: a narrow graph is centred under it.
    w, h = max(x1 - x0 + 2 * pad, 640.0), y1 - y0 + 2 * pad + legend_h
    ox, oy = (w - (x1 - x0)) / 2 - x0, pad - y0 + legend_h
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
    """The colour bar (or the flags' key) above the graph: a gradient with a tick and a
    label at each power of ten, and the exact range in the caption."""
    if statistic == "flags":
        parts, cx = [], x
        for flag, color in FLAG_COLORS.items():
            parts.append(f'<rect class="legend" x="{cx:.0f}" y="26" width="12" height="12" fill="{color}"/>'
                         f'<text x="{cx + 16:.0f}" y="36" font-size="10">{flag}</text>')
            cx += 90
        return parts
    scale = color_scale(graph, view.nodes, statistic)
    if scale.lo is None or scale.hi is None:
        return [f'<text x="{x:.0f}" y="36" font-size="10">no statistics (run with --capture)</text>']
    constant = constant_label(scale.lo, scale.hi)
    if constant is not None:  # one colour and the value, not two equal ends
        return [(f'<rect class="legend colorbar" x="{x:.0f}" y="24" width="24" height="12" '
                f'fill="{scale.color(scale.lo)}" stroke="#555555" stroke-width="0.5"/>'),
                (f'<text x="{x + 34:.0f}" y="34" font-size="10">{escape(STATISTIC_LABELS[statistic])}: '
                f'{escape(constant)}</text>')]
    bar_w = max(120.0, min(320.0, width - 2 * x - 260))
    stops = "".join(f'<stop offset="{t:.3f}" stop-color="{c}"/>' for t, c in scale.gradient())
    parts = [f'<defs><linearGradient id="cbar">{stops}</linearGradient></defs>',
             (f'<rect class="legend colorbar" x="{x:.0f}" y="24" width="{bar_w:.0f}" height="12" '
             f'fill="url(#cbar)" stroke="#555555" stroke-width="0.5"/>')]
    for t, _value, label in scale.ticks():
        tx = x + t * bar_w
        parts.append(f'<line class="tick" x1="{tx:.1f}" y1="24" x2="{tx:.1f}" y2="40" stroke="#333333" '
                     f'stroke-width="0.8"/><text x="{tx:.1f}" y="50" font-size="9" text-anchor="middle">'
                     f'{escape(label)}</text>')
    around = ", 1 in the middle" if scale.diverging else ""
    lo_text, hi_text = range_labels(scale.lo, scale.hi)
    caption = f"{STATISTIC_LABELS[statistic]}, log scale{around}: {lo_text} to {hi_text}"
    parts.append(f'<text x="{x + bar_w + 10:.0f}" y="34" font-size="10">{escape(caption)}</text>')
    return parts


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
