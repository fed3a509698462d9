"""Layered (Sugiyama) layout of a model graph view: node centres, sizes and edge paths.

Engines, tried in the order of ``ENGINES`` unless one is named (``auto`` skips the slow
ones above their size limits):

* ``dot`` — Graphviz's program, where it is installed (``apt-get install graphviz``): the
  best-looking routes (splines around nodes) but a separate process and the slowest on
  large graphs.
* ``igraph`` — ``Graph.layout_sugiyama`` from python-igraph (C core): fast at any size;
  equal-width slots, so wide labels are spaced by the widest one in a layer.
* ``grandalf`` — pure-Python Sugiyama with real node sizes: good pictures, slow beyond a
  few hundred nodes.
* ``simple`` — the fallback written here: longest-path layers, barycentre ordering sweeps,
  sizes respected. Always available.

docs/benchmarks.md ("The model graph") gives the measurements behind the default order. Everything here is
plain Python and NumPy-free; it runs off the UI thread in the window.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.model_graph.graph import GraphView, ModelGraph

#: Default engine order: Graphviz draws the nicest small graphs (spline routes), but is
#: some hundred times slower than igraph on a fully expanded big net (docs/benchmarks.md,
#: "The model graph"), hence the limits below.
ENGINES = ("dot", "igraph", "grandalf", "simple")
#: Scene units per character of a node label, node height, and the gaps.
CHAR_W, NODE_H, H_GAP, V_GAP, MIN_W = 7.0, 34.0, 18.0, 46.0, 48.0
#: Above this many nodes, engines too slow for interactive use are skipped in "auto".
GRANDALF_LIMIT = 300
DOT_LIMIT = 200


@dataclass
class Layout:
    """Where things go (scene units, y grows downwards, centres of nodes).

    Attributes
    ----------
    pos : dict
        Node id -> (x, y) centre.
    size : dict
        Node id -> (width, height).
    routes : dict
        (src, dst) -> list of (x, y) points from the source's border to the target's.
    engine : str
    seconds : float
    """

    pos: dict[str, tuple[float, float]]
    size: dict[str, tuple[float, float]]
    routes: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    engine: str = ""
    seconds: float = 0.0

    def bounds(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) around every node."""
        if not self.pos:
            return (0.0, 0.0, 0.0, 0.0)
        xs0 = [x - self.size[n][0] / 2 for n, (x, _) in self.pos.items()]
        xs1 = [x + self.size[n][0] / 2 for n, (x, _) in self.pos.items()]
        ys0 = [y - self.size[n][1] / 2 for n, (_, y) in self.pos.items()]
        ys1 = [y + self.size[n][1] / 2 for n, (_, y) in self.pos.items()]
        return (min(xs0), min(ys0), max(xs1), max(ys1))

    def shifted(self, dx: float, dy: float) -> Layout:
        """The same layout moved by (dx, dy) (to keep a clicked node in place)."""
        return Layout({n: (x + dx, y + dy) for n, (x, y) in self.pos.items()}, dict(self.size),
                      {k: [(x + dx, y + dy) for x, y in pts] for k, pts in self.routes.items()},
                      self.engine, self.seconds)


def node_label(graph: ModelGraph, node_id: str) -> str:
    """Two lines: the short name (with call number) and the type."""
    n = graph.nodes[node_id]
    if n.kind == "module":
        return f"{n.label}\n{n.type}"
    if n.kind == "op":
        return n.name
    return n.name


def node_size(graph: ModelGraph, node_id: str) -> tuple[float, float]:
    lines = node_label(graph, node_id).split("\n")
    w = max(MIN_W, CHAR_W * max(len(s) for s in lines) + 16)
    h = NODE_H if len(lines) > 1 else NODE_H * 0.7
    if graph.nodes[node_id].kind == "op":
        h = NODE_H * 0.6
    return (w, h)


def available_engines() -> list[str]:
    """Engines usable on this machine, in ``ENGINES`` order."""
    out = []
    for e in ENGINES:
        if e == "dot" and shutil.which("dot") is None:
            continue
        # Found, not imported: importing igraph is slow (docs/benchmarks.md, "The model
        # graph"), which the first paint of a
        # graph laid out by dot should not pay (the engine is imported when it is used).
        if e in ("igraph", "grandalf") and importlib.util.find_spec(e) is None:
            continue
        out.append(e)
    return out


