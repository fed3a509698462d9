"""Every command and view on the models people bring, not only torchvision pictures.

The matrix: a token LSTM, a token Transformer encoder, a model of two inputs (positional, and
keyword inputs from a dict ``.pt``), a dict output (target ``top1@out``), an fp16 model and a
bf16 model fed float32 data, through ``gradexplorer capture`` (one batch and a dataset),
``graph``, ``diff``, ``inspect`` (captures and watch logs), ``gradexplorer.recording.watch``, NaN/Inf onset,
the capture schema, and the window (every view tab, the Graph tab, the compare window's
graph, the timeline window). Ground truth is plain autograd on the same model and batch.
The factories live in ``tests/people_models.py`` (``file.py:fn`` for the CLI and the window).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.nonfinite import onset_location
from gradexplorer.capturing.targets import target_scalar
from gradexplorer.files.capture_file import load_capture, save_capture
from gradexplorer.files.schema import check_capture_data
from tests import people_models
from tests.app.test_cli import run
from tests.picture_folders import write_pictures

FACTORIES = Path(people_models.__file__)
TIMEOUT = 60_000


@dataclass(frozen=True)
class Kind:
    """One kind of model: its factory, the batch file's content, its target, the layer whose
    forward output is the model's (primary) output, a layer to poison with NaN, and a layer
    inside (a sequence of tokens, a conv map, or features) that the views show too."""

    factory: str
    make_batch: object
    target: str
    head: str
    poisoned: str
    body: str

    def model(self) -> torch.nn.Module:
        return getattr(people_models, self.factory)().eval()

    def inputs(self) -> ModelInputs:
        obj = self.make_batch()
        if isinstance(obj, dict):
            return ModelInputs((), dict(obj))
        return ModelInputs(obj if isinstance(obj, tuple) else (obj,))


def _tokens():
    return torch.randint(0, people_models.VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))


def _frames():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 3, 8, 8, generator=g), torch.randn(3, 3, 8, 8, generator=g)


KINDS = {
    "lstm": Kind("lstm", _tokens, "top1", "head", "rnn", "rnn"),
    "transformer": Kind("transformer", _tokens, "top1", "head", "encoder.layers.0.linear1", "encoder.layers.0.norm2"),
    "two_inputs": Kind("two_inputs", _frames, "top1", "head", "b", "a"),
    "keywords": Kind("two_inputs", lambda: dict(zip(("frame1", "frame2"), _frames()), scale=torch.tensor(2.0)),
                     "top1", "head", "b", "b"),
    "dict_output": Kind("dict_output", lambda: torch.randn(3, 5, generator=torch.Generator().manual_seed(2)),
                        "top1@out", "cls", "aux", "body"),
    "fp16": Kind("fp16", lambda: torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(3)),
                 "top1", "head", "mix", "mix"),
    # float32 pictures for a bf16 model: the batch takes the model's dtype.
    "bf16": Kind("bf16", lambda: torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(4)),
                 "top1", "classifier", "features.2.conv", "features.4.conv"),
}
IDS = list(KINDS)


def _batch_file(kind: Kind, folder: Path, name: str = "batch.pt") -> Path:
    path = folder / name
    obj = kind.make_batch()
    torch.save(obj, path)
    return path


def _model_dtype_inputs(kind: Kind, model: torch.nn.Module) -> ModelInputs:
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return kind.inputs().map(lambda t: t.to(dtype) if t.is_floating_point() else t)


def _autograd(kind: Kind, model: torch.nn.Module) -> tuple[dict, torch.Tensor | None, torch.Tensor]:
    """Ground truth by plain autograd: every parameter's gradient of the target, the gradient
    with respect to the primary input (None for token ids), and the output of ``kind.head``."""
    inputs = _model_dtype_inputs(kind, model)
    primary = inputs.primary.detach().clone()
    if primary.is_floating_point():
        primary.requires_grad_(True)
    heads = []
    handle = model.get_submodule(kind.head).register_forward_hook(lambda m, a, o: heads.append(o.detach()))
    try:
        out = inputs.call(model, primary)
    finally:
        handle.remove()
    scalar = target_scalar(out, kind.target)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    leaves = [p for p in model.parameters() if p.requires_grad] + ([primary] if primary.requires_grad else [])
    grads = torch.autograd.grad(scalar, leaves, allow_unused=True)
    return dict(zip(names, grads)), (grads[-1] if primary.requires_grad else None), heads[0]


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
    torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol * float(b.abs().max()) + 1e-12)


# -- the CLI ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """One ``gradexplorer capture`` per kind (with --input-grad), run once for the module."""
    made = {}
    for key, kind in KINDS.items():
        folder = tmp_path_factory.mktemp(key)
        batch = _batch_file(kind, folder)
        out = folder / "cap.pt"
        code = _cli("capture", *model_args(kind, batch),
                    "--target", kind.target, "--input-grad", "--out", out, "-q")
        made[key] = (code, out, batch)
    return made


def model_args(kind, batch) -> list:
    """The flags that open ``kind``'s factory (trusted) on ``batch``, for any command."""
    return ["--model", f"{FACTORIES}:{kind.factory}", "--trust", "--input", batch]


