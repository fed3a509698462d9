"""``gradexplorer graph``: the model's data-flow graph as JSON, Graphviz, SVG or PNG.

JSON and DOT need no Qt; SVG is written by ``gradexplorer.model_graph.render`` without Qt too. PNG is
the SVG drawn by Qt's SVG renderer on an offscreen surface (Qt is imported only then).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from gradexplorer.base.errors import GradExplorerError

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.
from gradexplorer.model_graph.statistics import DIVERGENCE_BY, STATISTIC_LABELS  # no torch: see its docstring
from gradexplorer_app.cli.common import (
    UI,
    add_common,
    add_input_args,
    add_model_args,
    files_read,
    job_options,
    job_progress,
)

if TYPE_CHECKING:
    from gradexplorer.model_graph.graph import ModelGraph
    from gradexplorer_app.cli.common import SubParsers

SUFFIXES = (".json", ".dot", ".svg", ".png")


def register(sub: SubParsers) -> None:
    """Add the ``graph`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "graph", help="draw the model's data-flow graph (JSON, DOT, SVG or PNG)",
        description="Write the model's data-flow graph: every module call, the tensor operations "
                    "between modules (add, cat, matmul...) and the tensors that join them. FILE.json "
                    "holds every node at every depth (see docs/model-graph.md); pictures show the "
                    "graph collapsed to --depth.",
    )
    add_model_args(p, required=False)
    add_input_args(p)
    p.add_argument("--depth", type=int, metavar="N",
                   help="pictures: expand containers down to depth N (default: ~60 nodes visible)")
    p.add_argument("--capture", metavar="CAP.pt",
                   help="colour nodes by this capture's statistics; without --model, draw the graph "
                        "the capture file carries")
    p.add_argument("--compare", metavar="B.pt",
                   help="with --capture A.pt: colour nodes by how capture B differs from A (as "
                        "'gradexplorer diff A.pt B.pt' computes it); --color-by div_grad (default), "
                        "div_activation or grad_ratio")
    p.add_argument("--grads", action="store_true",
                   help="run one forward and backward to put the gradient norm on every edge and node")
    p.add_argument("--target", default="top1", metavar="T", help="with --grads: top1 (default), class:N, sum, mean...")
    p.add_argument("--color-by", default=None, choices=list(STATISTIC_LABELS),
                   help="node colour (default grad_l2, or div_grad with --compare)")
    p.add_argument("--layout", default="auto", metavar="ENGINE", help="auto (default), dot, igraph, grandalf, simple")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.json, FILE.dot, FILE.svg or FILE.png")
    add_common(p)
    p.set_defaults(func=cmd_graph)


def _suffix(out: str) -> str:
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise GradExplorerError(f"--out '{out}' must end in {', '.join(SUFFIXES)};",
                                "for example --out model.svg.")
    return suffix


def build_graph(args: argparse.Namespace, ui: UI) -> ModelGraph:
    """The graph the command line asks for (model and/or capture), with statistics."""
    from gradexplorer.model_graph.graph import ModelGraph, extract_graph, first_sample

    cap = None
    if args.capture:
        from gradexplorer.files.capture_file import load_capture

        ui.bar.update("loading capture")
        cap = load_capture(args.capture)
    if not args.model:
        if cap is None:
            raise GradExplorerError("graph needs a model or a capture file;",
                                    "give --model NAME (with an input) or --capture CAP.pt.")
        data = getattr(cap, "graph", None)
        if not data:
            raise GradExplorerError(f"the capture '{args.capture}' carries no graph (written by an older "
                                    "gradexplorer);", "give --model too, so that the graph can be extracted.")
        graph = ModelGraph.from_dict(data, source=f"the graph in '{args.capture}'")
        graph.attach_capture(cap)
        return graph
    from gradexplorer.pipeline.job import CaptureJob

    if not (args.input or args.random is not None or args.demo_input) and not str(args.model).startswith("demo:"):
        args.random = ""  # a random batch of the model's input shape: the graph needs no real data
    job = CaptureJob(job_options(args, target=args.target), job_progress(ui))
    loaded = job.load_model()
    batch = job.load_batch()
    if args.grads:
        from gradexplorer.model_graph.grads import graph_gradients

        ui.bar.update("forward and backward")
        graph = graph_gradients(loaded.module, batch.model_input, target=args.target, labels=job.labels)
    else:
        ui.bar.update("probing")
        graph = extract_graph(loaded.module, first_sample(batch.model_input))
    graph.meta["model"] = loaded.name
    if cap is not None and graph.attach_capture(cap) == 0:
        ui.note(f"note: no layer of '{args.capture}' is in this model's graph; nodes are not coloured.")
    return graph


def _color_by(args: argparse.Namespace) -> str:
    """The statistic to colour by, checked against --compare."""

    if args.compare and not args.capture:
        raise GradExplorerError("--compare B.pt compares with a capture A;", "give --capture A.pt too.")
    color_by = args.color_by or ("div_grad" if args.compare else "grad_l2")
    if color_by in DIVERGENCE_BY and not args.compare:
        raise GradExplorerError(f"--color-by {color_by} colours by a comparison;",
                                "give --capture A.pt --compare B.pt.")
    return color_by


def attach_compare(graph: ModelGraph, args: argparse.Namespace, ui: UI) -> None:
    """Colour ``graph`` by how the capture --compare differs from --capture (``gradexplorer.comparison.compare``)."""
    from gradexplorer.comparison.compare import compare
    from gradexplorer.files.capture_file import load_capture
    from gradexplorer.model_graph.compare import attach_comparison

    ui.bar.update("comparing")
    a, b = load_capture(args.capture), load_capture(args.compare)
    result = compare(a, b, label_a=Path(args.capture).name, label_b=Path(args.compare).name)
    if attach_comparison(graph, result) == 0:
        ui.note(f"note: no compared layer of '{args.capture}' is in the graph; nodes are not coloured.")


def cmd_graph(args: argparse.Namespace, ui: UI) -> int:
    """Run ``gradexplorer graph``; returns the exit status."""
    from gradexplorer.base.file_write import atomic_write_bytes, check_output_path

    suffix = _suffix(args.out)
    out = check_output_path(args.out, [*files_read(args), args.capture, args.compare])
    if args.depth is not None and args.depth < 0:
        raise GradExplorerError(f"--depth {args.depth} is negative;", "give 0 (the model as one box) or more.")
    color_by = _color_by(args)
    graph = build_graph(args, ui)
    if args.compare:
        attach_compare(graph, args, ui)
    if suffix == ".json":
        data = json.dumps(graph.to_dict(), indent=1, allow_nan=False).encode()
    else:
        from gradexplorer.model_graph.render import to_dot, to_svg

        depth = graph.default_depth() if args.depth is None else args.depth
        view = graph.view(graph.expanded_to_depth(depth))
        if suffix == ".dot":
            data = to_dot(graph, view, color_by).encode()
        else:
            from gradexplorer.model_graph.layout import layout_view

            ui.bar.update("layout")
            layout = layout_view(graph, view, args.layout)
            svg = to_svg(graph, view, layout, color_by, title=str(graph.meta.get("model", "")))
            if suffix == ".svg":
                data = svg.encode()
            else:
                from gradexplorer_app.views.graph_picture import svg_to_png

                data = svg_to_png(svg)
    atomic_write_bytes(out, data)
    ui.note(f"wrote {out} ({len(graph.nodes)} nodes, {len(graph.edges)} edges)")
    return 0
