"""The module tree model and view: check states both ways, filter, badges, speed."""

from __future__ import annotations

import math

import pytest
import torch
from PySide6.QtCore import QModelIndex, Qt
from PySide6.QtWidgets import QStyle, QStyleOptionViewItem
from torch import nn

from gradexplorer.capturing.inputs import Batch
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.session import PreparedModel, Session, prepare_model
from gradexplorer_app.window.module_tree_view import (
    BADGES_ROLE,
    BAR_ROLE,
    COL_GRAD,
    COL_SHAPE,
    NAME_ROLE,
    ModuleTreeModel,
    ModuleTreePanel,
)

CHECKED, UNCHECKED, PARTIAL = Qt.CheckState.Checked, Qt.CheckState.Unchecked, Qt.CheckState.PartiallyChecked


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.relu(self.conv(x))
        return self.relu(y + x)  # relu is reused, in place


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = Block()
        self.block2 = Block()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = nn.Linear(3, 4)

    def forward(self, x):
        return self.head(self.flatten(self.pool(self.block2(self.block1(x)))))


@pytest.fixture
def session():
    s = Session()
    lm = LoadedModel(Net(), "net", "test net", input_shape=(3, 8, 8), categories=list("abcd"))
    s.set_model(prepare_model(lm))
    s.set_batch(Batch(torch.randn(2, 3, 8, 8), None, ["a", "b"], "random"), ["random:2x3x8x8"])
    return s


@pytest.fixture
def model(qtbot, session):
    return ModuleTreeModel(session)


def state(model: ModuleTreeModel, name: str):
    return Qt.CheckState(model.data(model.index_of(name), Qt.ItemDataRole.CheckStateRole))


def test_qtmodeltester_passes(qtmodeltester, model, session):
    qtmodeltester.check(model)
    session.finish_run(session.begin_run().generation, session.run_capture())
    qtmodeltester.check(model)


def test_qtmodeltester_passes_on_an_empty_session_and_the_proxy(qtmodeltester, qtbot, session):
    qtmodeltester.check(ModuleTreeModel(Session()))
    panel = ModuleTreePanel(session)
    qtbot.addWidget(panel)
    panel.filter_edit.setText("relu")
    qtmodeltester.check(panel.view.proxy)


def test_checking_rows_drives_the_session_selection(model, session):
    assert session.selection == {"block1.conv", "block1.relu", "block2.conv", "block2.relu", "pool", "flatten", "head"}
    assert model.setData(model.index_of("block1.relu"), CHECKED.value * 0, Qt.ItemDataRole.CheckStateRole)
    assert "block1.relu" not in session.selection
    model.setData(model.index_of("block2"), UNCHECKED, Qt.ItemDataRole.CheckStateRole)
    assert not {"block2.conv", "block2.relu"} & session.selection
    model.setData(model.index_of(""), UNCHECKED, Qt.ItemDataRole.CheckStateRole)
    assert session.selection == set()
    model.setData(model.index_of("block1"), CHECKED, Qt.ItemDataRole.CheckStateRole)
    assert session.selection == {"block1.conv", "block1.relu"}


def test_session_selection_drives_the_check_states(qtbot, model, session):
    assert state(model, "") == CHECKED
    with qtbot.waitSignal(model.dataChanged):
        session.select_none()
    assert state(model, "") == UNCHECKED and state(model, "block1") == UNCHECKED
    session.select(["block1.conv"])
    # Partial is derived from the selection below, on every level.
    assert state(model, "block1.conv") == CHECKED
    assert state(model, "block1") == PARTIAL
    assert state(model, "") == PARTIAL
    session.select(["block1.relu"])
    assert state(model, "block1") == CHECKED
    # A container's own output selected (no leaves) shows as partial, with a badge.
    session.set_selection(["block2"])
    assert state(model, "block2") == PARTIAL
    assert "output" in [t for t, _ in model.data(model.index_of("block2"), BADGES_ROLE)]


def test_clicking_the_check_box_in_the_view(qtbot, session):
    panel = ModuleTreePanel(session)
    qtbot.addWidget(panel)
    panel.resize(600, 500)
    panel.show()
    qtbot.waitExposed(panel)
    view = panel.view
    view.expandAll()
    idx = view.proxy.mapFromSource(view.tree_model.index_of("head"))
    rect = view.visualRect(idx)
    opt = QStyleOptionViewItem()
    opt.initFrom(view)
    opt.rect = rect
    opt.features |= QStyleOptionViewItem.ViewItemFeature.HasCheckIndicator
    check = view.style().subElementRect(QStyle.SubElement.SE_ItemViewItemCheckIndicator, opt, view)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=check.center())
    assert "head" not in session.selection
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=check.center())
    assert "head" in session.selection


def test_filter_keeps_ancestors_and_matches_types(qtbot, session):
    panel = ModuleTreePanel(session)
    qtbot.addWidget(panel)
    proxy = panel.view.proxy

    def visible() -> set[str]:
        out, stack = set(), [QModelIndex()]
        while stack:
            parent = stack.pop()
            for r in range(proxy.rowCount(parent)):
                idx = proxy.index(r, 0, parent)
                out.add(idx.data(NAME_ROLE))
                stack.append(idx)
        return out

    panel.filter_edit.setText("relu")
    assert visible() == {"", "block1", "block1.relu", "block2", "block2.relu"}
    panel.filter_edit.setText("linear")  # a type
    assert visible() == {"", "head"}
    panel.filter_edit.setText("")
    assert len(visible()) == len(session.tree)