def _cli(*argv) -> int:
    from gradexplorer_app.cli.main import main

    return main([str(a) for a in argv])


@pytest.mark.parametrize("key", IDS)
def test_capture_matches_autograd_and_passes_the_schema(key, captures):
    kind = KINDS[key]
    code, out, _ = captures[key]
    assert code == 0
    raw = torch.load(out, weights_only=True)
    check_capture_data(raw, str(out))  # a valid capture of this model is not "malformed"
    cap = load_capture(out)
    model = kind.model()
    dtype = next(p.dtype for p in model.parameters())
    params, input_grad, head = _autograd(kind, model)
    for qual, want in params.items():
        layer, _, pname = qual.rpartition(".")
        if layer in cap.layers and want is not None:
            _close(cap.layers[layer].param_grads[pname], want, dtype)
    _close(cap[kind.head].calls[0].activation, head, dtype)
    if input_grad is None:
        # Token ids have no gradient: the capture gives the one at the embedding's output,
        # the same tensor as that layer's output gradient, and says so.
        assert "token embeddings" in str(cap.meta.get("input_grad_of"))
        emb = str(cap.meta["input_grad_of"]).split("'")[1]
        if emb in cap.layers and cap[emb].calls[0].grad_output is not None:
            assert torch.equal(cap.input_grad, cap[emb].calls[0].grad_output)
        assert cap.input_grad is not None and cap.input_grad.dim() == 3
    else:
        _close(cap.input_grad, input_grad, dtype)
    # The graph it carries has one input node per input and the dict's outputs.
    graph = cap.graph
    assert graph, "the capture carries no graph"
    ins = sorted(n["name"] for n in graph["nodes"] if n["kind"] == "input")
    outs = sorted(n["name"] for n in graph["nodes"] if n["kind"] == "output")
    batch = kind.make_batch()
    want_ins = sorted(batch) if isinstance(batch, dict) else (["0", "1"] if isinstance(batch, tuple) else ["input"])
    assert ins == [i for i in want_ins if i != "scale"] or ins == want_ins
    assert outs == (["aux", "out"] if key == "dict_output" else ["output"])


@pytest.mark.parametrize("key", IDS)
def test_inspect_and_diff_of_a_capture(key, captures, capsys, tmp_path):
    kind = KINDS[key]
    _, out, _ = captures[key]
    capsys.readouterr()
    code, text, err = run(capsys, "inspect", out)
    assert code == 0, err
    assert kind.head in text
    # Against itself: exit 0, every difference zero.
    code, _, err = run(capsys, "diff", out, out, "--csv", tmp_path / "same.csv", "-q")
    assert code == 0, err
    rows = (tmp_path / "same.csv").read_text().splitlines()
    header = rows[0].split(",")
    rel = [i for i, h in enumerate(header) if h.endswith("rel_l2")]
    assert rel and len(rows) > 1
    assert all(float(r.split(",")[i] or 0) == 0 for r in rows[1:] for i in rel)
    # Against the model with its head's weight nudged: exit 1, the head diverges.
    from gradexplorer.capturing.capture import capture

    model = kind.model()
    with torch.no_grad():
        model.get_submodule(kind.head).weight.mul_(1.5)
    cap_b = capture(model, _model_dtype_inputs(kind, model), target=kind.target)
    save_capture(cap_b, tmp_path / "b.pt")
    code, text, err = run(capsys, "diff", out, tmp_path / "b.pt", "--csv", tmp_path / "b.csv")
    assert code == 1, err
    changed = [r.split(",") for r in (tmp_path / "b.csv").read_text().splitlines()[1:]]
    assert any(r[0] == kind.head and float(r[rel[0]]) > 0 for r in changed)


