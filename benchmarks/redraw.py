"""How long the window takes to redraw when the user switches layer, channel or sample.

    python -m benchmarks.redraw [--quick] [--model resnet50] [--batch 8] [--size 224]

Opens the real ``MainWindow`` offscreen and gives it a model (random init) and a random
batch, makes one full capture of every leaf with ``gradexplorer.capturing.capture.capture`` and hands it to
the session the way a finished run is (``Session.finish_run``), so the window shows it
as after a run: the Grad-CAM tab in front, on the default layer.

Then it switches through the paths a user's click takes, with no worker running:

- layer: ``ModuleTreeView.select_layer`` (a click on a tree row: the current row changes,
  the window tells the views), over ~20 layers spread through the forward order (the
  stem's 112×112 conv, the 56…7 px stages, the fc vector), with the default tab
  (Grad-CAM) and with the Heatmap tab (its default top-k display) in front;
- channel: the Heatmap's channel slider, in its one-channel display, over ~20 channels of
  the first layer1 conv and the last layer4 conv;
- sample: a click on a thumbnail of the batch panel, over every sample and back to 0, on
  the default layer, with each of the two tabs in front.

Each figure is the UI-thread time from the switch to the end of the repaint: the switch,
``QApplication.processEvents()`` (queued signals, layouts, the paints they ask for) and a
forced ``repaint()`` of the capture views (tabs and gradient-flow chart). The forced
repaint may paint a second time what processEvents already painted; the "repaint alone"
row (no switch) says how much that adds at most. A switch whose result did not show (the
view's label names another layer, channel or sample) is counted apart as not shown.

Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

LAYERS = 20
CHANNELS = 20


def _app():
    from PySide6.QtWidgets import QApplication

    return QApplication.instance() or QApplication([])


def _settle(seconds: float) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


def spread(items: list, n: int) -> list:
    """``n`` items evenly spaced through ``items``, first and last included, in order."""
    if n >= len(items):
        return list(items)
    if n <= 1:
        return items[:1]
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def channel_layers(capture) -> list[str]:
    """The first layer1 conv and the last layer4 conv (ResNet), else the first and last
    conv with a 4-D output."""
    convs = [n for n in capture.layer_order
             if capture[n].type == "Conv2d" and capture[n].calls and len(capture[n].calls[0].shape) == 4]
    early = [n for n in convs if n.startswith("layer1.")]
    late = [n for n in convs if n.startswith("layer4.")]
    picked = [(early or convs)[0], (late or convs)[-1]] if convs else []
    return list(dict.fromkeys(picked))


class _Clock:
    """Times switches: the action, the events it queues, and a forced paint."""

    def __init__(self, app, painted):
        self.app = app
        self.painted = painted

    def __call__(self, action) -> float:
        t0 = time.perf_counter()
        action()
        self.app.processEvents()
        self.painted.repaint()
        return (time.perf_counter() - t0) * 1000


def _row(kind: str, view: str, case: str, times: list[float], shown: int | None) -> dict:
    return {
        "kind": kind, "view": view, "case": case, "switches": len(times), "shown": shown,
        "median_ms": statistics.median(times) if times else float("nan"),
        "max_ms": max(times) if times else float("nan"),
        "times_ms": times,
    }


def _visible_text(views) -> str:
    """What the front tab says about its selection: its label, or its message."""
    view = views.current_view()
    if view.message():
        return view.message()
    if view is views.heatmap_view:
        return view.layout_label.text()
    if view is views.gradcam_view:
        return view.info_label.text()
    raise ValueError(f"no label known for the {view.title} view")


def _shows(views, layer: str, sample_name: str | None = None, channel: int | None = None) -> bool:
    text = _visible_text(views)
    if f"'{layer}'" not in text and f"<b>{layer}</b>" not in text:
        return False
    if sample_name is not None and not views.current_view().message() and sample_name not in text:
        return False
    return channel is None or f"channel {channel}<" in text or text.endswith(f"channel {channel}")


def measure_redraw(model: str = "resnet50", batch: int = 8, size: int = 224, layers: int = LAYERS,
                   channels: int = CHANNELS) -> dict:
    """Open the window, show one full capture of ``model`` and time the switches.

    Parameters
    ----------
    model : str
        A torchvision name or a ``demo:`` model (random init for torchvision).
    batch, size : int
        The random batch: ``batch`` samples of 3×size×size (a demo keeps its own shape).
    layers, channels : int
        How many layers / channels to switch through.

    Returns
    -------
    dict
        ``rows``: one dict per series (``kind``, ``view``, ``case``, ``switches``,
        ``shown``: how many switches the view then showed, None for the repaint-alone
        row; ``median_ms``, ``max_ms``, ``times_ms``); ``capture_s`` (the capture
        itself), ``arrive_ms`` (the capture reaching the window until painted),
        ``leaves``, ``model``, ``batch``, ``size``.
    """
    from gradexplorer.base.devices import DeviceInfo
    from gradexplorer.batches import random_batch
    from gradexplorer.capturing.capture import capture
    from gradexplorer.models import load_model
    from gradexplorer.pipeline.session import prepare_model
    from gradexplorer_app.window.main_window import MainWindow

    settings_dir = tempfile.TemporaryDirectory()
    old_settings = os.environ.get("GRADEXPLORER_SETTINGS")
    os.environ["GRADEXPLORER_SETTINGS"] = os.path.join(settings_dir.name, "settings.ini")
    app = _app()
    w = MainWindow(devices=[DeviceInfo("cpu", "cpu", None, None)], restore_geometry=False)
    w.resize(1500, 950)
    w.show()
    out: dict = {"model": model}
    try:
        # The first show (pyqtgraph, fonts, style) is start-up, not a switch.
        _settle(1.0)
        loaded = load_model(model)
        shape = loaded.input_shape if model.startswith("demo:") else (3, size, size)
        x = random_batch(f"{batch}x" + "x".join(str(d) for d in shape), seed=0)
        s = w.session
        s.set_model(prepare_model(loaded, x.tensor))
        s.set_batch(x, ["random"])
        s.set_device("cpu")
        s.set_mode("full")
        s.select_all_leaves()
        app.processEvents()

        request = s.begin_run()
        t0 = time.perf_counter()
        # No layers named: the default selection, as the window's run with every leaf ticked.
        cap = capture(loaded.module, x.tensor, layers=list(request.layers) or None, target=request.target,
                      mode="full", device="cpu", meta=request.meta(), expected_calls=request.expected_calls)
        out["capture_s"] = time.perf_counter() - t0
        out.update(batch=len(x), size=tuple(shape), leaves=len(cap))

        views = w.views
        clock = _Clock(app, views)
        out["arrive_ms"] = clock(lambda: s.finish_run(request.generation, cap, out["capture_s"]))
        default_view = views.current_view().title
        default_layer, _, _ = views.selection()
        names = [n for n in cap.layer_order if cap[n].calls]
        picks = spread(names, layers)
        # Start away from the first pick, so that every switch changes the layer.
        if default_layer == picks[0]:
            picks = picks[1:]
        outputs = [tuple(cap[n].calls[0].shape[1:]) for n in picks]
        kinds = dict.fromkeys(f"{o[-2]}×{o[-1]}" if len(o) == 3 else f"{o[-1]}-vector" for o in outputs)
        span = f"{len(picks)} layers, {picks[0]} … {picks[-1]}: {', '.join(kinds)}"
        rows: list[dict] = []

        def layer_series(view: str) -> None:
            times, shown = [], 0
            for name in picks:
                times.append(clock(lambda: w.tree_view.select_layer(name)))
                shown += _shows(views, name)
            rows.append(_row("layer", view, span, times, shown))

        def sample_series(view: str, layer: str) -> None:
            w.tree_view.select_layer(layer)
            w.batch_panel.list.setCurrentRow(0)
            app.processEvents()
            times, shown = [], 0
            for i in [*range(1, len(x)), 0]:
                times.append(clock(lambda: w.batch_panel.list.setCurrentRow(i)))
                shown += _shows(views, layer, sample_name=x.names[i])
            rows.append(_row("sample", view, f"{layer}, samples 0..{len(x) - 1} and back", times, shown))

        layer_series(default_view)
        sample_series(default_view, default_layer)

        heatmap = views.heatmap_view
        views.show_view(heatmap.title)
        w.tree_view.select_layer(default_layer)
        app.processEvents()
        heatmap_view = f"{heatmap.title} ({heatmap.display_combo.currentData()})"
        layer_series(heatmap_view)
        sample_series(heatmap_view, default_layer)

        heatmap.display_combo.setCurrentIndex(heatmap.display_combo.findData("channel"))
        for layer in channel_layers(cap):
            w.tree_view.select_layer(layer)
            heatmap.channel_slider.setValue(0)
            app.processEvents()
            n = cap[layer].calls[0].shape[1]
            # Spread over the channels, never 0: the slider starts there.
            chosen = [c for c in dict.fromkeys((n - 1) * (i + 1) // channels for i in range(channels)) if c]
            times, shown = [], 0
            for c in chosen:
                times.append(clock(lambda: heatmap.channel_slider.setValue(c)))
                shown += _shows(views, layer, channel=c)
            map_shape = "×".join(map(str, cap[layer].calls[0].shape[2:]))
            rows.append(_row("channel", f"{heatmap.title} (one channel)",
                             f"{layer} ({n} channels, {map_shape}), {len(chosen)} channels", times, shown))

        times = [clock(lambda: None) for _ in range(10)]
        rows.append(_row("repaint alone", views.current_view().title, "no switch, 10 repaints", times, None))
        out["rows"] = rows
    finally:
        w.shutdown()
        w.close()
        w.deleteLater()
        app.processEvents()
        if old_settings is None:
            os.environ.pop("GRADEXPLORER_SETTINGS", None)
        else:
            os.environ["GRADEXPLORER_SETTINGS"] = old_settings
        settings_dir.cleanup()
    return out


def measure(quick: bool = False) -> dict:
    """The figures for ``python -m benchmarks``: resnet50 at 224 px, batch 8 (4 with
    ``quick``, and 8 layers / channels instead of 20)."""
    n = 8 if quick else LAYERS
    return measure_redraw("resnet50", 4 if quick else 8, 224, layers=n, channels=n)


def _print(r: dict) -> None:
    print(f"{r['model']} batch {r['batch']} at {'×'.join(map(str, r['size']))}, {r['leaves']} leaves, "
          f"full capture {r['capture_s']:.1f} s; capture shown in the window in {r['arrive_ms']:.0f} ms")
    header = ("switch", "view", "case", "median", "max", "shown")
    table = [(row["kind"], row["view"], row["case"], f"{row['median_ms']:.1f} ms", f"{row['max_ms']:.1f} ms",
              "-" if row["shown"] is None else f"{row['shown']}/{row['switches']}") for row in r["rows"]]
    widths = [max(len(str(t[i])) for t in [header, *table]) for i in range(len(header))]
    line = "  ".join("-" * wd for wd in widths)
    print(line)
    print("  ".join(h.ljust(wd) for h, wd in zip(header, widths)))
    print(line)
    for t in table:
        print("  ".join(c.ljust(wd) for c, wd in zip(t, widths)))
    print(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 4, 8 layers and 8 channels per series")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args(argv)
    n = 8 if args.quick else LAYERS
    batch = args.batch or (4 if args.quick else 8)
    _print(measure_redraw(args.model, batch, args.size, layers=n, channels=n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