def preload_engines() -> list[str]:
    """Import the layout libraries that are installed but not imported yet (igraph's import
    is slow), so that a worker can pay for it before the first big layout needs it.

    Returns
    -------
    list of str
        The engines imported now.
    """
    import sys

    done = []
    for e in ("igraph",):
        if e not in sys.modules and importlib.util.find_spec(e) is not None:
            importlib.import_module(e)
            done.append(e)
    return done


def layout_view(graph: ModelGraph, view: GraphView, engine: str = "auto") -> Layout:
    """Lay out the visible nodes of ``view`` top to bottom.

    Parameters
    ----------
    graph : ModelGraph
    view : GraphView
        From ``graph.view(expanded)``.
    engine : str
        ``auto`` (the first of ``available_engines()`` suited to the size), or one of
        ``ENGINES``.

    Raises
    ------
    GradExplorerError
        When a named engine is not installed.
    """
    sizes = {n: node_size(graph, n) for n in view.nodes}
    edges = [(e.src, e.dst) for e in view.edges]
    if engine == "auto":
        choices = [e for e in available_engines()
                   if not (e == "grandalf" and len(sizes) > GRANDALF_LIMIT)
                   and not (e == "dot" and len(sizes) > DOT_LIMIT)]
        engine = choices[0]
    elif engine not in ENGINES:
        raise GradExplorerError(f"Unknown layout engine '{engine}'.", f"Use one of: auto, {', '.join(ENGINES)}.")
    elif engine not in available_engines():
        raise GradExplorerError(f"The layout engine '{engine}' is not installed here.",
                                "Install it (pip install igraph grandalf; apt-get install graphviz) or use 'auto'.")
    t0 = time.perf_counter()
    fn = {"dot": _dot, "igraph": _igraph, "grandalf": _grandalf, "simple": _simple}[engine]
    layout = fn(list(view.nodes), edges, sizes)
    layout.engine = engine
    layout.seconds = time.perf_counter() - t0
    for s, d in edges:
        if (s, d) not in layout.routes:
            layout.routes[(s, d)] = [layout.pos[s], layout.pos[d]]
    return layout


# -- engines -----------------------------------------------------------------------


