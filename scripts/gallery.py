"""Regenerate docs/images/ (a screenshot of every view and window at 1280×800, and of the
main window at 960×720, half a 1920 screen) and the window's screenshots that the other
pages show (docs/screenshot-*.png).

Run it in a real window (an X server; Xvfb is enough)::

    Xvfb :57 -screen 0 1280x800x24 &
    DISPLAY=:57 GRADEXPLORER_SETTINGS=/tmp/gallery.ini .venv/bin/python scripts/gallery.py

It uses the offline demo (demo:shapes with its pictures), a resnet18 with random weights
on small random inputs (a deep model: the flow chart and the graph), a comparison of two
resnet18 captures, and a watch log of a few training steps; with transformers installed,
a tiny GPT-2 built here (tests/hf_tiny.py) on two texts for the saliency of tokens. Then,
for the other pages: the demo after its first run, resnet18 on a picture with Grad-CAM on
layer4, the demo against bf16 autocast, a run over the demo's folder of pictures, and the
timeline of a training that goes wrong (scripts/demo_watch_log.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE = (1280, 800)
HALF = (960, 720)


def _wait(signal, start: Callable[[], object]) -> tuple:
    from gradexplorer_app.window.signal_wait import wait_for_signal

    return wait_for_signal(signal, start, timeout_s=300)


def _settle(app, ms: int = 700) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()
    app.processEvents()


def _save(window, path: Path) -> None:
    # Every pixel as drawn: a palette of fewer colours had banded the colour bars and
    # turned the flow chart's legend squares into other colours than their bars.
    window.grab().save(str(path), "PNG")
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


def _vit_capture(path: Path) -> None:
    """A small torchvision ViT with random weights (its heads.head starts at zero), statistics
    only, saved at ``path``."""
    import torch
    from torchvision.models.vision_transformer import VisionTransformer

    import gradexplorer as gx

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=64, patch_size=16, num_layers=4, num_heads=4, hidden_dim=64,
                            mlp_dim=128).eval()
    cap = gx.capture(vit, torch.randn(2, 3, 64, 64), mode="stats",
                     meta={"model": "vit (random weights)", "model_name": "vit (random weights)"})
    gx.save_capture(cap, path)


def _tiny_lm(folder: Path) -> Path | None:
    """A tiny GPT-2 with its tokenizer, saved in ``folder``; None without transformers."""
    try:
        import transformers  # noqa: F401 - only whether it is there
    except ImportError:
        return None
    sys.path.insert(0, str(ROOT))
    from tests import hf_tiny

    return hf_tiny.save("gpt2", folder / "tiny-gpt2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"), help="folder of the gallery's PNGs")
    parser.add_argument("--docs", default=str(ROOT / "docs"),
                        help="folder of the other pages' screenshots (screenshot-*.png)")
    args = parser.parse_args(argv)
    out, docs = Path(args.out), Path(args.docs)
    out.mkdir(parents=True, exist_ok=True)

    from gradexplorer.models.demos import WINDOW_DEMO
    from gradexplorer.pipeline.compare_sources import Variant
    from gradexplorer.pipeline.options import TEXT_SOURCE
    from gradexplorer_app.window import compare_window as compare_module
    from gradexplorer_app.window.application import setup_application
    from gradexplorer_app.window.compare_window import CompareWindow
    from gradexplorer_app.window.main_window import MainWindow
    from gradexplorer_app.window.timeline_window import TimelineWindow

    app = setup_application()
    shots: list[tuple[str, Callable[[], object]]] = []

    window = MainWindow(restore_geometry=False)
    window.resize(*SIZE)
    window.show()
    # The demo as it first opens (Grad-CAM on the last spatial map), for the README.
    _wait(window.run_done, lambda: window.load_model(WINDOW_DEMO, run=True))
    _settle(app, 1200)
    _save(window, docs / "screenshot-demo.png")
    window.session.set_input_grad(True)
    window.run_panel.sync_from_session()
    _wait(window.run_done, window.run)
    _settle(app, 1200)
    views = window.views
    heat = views.heatmap_view
    # A layer whose gradient has a picture in it: after the last block's ReLU comes the
    # global pooling, and its gradient is one value per channel.
    views.set_layer("features.5.conv1")

    def show(view) -> Callable[[], object]:
        return lambda: views.tabs.setCurrentWidget(view)

    def activation() -> None:  # a ReLU's output: non-negative, so a sequential map from 0
        views.set_layer("features.5.relu")
        views.set_call(1)
        views.tabs.setCurrentWidget(heat)
        heat.set_tensor("activation")

    def gradient() -> None:
        views.tabs.setCurrentWidget(heat)
        heat.set_tensor("grad_output")

    def relu(view) -> Callable[[], object]:
        def go() -> None:  # the block's output, after the residual add: ReLU's second call
            views.set_layer("features.5.relu")
            views.set_call(1)
            views.tabs.setCurrentWidget(view)
        return go

    shots += [("heatmap_signed", gradient), ("heatmap_unsigned", activation),
              ("gradcam", relu(views.gradcam_view)), ("histogram", show(views.histogram_view)),
              ("statistics", show(views.stats_view)), ("saliency_pictures", show(views.saliency_view))]
    for name, do in shots:
        do()
        _settle(app)
        _save(window, out / f"{name}.png")
    heat.set_tensor("grad_output")

    # The demo against bf16 autocast, from Run > Compare with... (docs/comparing.md).
    compare_module.ask_source = lambda parent, devices=None: Variant(autocast="bf16")
    compare = window.compare_with()
    assert compare is not None
    compare.resize(*SIZE)
    _wait(compare.runner.finished, lambda: None)
    _settle(app, 1500)
    _save(compare, docs / "screenshot-compare.png")
    compare.close()

    samples = ROOT / "resources" / "demo_shapes" / "samples"

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        a, b, log = _resnet_files(folder)
        _wait(window.file_done, lambda: window.open_capture(str(a)))
        views.tabs.setCurrentWidget(heat)
        _settle(app, 1200)
        _save(window, out / "flow_deep_model.png")
        window.module_tabs.setCurrentIndex(1)
        _settle(app, 3000)
        _save(window, out / "graph.png")
        window.module_tabs.setCurrentIndex(0)
        # Half a 1920 screen: Input batch, Model and Run fold into the Modules panel.
        window.resize(*HALF)
        _settle(app, 1500)
        _save(window, out / "window_960x720.png")
        window.module_tabs.setCurrentIndex(1)
        views.tabs.setCurrentWidget(views.histogram_view)
        _settle(app, 3000)
        _save(window, out / "window_960x720_graph.png")
        window.module_tabs.setCurrentIndex(0)
        views.tabs.setCurrentWidget(heat)
        window.resize(*SIZE)
        _settle(app, 1500)
        # An export: the heatmap drawn again at twice the resolution, under its title line.
        views.set_layer("layer4.1.relu")
        views.set_call(1)
        _settle(app, 800)
        views.export_png(out / "export_heatmap.png")
        print(f"{out / 'export_heatmap.png'}: exported")

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

        # A training whose learning rate keeps growing (docs/watch-and-timeline.md).
        wrong = folder / "demo.gxw"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "demo_watch_log.py"), str(wrong)], check=True)
        timeline = TimelineWindow(None)
        timeline.resize(*SIZE)
        timeline.show()
        _wait(timeline.view.updated, lambda: timeline.view.open_log(str(wrong)))
        timeline.view.select_layer(timeline.view.timeline.rows[6])
        _settle(app, 2000)
        _save(timeline, docs / "screenshot-timeline.png")
        timeline.close()

        # resnet18 on a picture, layer4 ticked, Grad-CAM (the README and docs/window.md).
        picture = samples / "star_1.png"
        _wait(window.run_done, lambda: window.load_model("resnet18", weights=None, inputs=[str(picture)],
                                                          layers=["layer4.*"], run=True))
        views.set_layer("layer4.1.relu")
        views.tabs.setCurrentWidget(views.gradcam_view)
        _settle(app, 1500)
        _save(window, docs / "screenshot-resnet18-gradcam.png")
        # layer4 ticked in the tree (its leaves), and its block layer4.0 clicked in the graph:
        # the last captured call inside it, said so.
        window.session.select_none()
        window.session.set_checked("layer4", True)
        _wait(window.run_done, window.run)
        window.module_tabs.setCurrentIndex(1)
        panel = window.graph_panel
        _settle(app, 3000)
        node = panel.graph.module_node("layer4.0") if panel.graph is not None else None
        if node is not None:
            if node.id not in panel.items:
                _wait(panel.layout_done, lambda: panel.toggle(panel.graph.representative(node.id, panel.expanded)))
            panel.on_node_clicked(node.id)
            views.tabs.setCurrentWidget(heat)
            _settle(app, 1500)
            _save(window, out / "block_click.png")
        window.module_tabs.setCurrentIndex(0)

        # A torchvision ViT with random weights: heads.head starts at zero, and the window
        # says that the gradient stops there.
        vit = folder / "vit.pt"
        _vit_capture(vit)
        _wait(window.file_done, lambda: window.open_capture(str(vit)))
        views.tabs.setCurrentWidget(views.histogram_view)
        views.set_layer("encoder.ln")
        _settle(app, 1500)
        _save(window, out / "alarm_zero_head.png")

        # The saliency of a text, by token: a tiny GPT-2 saved here.
        lm = _tiny_lm(folder)
        if lm is None:
            print("transformers is not installed: saliency_tokens.png left as it is")
        else:
            texts = [TEXT_SOURCE + "the cat sat on the mat", TEXT_SOURCE + "a dog ran"]
            here = Path.cwd()
            os.chdir(lm.parent)  # the model is named by its folder as given: not a temporary path
            try:
                _wait(window.run_done, lambda: window.load_model(f"hf:./{lm.name}", inputs=texts, run=True))
            finally:
                os.chdir(here)
            views.set_layer("transformer.wte")
            views.tabs.setCurrentWidget(views.saliency_view)
            _settle(app, 1500)
            _save(window, out / "saliency_tokens.png")

    # Run > Run over folder... on the demo's pictures (docs/dataset-and-distributed.md).
    _wait(window.run_done, lambda: window.load_model(WINDOW_DEMO, run=True))
    _wait(window.dataset_run.done, lambda: window.dataset_run.run_over_folder(str(samples), batch_size=4))
    views.set_layer("features.2.conv")
    views.tabs.setCurrentWidget(views.histogram_view)
    views.histogram_view.log_check.setChecked(True)
    _settle(app, 1500)
    _save(window, docs / "screenshot-dataset-run.png")
    window.close()
    window.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