def test_columns_badges_and_grad_norms(model, session):
    relu = model.index_of("block1.relu")
    badges = [t for t, _ in model.data(relu, BADGES_ROLE)]
    assert "×2" in badges and "in-place" in badges
    assert model.data(model.index_of("block1.conv", COL_SHAPE)) == "3×8×8"
    assert model.data(model.index_of("head", COL_GRAD)) == ""
    session.finish_run(session.begin_run().generation, session.run_capture())
    text = model.data(model.index_of("head", COL_GRAD))
    assert text and math.isfinite(float(text))
    bar = model.data(model.index_of("head", COL_GRAD), BAR_ROLE)
    assert 0.0 <= bar <= 1.0
    assert model.data(model.index_of("block1", COL_GRAD)) == ""  # not captured


def test_flagged_layers_are_marked(model, session):
    with torch.no_grad():
        session.model.module.head.weight.zero_()  # nothing flows back past the head
    session.finish_run(session.begin_run().generation, session.run_capture())
    flag = model.flag_of("block1.conv")
    assert flag and "zero" in flag
    assert model.data(model.index_of("block1.conv"), Qt.ItemDataRole.BackgroundRole) is not None


def test_context_menu_actions(qtbot, session):
    panel = ModuleTreePanel(session)
    qtbot.addWidget(panel)
    menu = panel.view.build_menu("block1.conv")
    actions = {a.text(): a for a in menu.actions()}
    session.select_none()
    actions["Check all Conv2d"].trigger()
    assert session.selection == {"block1.conv", "block2.conv"}
    actions["Check all leaves"].trigger()
    assert len(session.selection) == 7
    actions["Check none"].trigger()
    assert session.selection == set()
    menu = panel.view.build_menu("block2")
    {a.text(): a for a in menu.actions()}["Check children (their own outputs)"].trigger()
    assert session.selection == {"block2.conv", "block2.relu"}


def test_layer_activated_and_select_layer(qtbot, session):
    panel = ModuleTreePanel(session)
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.view.layer_activated) as blocker:
        assert panel.view.select_layer("block2.relu")
    assert blocker.args == ["block2.relu"]
    assert panel.view.current_name() == "block2.relu"
    panel.filter_edit.setText("head")
    assert panel.view.select_layer("block1.conv")  # hidden by the filter: the filter clears
    assert panel.view.current_name() == "block1.conv"


def _big_model(blocks: int) -> nn.Module:
    def block():
        return nn.Sequential(
            nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.ReLU(), nn.Sequential(nn.Identity(), nn.Identity())
        )

    return nn.Sequential(*[block() for _ in range(blocks)])


def test_a_tree_of_thousands_of_modules_appears_fast(qtbot):
    model = _big_model(1000)  # 7001 modules: more than any torchvision model
    session = Session()
    panel = ModuleTreePanel(session)
    qtbot.addWidget(panel)
    panel.resize(500, 700)
    panel.show()
    qtbot.waitExposed(panel)
    # How fast is measured by benchmarks/tree_build.py and benchmarks/ui_stall.py, not here.
    tree = ModuleTree.build(model)
    session.set_model(PreparedModel(LoadedModel(model, "big", "big"), tree))
    panel.view.viewport().repaint()
    assert len(tree) == 7001
    assert panel.view.proxy.rowCount(panel.view.proxy.index(0, 0)) == 1000
    session.select_type("ReLU", False)
    assert session.selection and not any(tree[n].type == "ReLU" for n in session.selection)


@pytest.mark.slow
def test_the_tooltip_gives_the_shape_of_the_batch_that_ran(qtbot, demo):
    """The demo's 12 pictures: after a run the tooltip gives 12×… (it had given 1×…, the
    probe's one sample); before a run it says the shape is one sample's."""
    model = demo.tree_view.tree_model
    tip = model.data(model.index_of("features.0.conv"), Qt.ItemDataRole.ToolTipRole)
    assert "output, the batch of the capture: 12×16×64×64" in tip
    with qtbot.waitSignal(demo.model_loaded, timeout=60_000):
        demo.load_model("demo:shapes")
    tip = model.data(model.index_of("features.0.conv"), Qt.ItemDataRole.ToolTipRole)
    assert "output of one sample (the batch holds 12): 1×16×64×64" in tip


@pytest.mark.slow
def test_a_capture_without_its_model_counts_the_parameters_it_holds(qtbot, demo, tmp_path):
    path = tmp_path / "c.pt"
    with qtbot.waitSignal(demo.file_done, timeout=60_000):
        demo.export_capture(str(path))
    params = demo.session.model.module
    total = sum(p.numel() for p in params.parameters())
    from gradexplorer_app.window.main_window import MainWindow
    from tests.app.conftest import CPU

    other = MainWindow(devices=CPU, restore_geometry=False)
    qtbot.addWidget(other)
    try:
        with qtbot.waitSignal(other.file_done, timeout=60_000):
            other.open_capture(str(path))
        text = other.tree_panel.summary.text()
        assert "0 parameters" not in text
        assert f"{total / 1000:.1f}k parameters with a gradient in the capture" in text
        tree = other.session.tree
        assert tree["features.0.conv"].own_params == sum(p.numel() for p in params.features[0].conv.parameters())
        assert tree["features"].total_params == sum(p.numel() for p in params.features.parameters())
    finally:
        other.shutdown()