def _dot(nodes: list[str], edges: list[tuple[str, str]], sizes: dict) -> Layout:
    index = {n: i for i, n in enumerate(nodes)}
    lines = ["digraph G {", "rankdir=TB; nodesep=0.25; ranksep=0.45; splines=spline;",
             'node [shape=box, fixedsize=true, label=""];']
    for n in nodes:
        w, h = sizes[n]
        lines.append(f"n{index[n]} [width={w / 72:.3f}, height={h / 72:.3f}];")
    for s, d in edges:
        lines.append(f"n{index[s]} -> n{index[d]};")
    lines.append("}")
    try:
        out = subprocess.run(["dot", "-Tplain"], input="\n".join(lines), capture_output=True,
                             text=True, timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise GradExplorerError(f"Graphviz 'dot' failed: {exc}", "Use another layout engine.") from exc
    pos: dict[str, tuple[float, float]] = {}
    routes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    height = 0.0
    for line in out.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "graph":
            height = float(parts[3]) * 72
        elif parts[0] == "node":
            pos[nodes[int(parts[1][1:])]] = (float(parts[2]) * 72, height - float(parts[3]) * 72)
        elif parts[0] == "edge":
            s, d, k = nodes[int(parts[1][1:])], nodes[int(parts[2][1:])], int(parts[3])
            pts = [(float(parts[4 + 2 * i]) * 72, height - float(parts[5 + 2 * i]) * 72) for i in range(k)]
            routes[(s, d)] = pts
    return Layout(pos, sizes, routes)


def _igraph(nodes: list[str], edges: list[tuple[str, str]], sizes: dict) -> Layout:
    import igraph

    index = {n: i for i, n in enumerate(nodes)}
    g = igraph.Graph(n=len(nodes), edges=[(index[s], index[d]) for s, d in edges], directed=True)
    slot = max((w for w, _ in sizes.values()), default=MIN_W) + H_GAP
    lay = g.layout_sugiyama(maxiter=50)
    coords = lay.coords
    pos = {n: (coords[i][0] * slot, coords[i][1] * (NODE_H + V_GAP)) for i, n in enumerate(nodes)}
    return _compact_rows(Layout(pos, sizes))


def _grandalf(nodes: list[str], edges: list[tuple[str, str]], sizes: dict) -> Layout:
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    class _View:
        def __init__(self, w: float, h: float) -> None:
            self.w, self.h, self.xy = w, h, (0.0, 0.0)

    vs = {n: Vertex(n) for n in nodes}
    for n, v in vs.items():
        v.view = _View(*sizes[n])
    g = Graph(list(vs.values()), [Edge(vs[s], vs[d]) for s, d in edges])
    pos: dict[str, tuple[float, float]] = {}
    x_offset = 0.0
    for comp in g.C:
        sug = SugiyamaLayout(comp)
        sug.yspace, sug.xspace = V_GAP, H_GAP
        roots = [v for v in comp.sV if len(v.e_in()) == 0]
        sug.init_all(roots=roots or None)
        sug.draw(3)
        xs = [v.view.xy[0] for v in comp.sV]
        lo = min(xs) - max(v.view.w for v in comp.sV)
        for v in comp.sV:
            pos[v.data] = (v.view.xy[0] - lo + x_offset, v.view.xy[1])
        x_offset += max(xs) - lo + 2 * H_GAP + max(v.view.w for v in comp.sV)
    return Layout(pos, sizes)


def _simple(nodes: list[str], edges: list[tuple[str, str]], sizes: dict) -> Layout:
    """Longest-path layering, barycentre sweeps, then rows packed left to right."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    pred: dict[str, list[str]] = {n: [] for n in nodes}
    for s, d in edges:
        succ[s].append(d)
        pred[d].append(s)
    layer = _longest_path_layers(nodes, succ, pred)
    rows: dict[int, list[str]] = {}
    for n in nodes:  # forward order is a good first order
        rows.setdefault(layer[n], []).append(n)
    order = {n: i for r in rows.values() for i, n in enumerate(r)}
    keys = sorted(rows)
    for sweep in range(8):
        down = sweep % 2 == 0
        for k in (keys[1:] if down else keys[-2::-1]):
            def bary(n: str, nbrs: dict = pred if down else succ) -> float:
                ps = nbrs[n]
                return sum(order[p] for p in ps) / len(ps) if ps else order[n]

            rows[k].sort(key=bary)
            for i, n in enumerate(rows[k]):
                order[n] = i
    pos = {}
    for k in keys:
        x = 0.0
        for n in rows[k]:
            w = sizes[n][0]
            pos[n] = (x + w / 2, k * (NODE_H + V_GAP))
            x += w + H_GAP
    return _center_rows(Layout(pos, sizes), rows)


def _longest_path_layers(nodes: Iterable[str], succ: dict, pred: dict) -> dict[str, int]:
    """Layer of each node: 1 + the largest layer of its predecessors (Kahn order; a cycle,
    which a forward cannot make, is broken by taking the remaining nodes in order)."""
    indeg = {n: len(pred[n]) for n in succ}
    layer = dict.fromkeys(succ, 0)
    ready = [n for n in succ if indeg[n] == 0]
    done: set[str] = set()
    remaining = list(succ)
    while len(done) < len(succ):
        if not ready:
            ready = [next(n for n in remaining if n not in done)]
        n = ready.pop()
        if n in done:
            continue
        done.add(n)
        for d in succ[n]:
            layer[d] = max(layer[d], layer[n] + 1)
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    return layer


def _compact_rows(layout: Layout) -> Layout:
    """Rows of an equal-slot layout, re-spaced by real widths in their order."""
    rows: dict[float, list[str]] = {}
    for n, (_x, y) in layout.pos.items():
        rows.setdefault(y, []).append(n)
    for y, row in rows.items():
        row.sort(key=lambda n: layout.pos[n][0])
        x_prev = None
        for n in row:
            x, _ = layout.pos[n]
            w = layout.size[n][0]
            if x_prev is not None and x - w / 2 < x_prev + H_GAP:
                x = x_prev + H_GAP + w / 2
            layout.pos[n] = (x, y)
            x_prev = x + w / 2
    return layout


def _center_rows(layout: Layout, rows: dict[int, list[str]]) -> Layout:
    widest = max((layout.pos[r[-1]][0] + layout.size[r[-1]][0] / 2 for r in rows.values() if r), default=0.0)
    for r in rows.values():
        if not r:
            continue
        right = layout.pos[r[-1]][0] + layout.size[r[-1]][0] / 2
        dx = (widest - right) / 2
        for n in r:
            x, y = layout.pos[n]
            layout.pos[n] = (x + dx, y)
    return layout
