"""The pictures of the graph view in docs/model-graph.md, taken from a real window (run under Xvfb on a
machine without a display):

    Xvfb :97 -screen 0 1600x1600x24 &
    DISPLAY=:97 QT_QPA_PLATFORM=xcb python scripts/graph_screenshots.py docs/

Models have random weights (the machine that made the pictures has no internet); the
gradients are those of the top-1 logit of one random input.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torchvision
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class UNetLike(nn.Module):
    """Two levels down, two up, skip connections joined by ``torch.cat``."""

    def __init__(self, c: int = 8, classes: int = 3):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

        self.enc1, self.enc2 = block(3, c), block(c, 2 * c)
        self.pool = nn.MaxPool2d(2)
        self.bottom = block(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = block(4 * c, 2 * c)
        self.up1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec1 = block(2 * c, c)
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottom(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def shoot(app, panel, path: Path, expand=(), settle: float = 0.5, focus: str | None = None) -> None:
    """Fit the graph (after expanding ``expand``), then centre the view on the frame of the
    container ``focus`` or on the first node whose name holds it, and save the window."""
    def wait():
        t = time.time()
        n = [0]
        conn = panel.layout_done.connect(lambda _s: n.__setitem__(0, 1))
        while not n[0] and time.time() - t < 120:
            app.processEvents()
            time.sleep(0.01)
        panel.layout_done.disconnect(conn)

    for nid in expand:
        panel.toggle(nid)
        wait()
    panel.canvas.fit()
    if focus:
        from gradexplorer_app.views.graph_view import GraphFrameItem

        frames = [i for i in panel.canvas.scene().items() if isinstance(i, GraphFrameItem) and i.node_id == focus]
        if frames:
            panel.canvas.centerOn(frames[0])
        else:
            panel.find_nodes(focus)  # centres on the first match...
            panel.find_nodes("")  # ...and no highlight in the picture
    end = time.time() + settle
    while time.time() < end:
        app.processEvents()
        time.sleep(0.01)
    window = panel.window()
    pixmap = window.screen().grabWindow(window.winId())
    pixmap.save(str(path))
    print("wrote", path, pixmap.width(), "x", pixmap.height())


def main(out: str = "docs") -> int:
    from PySide6.QtWidgets import QApplication

    from gradexplorer.model_graph.grads import graph_gradients
    from gradexplorer_app.views.graph_view import GraphPanel

    out_dir = Path(out)
    out_dir.mkdir(exist_ok=True)
    app = QApplication.instance() or QApplication([])
    torch.manual_seed(0)

    def panel_for(graph, size=(900, 1000), title=""):
        panel = GraphPanel()
        panel.setWindowTitle(f"gradexplorer graph — {title}")
        panel.resize(*size)
        panel.show()
        t = time.time()
        done = [0]
        panel.layout_done.connect(lambda _s: done.__setitem__(0, 1))
        panel.set_graph(graph)
        while not done[0] and time.time() - t < 120:
            app.processEvents()
            time.sleep(0.01)
        return panel

    r18 = graph_gradients(torchvision.models.resnet18().eval(), torch.randn(1, 3, 224, 224))
    r18.meta["model"] = "resnet18"
    p = panel_for(r18, (760, 1500), "resnet18")  # tall enough for the whole of it, names readable
    shoot(app, p, out_dir / "graph-resnet18.png")
    shoot(app, p, out_dir / "graph-resnet18-layer1.png", expand=["m:layer1.0:0", "m:layer1.1:0"])
    p.close()

    vit_model = torchvision.models.vit_b_16().eval()
    # torchvision starts ViT with a zero classifier head: every gradient before it is then
    # exactly zero (the graph says so with the "zero" flag). A small random head instead.
    nn.init.normal_(vit_model.heads.head.weight, std=0.02)
    vit = graph_gradients(vit_model, torch.randn(1, 3, 224, 224))
    vit.meta["model"] = "vit_b_16"
    p = panel_for(vit, (900, 1000), "vit_b_16")
    shoot(app, p, out_dir / "graph-vit.png", expand=["m:encoder.layers.encoder_layer_11:0"],
          focus="m:encoder.layers.encoder_layer_11:0")
    p.close()

    unet = graph_gradients(UNetLike().eval(), torch.randn(1, 3, 64, 64), target="sum")
    unet.meta["model"] = "UNet-like"
    p = panel_for(unet, (900, 1000), "UNet-like")
    shoot(app, p, out_dir / "graph-unet.png", focus="cat")
    p.close()
    compare_shot(app, out_dir / "graph-divergence.png")
    return 0


def compare_shot(app, path: Path) -> None:
    """resnet18 in float32 against bf16 autocast (statistics only), the compare window's
    Graph tab coloured by the relative L2 difference of the output gradients."""
    from gradexplorer.capturing.capture import capture
    from gradexplorer.model_graph.graph import graph_for_capture
    from gradexplorer_app.window.compare_window import CompareWindow

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 112, 112)
    a = capture(model, x, mode="stats")
    b = capture(model, x, mode="stats", autocast="bf16")
    a.graph = graph_for_capture(model, x, a).to_dict()
    window = CompareWindow()
    window.resize(760, 1000)
    window.show()
    panel = window.graph_panel
    done = [0]
    panel.layout_done.connect(lambda _s: done.__setitem__(0, 1))
    window.compare_captures(a, b, "float32", "bf16")
    t = time.time()
    while not done[0] and time.time() - t < 120:
        app.processEvents()
        time.sleep(0.01)
    window.tabs.setCurrentWidget(panel)
    shoot(app, panel, path, expand=["m:layer1.0:0"])
    window.close()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
