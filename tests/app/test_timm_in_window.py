"""The window's model browser lists timm models with their cache state and loads one with
its default weights from the Hugging Face cache, offline."""

from __future__ import annotations

import pytest
import torch

from tests.app.conftest import TIMEOUT
from tests.core.test_timm_models import hf_home, plant_weights  # noqa: F401 (a fixture)

timm = pytest.importorskip("timm")


def test_model_browser_lists_and_loads_a_cached_timm_model(qtbot, window, hf_home):  # noqa: F811
    state = plant_weights(hf_home, "resnet18")
    panel = window.model_panel
    with qtbot.waitSignal(window.controller.catalog_ready, timeout=TIMEOUT):
        window.controller.start()
    assert panel.select_spec("timm:resnet18")
    item = panel.list.currentItem()
    assert item.text(1) == "cached"
    assert panel.weights_combo.currentData() == "DEFAULT"
    assert "cached" in panel.weights_combo.currentText()
    assert "offline" in panel.hint.text()
    with qtbot.waitSignal(window.controller.model_loaded, timeout=TIMEOUT):
        panel.load_button.click()
    loaded = window.session.model
    assert loaded.spec == "timm:resnet18" and loaded.weights == "timm/resnet18.a1_in1k"
    assert torch.equal(loaded.module.state_dict()["fc.weight"], state["fc.weight"])
