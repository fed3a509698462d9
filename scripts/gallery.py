"""Regenerate docs/images/: a screenshot of every view and window at 1280×800.

Run it in a real window (an X server; Xvfb is enough)::

    Xvfb :57 -screen 0 1280x800x24 &
    DISPLAY=:57 GRADEXPLORER_SETTINGS=/tmp/gallery.ini .venv/bin/python scripts/gallery.py

It uses the offline demo (demo:shapes with its pictures), a resnet18 with random weights
on small random inputs (a deep model: the flow chart and the graph), a comparison of two
resnet18 captures, and a watch log of a few training steps. Pictures larger than
300 KB are quantised with ImageMagick's ``convert`` when it is installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE = (1280, 800)
MAX_BYTES = 300_000


def _wait(signal, start: Callable[[], object]) -> tuple:
    from gradexplorer.app.window.signal_wait import wait_for_signal

    return wait_for_signal(signal, start, timeout_s=300)


def _settle(app, ms: int = 700) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()
    app.processEvents()


def _save(window, path: Path) -> None:
    window.grab().save(str(path), "PNG")
    if path.stat().st_size > MAX_BYTES and shutil.which("convert"):
        subprocess.run(["convert", str(path), "-colors", "192", "PNG8:" + str(path)], check=True)
    print(f"{path}: {path.stat().st_size // 1000} KB")


def _resnet_files(folder: Path) -> tuple[Path, Path, Path]:
    import torch
    import torchvision

    import gradexplorer as gx
    from gradexplorer.model_graph.graph import graph_for_capture

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 96, 96)
    meta = {"model": "resnet18", "model_name": "resnet18 (random weights)", "target": "top1"}
    a = gx.capture(model, x, meta=meta)
    a.graph = graph_for_capture(model, x, a).to_dict()
    gx.save_capture(a, folder / "resnet18_a.pt")
    with torch.no_grad():
        for p in model.layer4.parameters():
            p.mul_(1.02)
    b = gx.capture(model, x, meta=meta)
    gx.save_capture(b, folder / "resnet18_b.pt")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with gx.watch(model, str(folder / "run.gxw"), every=1) as w:
        for _ in range(8):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([1, 2]))
            loss.backward()
            opt.step()
            w.step(loss=loss)
    return folder / "resnet18_a.pt", folder / "resnet18_b.pt", folder / "run.gxw"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"), help="folder of the PNGs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from gradexplorer.app.window.application import setup_application
    from gradexplorer.app.window.compare_window import CompareWindow
    from gradexplorer.app.window.main_window import MainWindow
    from gradexplorer.app.window.timeline_window import TimelineWindow
    from gradexplorer.models.demos import WINDOW_DEMO

    app = setup_application()
    shots: list[tuple[str, Callable[[], object]]] = []

    window = MainWindow(restore_geometry=False)
    window.resize(*SIZE)
    window.show()
    window.session.set_input_grad(True)
    window.run_panel.sync_from_session()
    _wait(window.run_done, lambda: window.load_model(WINDOW_DEMO, run=True))
    _settle(app, 1200)
    views = window.views
    heat = views.heatmap_view

    def show(view) -> Callable[[], object]:
        return lambda: views.tabs.setCurrentWidget(view)

    def activation() -> None:
        views.tabs.setCurrentWidget(heat)
        heat.set_tensor("activation")

    def gradient() -> None:
        views.tabs.setCurrentWidget(heat)
        heat.set_tensor("grad_output")

    shots += [("heatmap_signed", gradient), ("heatmap_unsigned", activation),
              ("gradcam", show(views.gradcam_view)), ("histogram", show(views.histogram_view)),
              ("statistics", show(views.stats_view)), ("saliency_pictures", show(views.saliency_view))]
    for name, do in shots:
        do()
        _settle(app)
        _save(window, out / f"{name}.png")
    heat.set_tensor("grad_output")

    with tempfile.TemporaryDirectory() as tmp:
        a, b, log = _resnet_files(Path(tmp))
        _wait(window.file_done, lambda: window.open_capture(str(a)))
        views.tabs.setCurrentWidget(heat)
        _settle(app, 1200)
        _save(window, out / "flow_deep_model.png")
        window.module_tabs.setCurrentIndex(1)
        _settle(app, 3000)
        _save(window, out / "graph.png")
        window.module_tabs.setCurrentIndex(0)

        compare = CompareWindow()
        compare.resize(*SIZE)
        compare.show()
        _wait(compare.runner.finished, lambda: compare.compare_files(str(a), str(b)))
        _settle(app, 1500)
        _save(compare, out / "compare.png")
        compare.tabs.setCurrentIndex(1)
        _settle(app, 3000)
        _save(compare, out / "compare_graph.png")
        compare.close()

        timeline = TimelineWindow(None)
        timeline.resize(*SIZE)
        timeline.show()
        _wait(timeline.view.updated, lambda: timeline.view.open_log(str(log)))
        rows = timeline.view.timeline.rows
        timeline.view.select_layer(rows[len(rows) // 2])
        _settle(app, 2000)
        _save(timeline, out / "timeline.png")
        timeline.close()
    window.close()
    window.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
