"""Model graph figures (printed, never asserted): extraction, layout and first paint of the
default view, layout of the full expansion off the UI thread with the UI thread's longest
stall meanwhile, and pan/zoom frame times at full expansion.

    python -m benchmarks.graph [--model efficientnet_v2_l] [--size 224] [--repeats 3]

On a loaded machine absolute times vary: compare the ratios printed in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def extraction(model, x, repeats: int) -> dict:
    """Bare no-grad forward and extraction, interleaved (bare, extract, bare, extract...) so
    that a load that comes and goes on a shared machine hits both alike; the ratio is the
    median of the per-pair ratios."""
    from gradexplorer.model_graph.graph import extract_graph

    model.eval()

    def bare() -> None:
        with torch.no_grad():
            model(x)

    bare()  # warm-up of both
    extract_graph(model, x)
    bares, extracts = [], []
    for _ in range(repeats):
        bares.append(_median_time(bare, 1))
        extracts.append(_median_time(lambda: extract_graph(model, x), 1))
    return {"bare_forward_s": statistics.median(bares), "extract_s": statistics.median(extracts),
            "ratio": statistics.median(e / b for e, b in zip(extracts, bares))}


def window(graph, engine: str, frames: int) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication

    from gradexplorer_app.views.graph_view import GraphPanel

    app = QApplication.instance() or QApplication([])
    panel = GraphPanel(engine=engine)
    panel.resize(1000, 900)
    panel.show()
    out: dict = {}

    def wait_layout(action) -> float:
        done: list[float] = []
        conn = panel.layout_done.connect(lambda s: done.append(s))
        t = time.perf_counter()
        action()
        while not done:
            app.processEvents()
            time.sleep(0.0005)
        panel.canvas.viewport().repaint()  # the first paint, synchronously
        panel.layout_done.disconnect(conn)
        return time.perf_counter() - t

    # The panel imports igraph in a worker when it is made (in the window: at start-up, long
    # before the Graph tab is opened); its time and the UI thread's longest gap meanwhile.
    preload_gaps: list[float] = []
    t = time.perf_counter()
    tick_clock = QElapsedTimer()
    tick_clock.start()
    while panel.preloads._live:
        before = tick_clock.elapsed()
        app.processEvents()
        time.sleep(0.005)
        preload_gaps.append(tick_clock.elapsed() - before)
    out["preload_s"] = time.perf_counter() - t
    out["ui_longest_gap_during_preload_ms"] = max(preload_gaps) if preload_gaps else 0

    out["default_nodes"] = len(graph.view(graph.expanded_to_depth(graph.default_depth())).nodes)
    out["default_layout_and_paint_s"] = wait_layout(lambda: panel.set_graph(graph))
    out["default_engine"] = panel.graph_layout.engine

    # Full expansion, laid out in the worker while a 5 ms timer measures the UI thread's gaps.
    gaps: list[float] = []
    clock = QElapsedTimer()
    clock.start()
    last = [clock.elapsed()]


    def tick() -> None:
        now = clock.elapsed()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(tick)

    def expand_all() -> None:
        panel.expanded = set(graph.containers())
        last[0] = clock.elapsed()
        timer.start()
        panel.relayout()

    t0 = time.perf_counter()
    total = wait_layout(expand_all)
    timer.stop()
    out["full_nodes"] = len(panel.items)
    out["full_layout_s"] = panel.graph_layout.seconds
    out["full_engine"] = panel.graph_layout.engine
    out["full_layout_and_draw_s"] = total
    out["ui_longest_gap_during_layout_ms"] = max(gaps) if gaps else None
    del t0

    # Pan and zoom at full expansion: repaint after each step, median and worst frame.
    canvas = panel.canvas
    canvas.resetTransform()
    canvas.scale(0.6, 0.6)
    canvas.centerOn(panel.items[next(iter(panel.items))])
    pan, zoom = [], []
    for i in range(frames):
        t = time.perf_counter()
        canvas.verticalScrollBar().setValue(canvas.verticalScrollBar().value() + 37)
        canvas.viewport().repaint()
        pan.append(time.perf_counter() - t)
        t = time.perf_counter()
        canvas.zoom(1.05 if i % 2 == 0 else 1 / 1.05)
        canvas.viewport().repaint()
        zoom.append(time.perf_counter() - t)
    # The default view again, warm (fonts loaded, the worker thread started, imports done).
    out["default_again_s"] = wait_layout(lambda: panel.set_graph(graph))
    out["pan_frame_ms_median"] = 1000 * statistics.median(pan)
    out["pan_frame_ms_max"] = 1000 * max(pan)
    out["zoom_frame_ms_median"] = 1000 * statistics.median(zoom)
    out["zoom_frame_ms_max"] = 1000 * max(zoom)
    panel.shutdown()
    return out


def main(argv=None) -> int:
    import torchvision

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="efficientnet_v2_l")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--engine", default="auto")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = torchvision.models.get_model(args.model)
    x = torch.randn(1, 3, args.size, args.size)
    ex = extraction(model, x, args.repeats)
    print(f"extraction  {args.model} 1x3x{args.size}x{args.size}: {ex['extract_s']:.3f} s "
          f"(bare no-grad forward {ex['bare_forward_s']:.3f} s, ratio {ex['ratio']:.2f}; torch threads "
          f"{torch.get_num_threads()})")
    from gradexplorer.model_graph.graph import extract_graph

    graph = extract_graph(model, x)
    print(f"graph       {len(graph.nodes)} nodes ({sum(1 for n in graph if n.kind == 'module')} module calls, "
          f"{sum(1 for n in graph if n.kind == 'op')} ops), {len(graph.edges)} edges")
    w = window(graph, args.engine, args.frames)
    print(f"default     {w['default_nodes']} nodes: layout + first paint "
          f"{1000 * w['default_layout_and_paint_s']:.0f} ms "
          f"({w['default_engine']}; the window's first paint ever), {1000 * w['default_again_s']:.0f} ms warm")
    print(f"preload     igraph imported in a worker when the panel is made: {w['preload_s']:.2f} s; longest "
          f"UI-thread gap meanwhile {w['ui_longest_gap_during_preload_ms']} ms")
    print(f"full        {w['full_nodes']} nodes: layout {1000 * w['full_layout_s']:.0f} ms ({w['full_engine']}, worker "
          f"thread), layout + scene + first paint {1000 * w['full_layout_and_draw_s']:.0f} ms; longest UI-thread gap "
          f"meanwhile {w['ui_longest_gap_during_layout_ms']} ms")
    print(f"pan/zoom    full expansion: pan {w['pan_frame_ms_median']:.1f} ms median / "
          f"{w['pan_frame_ms_max']:.1f} max, "
          f"zoom {w['zoom_frame_ms_median']:.1f} ms median / {w['zoom_frame_ms_max']:.1f} max per frame")
    return 0


if __name__ == "__main__":
    sys.exit(main())