@pytest.mark.parametrize("key", IDS)
def test_graph_with_gradients_matches_autograd(key, captures, capsys, tmp_path):
    kind = KINDS[key]
    _, _, batch = captures[key]
    out = tmp_path / "g.json"
    code, _, err = run(capsys, "graph", *model_args(kind, batch),
                       "--grads", "--target", kind.target, "--out", out, "-q")
    assert code == 0, err
    data = json.loads(out.read_text())
    nodes = {n["id"]: n for n in data["nodes"]}
    assert any(n["kind"] == "module" and n["name"] == kind.head for n in nodes.values())
    model = kind.model()
    _, input_grad, _ = _autograd(kind, model)
    first = next(n for n in nodes.values() if n["kind"] == "input")
    leaving = [e for e in data["edges"] if e["src"] == first["id"]]
    assert leaving
    if input_grad is None:
        assert all(e["grad_l2"] is None for e in leaving)  # token ids: no gradient
    else:
        want = float(input_grad.double().norm())
        assert leaving[0]["grad_l2"] == pytest.approx(want, rel=2e-2 if key in ("fp16", "bf16") else 1e-4)
    code, _, err = run(capsys, "graph", *model_args(kind, batch),
                       "--out", tmp_path / "g.svg", "-q")
    assert code == 0, err
    assert kind.head.rsplit(".", 1)[-1] in (tmp_path / "g.svg").read_text()


@pytest.mark.parametrize("key", IDS)
def test_dataset_capture_merges_what_the_model_gives(key, captures, capsys, tmp_path):
    kind = KINDS[key]
    _, _, batch = captures[key]
    out = tmp_path / "ds.pt"
    code, _, err = run(capsys, "capture", *model_args(kind, batch),
                       "--target", kind.target, "--batch-size", "2", "--stats-only", "--out", out, "-q")
    assert code == 0, err
    check_capture_data(torch.load(out, weights_only=True), str(out))
    cap = load_capture(out)
    # Ground truth: the head's output over all 3 samples (batches of 2 and 1, merged).
    _, _, head = _autograd(kind, kind.model())
    stats = cap[kind.head].calls[0].stats["activation"]
    assert stats["numel"] == head.numel()
    assert stats["mean"] == pytest.approx(float(head.double().mean()), rel=1e-3, abs=1e-3)


@pytest.mark.parametrize("key", IDS)
def test_nonfinite_onset_names_the_poisoned_layer(key, capsys, tmp_path):
    from gradexplorer.capturing.capture import capture

    kind = KINDS[key]
    model = kind.model()
    with torch.no_grad():
        next(model.get_submodule(kind.poisoned).parameters()).fill_(float("nan"))
    cap = capture(model, _model_dtype_inputs(kind, model), target=kind.target, mode="stats")
    assert onset_location(cap.nonfinite_onset, "forward")[0] == kind.poisoned
    save_capture(cap, tmp_path / "nan.pt")
    check_capture_data(torch.load(tmp_path / "nan.pt", weights_only=True))
    code, text, err = run(capsys, "inspect", tmp_path / "nan.pt")
    assert code == 0, err
    assert kind.poisoned in (text + err) and "NaN" in (text + err)


