"""Grad-CAM of the selected layer over the selected sample's picture."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PIL import Image
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from gradexplorer.analysis.class_names import class_name
from gradexplorer.analysis.gradcam import cam_grid, cam_unavailable_reason, grad_cam, overlay, turbo
from gradexplorer.analysis.heatmaps import display_image
from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.views.plot_style import ScaleBar, colormap_of, image_plot, style_plot_widget
from gradexplorer_app.views.view_context import CaptureView

#: What the Grad-CAM colours measure.
CAM_TITLE = "Grad-CAM, scaled per sample (0 = none, 1 = strongest)"


class GradCamView(CaptureView):
    """Grad-CAM overlay with an opacity slider; the CAM alone when there is no picture."""

    title = "Grad-CAM"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._cam: np.ndarray | None = None
        self._picture: Image.Image | None = None
        self._rgb: np.ndarray | None = None

        content = QWidget(self)
        self.opacity_slider = QSlider(Qt.Orientation.Horizontal)
        self.opacity_slider.setRange(0, 100)
        self.opacity_slider.setValue(50)
        self.opacity_label = QLabel("50 %")
        self.info_label = QLabel()
        self.info_label.setWordWrap(True)
        self.info_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.plot_widget)
        self.plot, self.image = image_plot(self.plot_widget.ci)
        self.plot.hideAxis("left")
        self.plot.hideAxis("bottom")
        # The CAM is scaled to [0, 1] for each sample (gradexplorer.analysis.gradcam): the bar
        # says so, in the colours of the overlay.
        self.colorbar = ScaleBar(CAM_TITLE, signed=False, cmap=colormap_of(turbo(np.linspace(0.0, 1.0, 256))))
        self.plot_widget.ci.addItem(self.colorbar, row=0, col=1)

        row = QHBoxLayout()
        row.addWidget(QLabel("Opacity"))
        row.addWidget(self.opacity_slider, 1)
        row.addWidget(self.opacity_label)
        v = QVBoxLayout(content)
        v.setContentsMargins(4, 4, 4, 4)
        v.addWidget(self.info_label)
        v.addWidget(self.plot_widget, 1)
        v.addLayout(row)
        self.set_content(content)
        self.opacity_slider.valueChanged.connect(self._on_opacity_changed)

    # -- public API -------------------------------------------------------------------
    def current_cam(self) -> np.ndarray | None:
        """The CAM of the selected sample, in [0, 1], at the picture's size (or None)."""
        self.ensure_drawn()
        return self._cam

    def current_rgb(self) -> np.ndarray | None:
        self.ensure_drawn()
        return self._rgb

    def set_opacity(self, value: float) -> None:
        self.opacity_slider.setValue(int(round(value * 100)))

    def export_widget(self) -> QWidget:
        return self.plot_widget

    # -- drawing ----------------------------------------------------------------------
    def refresh(self) -> None:
        self._cam = self._picture = self._rgb = None
        problem = self.common_problem(needs_tensors="Grad-CAM")
        if problem:
            self.image.clear()
            self.show_message(problem)
            return
        ctx = self.context
        cap, _rec, call = ctx.selected()
        shape = tuple(call.shape)
        why = cam_unavailable_reason(shape, ctx.input_shape, ctx.layer)
        if why is not None:
            self.image.clear()
            self.show_message(why)
            return
        if call.activation is None or call.grad_output is None:
            self.image.clear()
            self.show_message(f"No gradient reached '{ctx.layer}', so Grad-CAM cannot weight its channels.")
            return
        s = min(max(ctx.sample, 0), call.activation.shape[0] - 1)
        picture, source = self._picture_for(s)
        size = (picture.height, picture.width) if picture is not None else None
        try:
            cam = grad_cam(call.activation[s : s + 1], call.grad_output[s : s + 1], out_size=size, layer=ctx.layer,
                           input_shape=ctx.input_shape)
        except GradExplorerError as exc:
            self.image.clear()
            self.show_message(f"{exc.problem}\n{exc.fix}")
            return
        self._cam = cam[0].cpu().numpy()
        self._picture = picture
        target = cap.meta.get("target", "")
        grid_shape = cam_grid(shape, ctx.input_shape)
        assert grid_shape is not None  # cam_unavailable_reason found a grid
        grid = "×".join(map(str, grid_shape[:2]))
        flat = ("<br><span style='color:#d08000'>The CAM is zero everywhere: no channel of this layer "
                "votes for the target (all channel weights × activations are ≤ 0, or the gradient is zero)."
                "</span>" if not np.any(self._cam > 0) else "")
        self.info_label.setText(
            f"<b>{ctx.layer}</b> · Grad-CAM for target <i>{target}</i>{self._predicted(s)} · "
            f"{ctx.sample_name()} · layer grid {grid} · {source}{flat}"
        )
        self.opacity_slider.setEnabled(picture is not None)
        self._draw()
        self.show_content()

    def _predicted(self, s: int) -> str:
        cap, _rec, _call = self.context.selected()
        out = cap.output
        if out is None or out.dim() != 2 or s >= out.shape[0]:
            return ""
        return f" (predicted: {class_name(int(out[s].argmax()), cap.meta.get('categories'))})"

    def _picture_for(self, s: int) -> tuple[Image.Image | None, str]:
        """The picture to overlay, and where it came from, in words."""
        ctx = self.context
        cap, _rec, _call = ctx.selected()
        x = cap.input if cap.input is not None else (ctx.batch.tensor if ctx.batch else None)
        if ctx.batch is not None and ctx.batch.images and s < len(ctx.batch.images):
            img = ctx.batch.images[s]
            # The original picture lines up with the CAM only if preprocessing did not crop
            # it; otherwise show what the model saw.
            if x is None or (x.dim() == 4 and (img.height, img.width) == tuple(x.shape[2:])):
                return img.convert("RGB"), "over the input picture"
        if x is not None and s < x.shape[0]:
            rgb = display_image(x[s])
            if rgb is not None:
                return Image.fromarray(rgb), "over the input tensor (de-normalised per channel)"
        return None, "no picture in this batch: the CAM alone"

    def _draw(self) -> None:
        if self._cam is None:
            return
        opacity = self.opacity_slider.value() / 100.0
        self.opacity_label.setText(f"{self.opacity_slider.value()} %")
        if self._picture is not None:
            rgb = np.asarray(overlay(self._picture, self._cam, opacity))
        else:
            rgb = turbo(self._cam)
        self._rgb = rgb
        self.image.setImage(rgb, autoLevels=False, levels=(0, 255))
        h, w = rgb.shape[:2]
        self.plot.setRange(xRange=(0, w), yRange=(0, h), padding=0.01)

    def _on_opacity_changed(self, _value: int) -> None:
        self._draw()