def _train_with_watch(kind: Kind, path: Path, steps: int = 3) -> float:
    """A few SGD steps of loss = ½‖primary output‖², watched every step; returns the norm of
    d loss / d (the head's output) at step 0, by autograd on that step's graph."""
    from gradexplorer.recording.watch import watch

    model = kind.model().train()
    inputs = _model_dtype_inputs(kind, model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    heads: list[torch.Tensor] = []
    handle = model.get_submodule(kind.head).register_forward_hook(lambda m, a, o: heads.append(o))
    want = None
    try:
        with watch(model, out=str(path), every=1) as w:
            for _ in range(steps):
                out = inputs.call(model)
                y = out["out"] if isinstance(out, dict) else out
                loss = 0.5 * (y.float() ** 2).sum()
                if want is None:
                    want = float(torch.autograd.grad(loss, heads[0], retain_graph=True)[0].double().norm())
                opt.zero_grad()
                loss.backward()
                opt.step()
                w.step(loss=loss)
    finally:
        handle.remove()
    assert want is not None
    return want


@pytest.mark.parametrize("key", IDS)
def test_watch_logs_equal_autograd_and_inspect_reads_them(key, capsys, tmp_path):
    from gradexplorer.recording.watch_log import open_log

    kind = KINDS[key]
    path = tmp_path / "run.gxw"
    want = _train_with_watch(kind, path)
    con = open_log(path)
    row = con.execute("SELECT * FROM stats WHERE step = 0 AND layer = ? AND kind = 'grad_output' AND call = 0",
                      (kind.head,)).fetchone()
    steps = [r[0] for r in con.execute("SELECT step FROM steps ORDER BY step")]
    con.close()
    assert steps == [0, 1, 2]
    assert row is not None
    assert dict(row)["l2"] == pytest.approx(want, rel=2e-2 if key in ("fp16", "bf16") else 1e-5)
    code, text, err = run(capsys, "inspect", path)
    assert code == 0, err
    assert "3 steps" in text or "steps" in text


# -- the window ------------------------------------------------------------------------------


def _drew(view, shape: tuple) -> None:
    """The view drew something real for a layer whose activation has ``shape``, or (Grad-CAM
    on a layer that is not a picture) said why not."""
    title = view.title
    message = view.message()
    if title == "Grad-CAM" and len(shape) != 4:
        want = "sequence, not a picture" if len(shape) == 3 else "Grad-CAM needs a spatial layer"
        assert want in message, message
        assert view.current_cam() is None
        return
    assert message == "", f"{title}: {message}"
    if title == "Histogram":
        counts = view.current_counts()
        assert counts is not None and counts[1].sum() > 0
    elif title == "Heatmap":
        image = view.current_image_array()
        assert image is not None and image.size and np.isfinite(image).any()
        # Square cells for maps and vectors; a tokens × channels matrix fills the plot.
        assert bool(view.plot.getViewBox().state["aspectLocked"]) == (len(shape) != 3)
    elif title == "Saliency":
        assert view.current_map() is not None
    elif title == "Grad-CAM":
        cam = view.current_cam()
        assert cam is not None and np.isfinite(cam).all() and cam.max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("key", IDS)
def test_window_runs_and_every_view_draws(key, qtbot, tmp_path, monkeypatch):
    from gradexplorer_app.window import error_dialog
    from gradexplorer_app.window.main_window import MainWindow
    from tests.app.conftest import CPU

    monkeypatch.setenv("GRADEXPLORER_SETTINGS", str(tmp_path / "settings.ini"))
    errors = []
    monkeypatch.setattr(error_dialog, "show_error", lambda parent, title, exc: errors.append((title, exc)))
    kind = KINDS[key]
    batch = _batch_file(kind, tmp_path)
    w = MainWindow(devices=CPU)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    w.run_panel.input_grad_check.setChecked(True)  # the saliency of float inputs needs it
    try:
        with qtbot.waitSignal(w.run_done, timeout=TIMEOUT) as done:
            w.load_model(f"{FACTORIES}:{kind.factory}", trust=True, inputs=[str(batch)], run=True)
        assert done.args == ["ok"], errors
        cap = w.session.capture
        # "Random" would make a batch the model takes: token ids, its features, or pictures.
        shapes = {"lstm": "2x16", "transformer": "2x16", "fp16": "2x16", "dict_output": "2x5"}
        assert w.batch_panel.shape_edit.placeholderText() == shapes.get(key, "2x3x64x64")
        params, _, _ = _autograd(kind, kind.model())
        layer, _, pname = next(q for q in params if q.startswith(kind.head + ".")).rpartition(".")
        _close(cap.layers[layer].param_grads[pname], params[f"{layer}.{pname}"],
               next(kind.model().parameters()).dtype)
        views = w.views
        for layer in (kind.body, kind.head):
            views.set_layer(layer)
            for view in views.views():
                views.show_view(view.title)
                _drew(view, tuple(cap[layer].calls[0].shape))
        assert not errors
        # The tab draws the graph the capture carries, then the one extracted when it is shown.
        panel = w.graph_panel
        w.module_tabs.setCurrentWidget(panel)
        qtbot.waitUntil(lambda: panel.graph is not None and panel.graph.meta.get("probe_batch") != 1
                        and bool(panel.items), timeout=TIMEOUT)
        ins = sorted(n for n in panel.items if n.startswith("in:"))
        outs = sorted(n for n in panel.items if n.startswith("out:"))
        want = {"two_inputs": ["in:0", "in:1"], "keywords": ["in:frame1", "in:frame2"]}.get(key, ["in:input"])
        assert ins == want or ins == [*want, "in:scale"], sorted(panel.items)
        assert outs == (["out:aux", "out:out"] if key == "dict_output" else ["out:output"])
        assert any(n.startswith(f"m:{kind.head}:") for n in panel.items), sorted(panel.items)
    finally:
        w.shutdown()


@pytest.mark.parametrize("key", ["lstm", "keywords", "dict_output", "bf16"])
def test_compare_window_graph_is_coloured_by_divergence(key, captures, qtbot, tmp_path):
    from gradexplorer.capturing.capture import capture
    from gradexplorer_app.window.compare_window import CompareWindow

    kind = KINDS[key]
    _, out, _ = captures[key]
    model = kind.model()
    with torch.no_grad():
        model.get_submodule(kind.head).weight.mul_(1.5)
    cap_b = capture(model, _model_dtype_inputs(kind, model), target=kind.target)
    save_capture(cap_b, tmp_path / "b.pt")
    win = CompareWindow()
    qtbot.addWidget(win)
    with qtbot.waitSignal(win.runner.finished, timeout=TIMEOUT):
        win.compare_files(str(out), str(tmp_path / "b.pt"))
    assert win.view.result is not None and not win.view.result.within
    panel = win.graph_panel
    with qtbot.waitSignal(panel.layout_done, timeout=TIMEOUT):
        win.tabs.setCurrentWidget(panel)
    node = next(n for n in panel.items if n.startswith(f"m:{kind.head}:"))
    assert panel.items[node].fill != panel.items[next(n for n in panel.items if n.startswith("in:"))].fill
    assert "diverg" in panel.tooltip(node).lower() or "rel" in panel.tooltip(node).lower()
    win.close()


@pytest.mark.parametrize("key", ["transformer", "two_inputs", "fp16"])
def test_timeline_window_shows_the_watch_log(key, qtbot, tmp_path):
    from gradexplorer_app.window.timeline_window import TimelineWindow

    path = tmp_path / "run.gxw"
    _train_with_watch(KINDS[key], path)
    win = TimelineWindow(str(path))
    qtbot.addWidget(win)
    win.show()
    view = win.view
    qtbot.waitUntil(lambda: view.timeline is not None and len(view.timeline.steps) == 3, timeout=TIMEOUT)
    assert KINDS[key].head in view.timeline.rows
    image = view.heat_image.image
    assert image.shape == (len(view.timeline.rows), 3) and np.isfinite(image).any()
    win.close()


@pytest.mark.slow
@pytest.mark.parametrize("key", ["lstm", "two_inputs", "bf16"])
def test_window_onset_link_jumps_to_the_poisoned_layer(key, qtbot, tmp_path, monkeypatch):
    from gradexplorer_app.window.main_window import MainWindow
    from tests.app.conftest import CPU

    monkeypatch.setenv("GRADEXPLORER_SETTINGS", str(tmp_path / "settings.ini"))
    kind = KINDS[key]
    factory = tmp_path / "poisoned.py"
    factory.write_text(textwrap.dedent(f"""
        import torch
        from tests import people_models

        def make():
            model = people_models.{kind.factory}()
            with torch.no_grad():
                next(model.get_submodule({kind.poisoned!r}).parameters()).fill_(float("nan"))
            return model
    """))
    batch = _batch_file(kind, tmp_path)
    w = MainWindow(devices=CPU)
    qtbot.addWidget(w)
    try:
        with qtbot.waitSignal(w.run_done, timeout=TIMEOUT) as done:
            w.load_model(f"{factory}:make", trust=True, inputs=[str(batch)], run=True)
        assert done.args == ["ok"]
        link = w.onset_link
        assert not link.isHidden() and kind.poisoned in link.text()
        link.linkActivated.emit("forward")
        assert w.view_state.layer == kind.poisoned
    finally:
        w.shutdown()


# -- what is refused, and how ----------------------------------------------------------------


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    return write_pictures(tmp_path_factory.mktemp("pictures"), 3, size=(20, 24), stem="p")


@pytest.mark.parametrize("key, source, needles", [
    ("two_inputs", "--random", ("missing 1 required positional argument", "save them in one .pt file")),
    ("lstm", "pictures", ("takes token ids, not pictures", "int64 tensor of ids from 0 to 10")),
    ("fp16", "pictures", ("takes token ids, not pictures", "ids from 0 to 49")),
])
@pytest.mark.parametrize("dataset", [False, True])
def test_a_batch_the_model_cannot_take_is_refused_in_words(key, source, needles, dataset, capsys, tmp_path,
                                                            pictures):
    from tests.app.test_cli import assert_user_error

    kind = KINDS[key]
    given = ["--random"] if source == "--random" else ["--input", pictures]
    if dataset and source == "--random":
        given = ["--input", pictures]  # a dataset needs files: pictures, one per call
    extra = ["--batch-size", "2", "--stats-only"] if dataset else []
    code, _, err = run(capsys, "capture", "--model", f"{FACTORIES}:{kind.factory}", "--trust", *given, *extra,
                       "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, *needles)
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("key", ["bf16", "lstm"])
def test_window_run_over_folder(key, qtbot, tmp_path, monkeypatch, pictures):
    from gradexplorer_app import dialogs
    from gradexplorer_app.window import dataset_run, error_dialog
    from gradexplorer_app.window.main_window import MainWindow
    from tests.app.conftest import CPU

    monkeypatch.setenv("GRADEXPLORER_SETTINGS", str(tmp_path / "settings.ini"))
    errors = []
    monkeypatch.setattr(error_dialog, "show_error", lambda parent, title, exc: errors.append(exc))
    monkeypatch.setattr(dialogs, "ask_folder", lambda parent, caption: str(pictures))
    monkeypatch.setattr(dataset_run, "ask_dataset_run", lambda parent, f, b: (2, None))
    kind = KINDS[key]
    w = MainWindow(devices=CPU)
    qtbot.addWidget(w)
    try:
        with qtbot.waitSignal(w.run_done, timeout=TIMEOUT):
            w.load_model(f"{FACTORIES}:{kind.factory}", trust=True, inputs=[str(_batch_file(kind, tmp_path))],
                         run=True)
        with qtbot.waitSignal(w.dataset_run.done, timeout=TIMEOUT) as done:
            w.run_folder_action.trigger()
        if key == "lstm":  # token ids only: the pictures are refused, in words
            assert done.args[0] != "ok"
            assert errors and "takes token ids, not pictures" in str(errors[-1])
            return
        assert done.args[0] == "ok", errors
        cap = w.session.capture
        assert cap.meta["dataset"]["samples"] == 3 and cap.meta["dataset"]["series"]["samples"] == [2, 1]
        # The pictures went in as bf16; the head's statistics cover 3 samples of 6 logits.
        assert cap[kind.head].calls[0].stats["activation"]["numel"] == 3 * 6
        views = w.views
        views.set_layer(kind.body)
        counts = views.show_view("Histogram").current_counts()
        assert counts is not None and counts[1].sum() > 0
    finally:
        w.shutdown()


@pytest.mark.parametrize("key, noted", [("lstm", True), ("transformer", False), ("dict_output", False)])
def test_a_class_target_on_a_3d_output_says_which_axis_it_reads(key, noted, capsys, tmp_path):
    # The LSTM's per-token logits are (B, T, vocab); class targets read dim 1 (here the position).
    kind = KINDS[key]
    batch = _batch_file(kind, tmp_path)
    code, _, err = run(capsys, "capture", *model_args(kind, batch),
                       "--target", kind.target, "--out", tmp_path / "c.pt")
    assert code == 0, err
    assert ("is read as (batch, 7 classes, 11 positions)" in err) == noted, err
    suggested = f"use --target {kind.target},dim=-1." in err
    assert suggested == noted, err
    code, _, err = run(capsys, "capture", *model_args(kind, batch),
                       "--target", "sum", "--out", tmp_path / "s.pt")
    assert code == 0 and "classes" not in err
    if noted:  # the axis the note suggests is taken, and silences it
        code, _, err = run(capsys, "capture", *model_args(kind, batch), "--target",
                           f"{kind.target},dim=-1", "--out", tmp_path / "d.pt")
        assert code == 0 and "classes" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("key", ["two_inputs", "fp16"])
def test_opening_captures_without_the_model_shows_what_was_recorded(key, captures, qtbot, tmp_path, monkeypatch,
                                                                     capsys):
    # One batch: the head's per-sample shape. A dataset capture records no shape: blank, not "scalar".
    from gradexplorer_app.window.main_window import MainWindow
    from gradexplorer_app.window.module_tree_view import COL_SHAPE
    from tests.app.conftest import CPU

    monkeypatch.setenv("GRADEXPLORER_SETTINGS", str(tmp_path / "settings.ini"))
    kind = KINDS[key]
    _, one, batch = captures[key]
    code, _, err = run(capsys, "capture", *model_args(kind, batch),
                       "--batch-size", "2", "--stats-only", "--out", tmp_path / "ds.pt", "-q")
    assert code == 0, err
    w = MainWindow(devices=CPU)
    qtbot.addWidget(w)
    try:
        tree = w.tree_view.tree_model
        want = {"two_inputs": "5", "fp16": "4"}[key]
        for path, shown in ((one, want), (tmp_path / "ds.pt", "")):
            with qtbot.waitSignal(w.file_done, timeout=TIMEOUT):
                w.controller.open_capture(str(path))
            assert tree.data(tree.index_of(kind.head, COL_SHAPE)) == shown
    finally:
        w.shutdown()


@pytest.mark.slow
def test_the_window_offers_the_class_axis_for_per_token_logits(qtbot, tmp_path, monkeypatch):
    """The LSTM's output is (B, T, vocab): the run panel offers "Classes on", and the last
    dim gives the gradients of the top-1 token logit (autograd on a scalar written by hand).
    A model with (B, classes) output does not show the row."""
    from gradexplorer_app.window.main_window import MainWindow
    from tests.app.conftest import CPU

    monkeypatch.setenv("GRADEXPLORER_SETTINGS", str(tmp_path / "settings.ini"))
    w = MainWindow(devices=CPU)
    qtbot.addWidget(w)
    w.show()
    panel = w.run_panel
    # On a small screen (the offscreen one) the run settings are folded: open them, as a user would.
    panel.settings_button.setChecked(True)
    try:
        two_d = KINDS["two_inputs"]
        with qtbot.waitSignal(w.run_done, timeout=TIMEOUT):
            w.load_model(f"{FACTORIES}:{two_d.factory}", trust=True,
                         inputs=[str(_batch_file(two_d, tmp_path, "frames.pt"))], run=True)
        assert not panel.class_dim_combo.isVisible()

        kind = KINDS["lstm"]
        with qtbot.waitSignal(w.run_done, timeout=TIMEOUT):
            w.load_model(f"{FACTORIES}:{kind.factory}", trust=True, inputs=[str(_batch_file(kind, tmp_path))],
                         run=True)
        qtbot.waitUntil(panel.class_dim_combo.isVisible, timeout=TIMEOUT)
        panel.class_dim_combo.setCurrentIndex(panel.class_dim_combo.findData(-1))
        assert w.session.target == "top1,dim=-1"
        with qtbot.waitSignal(w.run_done, timeout=TIMEOUT) as done:
            w.run()
        assert done.args == ["ok"]
        cap = w.session.capture
        assert cap.meta["target"] == "top1,dim=-1"

        model = kind.model()
        heads = []
        handle = model.get_submodule(kind.head).register_forward_hook(lambda m, a, o: heads.append(o))
        try:
            logits = model(kind.make_batch())
        finally:
            handle.remove()
        want = torch.autograd.grad(logits.max(dim=-1).values.sum(), heads[0])[0]
        _close(cap[kind.head].calls[0].grad_output, want, torch.float32)
        # The batch panel's predictions are over the vocabulary (the target's axis), averaged
        # over the tokens, not over the 7 positions.
        probs = torch.softmax(logits.detach().double().mean(1), dim=1)[0]
        best = int(probs.argmax())
        text = w.batch_panel.list.item(0).text()
        assert f"1. class {best}  {float(probs[best]) * 100:.1f}%" in text, text

        # Switching the target to sum hides the row; back to a class target shows it again.
        panel.target_combo.setCurrentIndex(panel.target_combo.findData("sum"))
        assert not panel.class_dim_combo.isVisible() and w.session.target == "sum"
        panel.target_combo.setCurrentIndex(panel.target_combo.findData("class"))
        assert panel.class_dim_combo.isVisible() and w.session.target == "class:0,dim=-1"
    finally:
        w.shutdown()
