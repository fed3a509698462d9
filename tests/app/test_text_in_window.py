"""Text models in the window: the saliency bars and the token heatmap rows are named by the
token strings, the bars equal autograd's gradient at the embeddings, and the batch panel
offers a text box for a model with a tokenizer."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from gradexplorer.batches import load_batch
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.targets import parse_target
from gradexplorer.models import load_model
from gradexplorer.pipeline.job import CaptureJob
from gradexplorer.pipeline.options import CaptureOptions
from gradexplorer_app.views.capture_views import CaptureViews
from tests import hf_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf_tiny.save("gpt2", tmp_path_factory.mktemp("hf") / "gpt2")


@pytest.fixture(scope="module")
def text_capture(folder):
    job = CaptureJob(CaptureOptions(model=f"hf:{folder}", batch=["text:the cat sat on a mat", "text:a dog ran"],
                                    input_grad=True))
    return job, job.run()


def test_saliency_bars_are_named_by_the_tokens_and_equal_autograd(qtbot, text_capture):
    job, cap = text_capture
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(1000, 700)
    w.show()
    w.set_capture(cap, job.batch)
    w.show_view("Saliency")
    view = w.saliency_view
    bars = view.current_map()[0]
    assert view._tick_texts == ["the", "cat", "sat", "on", "a", "mat"]
    info = view.info_label.text()
    assert "transformer.wte" in info and "predicts" in info
    # ground truth: autograd at the embedding output, same model, same inputs
    model = job.loaded.module
    kwargs = job.batch.inputs.kwargs
    seen = {}
    h = model.transformer.wte.register_forward_hook(lambda m, a, o: seen.setdefault("e", o))
    logits = model(**kwargs).logits
    h.remove()
    g = torch.autograd.grad(logits[:, -1].max(-1).values.sum(), seen["e"])[0]
    np.testing.assert_allclose(bars, g[0].double().norm(dim=-1).numpy(), rtol=1e-5, atol=1e-9)
    # the second sample is left-padded: its first position is named so
    w.set_sample(1)
    w.show_view("Saliency")
    assert view._tick_texts == ["[pad]"] * 3 + ["a", "dog", "ran"]
    shot = os.environ.get("GX_SALIENCY_SHOT")
    if shot:
        w.set_sample(0)
        w.show_view("Saliency")
        w.grab().save(shot)


def test_token_heatmap_rows_are_the_tokens(qtbot, text_capture):
    job, cap = text_capture
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(1000, 700)
    w.show()
    w.set_capture(cap, job.batch)
    w.show_view("Heatmap")
    view = w.heatmap_view
    view.ensure_drawn()
    assert view._tokens == ("the", "cat", "sat", "on", "a", "mat")
    assert "'sat'" in view.hover_text(2, 0)


def test_a_capture_file_alone_still_names_its_tokens(qtbot, text_capture, tmp_path):
    from gradexplorer.files.capture_file import load_capture, save_capture

    _job, cap = text_capture
    again = load_capture(save_capture(cap, tmp_path / "t.pt"))
    w = CaptureViews()
    qtbot.addWidget(w)
    w.show()
    w.set_capture(again, None)
    w.show_view("Saliency")
    w.saliency_view.ensure_drawn()
    assert w.saliency_view._tick_texts == ["the", "cat", "sat", "on", "a", "mat"]


def test_the_batch_panel_offers_text_for_a_model_with_a_tokenizer(qtbot, folder, tmp_path, monkeypatch):
    from gradexplorer.pipeline.session import Session
    from gradexplorer_app.window.batch_panel import BatchPanel
    from gradexplorer_app.window.settings import AppSettings

    session = Session()
    panel = BatchPanel(session, AppSettings(str(tmp_path / "s.ini")))
    qtbot.addWidget(panel)
    panel.show()
    assert not panel.text_box.isVisibleTo(panel)
    loaded = load_model(f"hf:{folder}")
    session.set_model(loaded)
    assert panel.text_box.isVisibleTo(panel)
    panel.text_edit.setPlainText("the cat sat\n\na dog")
    with qtbot.waitSignal(panel.load_requested) as got:
        panel.text_button.click()
    assert got.args[0] == ["text:the cat sat", "text:a dog"]
    batch = load_batch(got.args[0], loaded)
    assert batch.tokens == [["the", "cat", "sat"], ["[pad]", "a", "dog"]]
    cap = capture(loaded.module, batch.model_input, target="top1,dim=-1,pos=-1")
    assert cap.output.shape[:2] == (2, 3)
    # after a run, each sample lists its likeliest next tokens (not "class N")
    cap.meta["predicted_tokens"] = ["x", "y"]
    session.set_batch(batch, got.args[0])
    session.capture_changed.emit(cap)
    best = loaded.tokenizer.decode([int(cap.output[0, -1].argmax())])
    assert panel.list.item(0).text().splitlines()[1].startswith(f"1. {best!r}")


@pytest.mark.slow
def test_the_window_runs_a_text_model_from_the_command_line(qtbot, window, folder, monkeypatch):
    import gradexplorer_app.window.launch
    from gradexplorer_app.cli import common, main as cli
    from gradexplorer_app.window.launch import start
    from tests.app.conftest import TIMEOUT

    calls = []
    monkeypatch.setattr(gradexplorer_app.window.launch, "launch",
                        lambda options=None, run=False, screenshot=None, **_: calls.append((options, run)) or 0)
    words = ["--model", f"hf:{folder}", "--text", "the cat sat", "--text", "a dog"]
    assert cli.main([*words, "--run"]) == 0
    ((options, run),) = calls
    assert options == common.capture_options(cli.build_parser().parse_args(["capture", *words, "--out", "x.pt"]))
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        start(window, options, run)
    assert done.args == ["ok"]
    s = window.session
    again = s.capture_options(force=options.force)  # what a second run would run
    assert (again.batch, again.target, again.model) == (options.batch, options.target, options.model)
    assert s.capture.meta["tokens"] == [["the", "cat", "sat"], ["[pad]", "a", "dog"]]
    assert s.capture.meta["target"] == "top1,dim=-1,pos=-1"
    assert window.batch_panel.text_box.isVisibleTo(window.batch_panel)


def test_the_model_browser_lists_and_loads_a_cached_hugging_face_model(qtbot, window, tmp_path, monkeypatch):
    """With transformers installed the browser has a Hugging Face group: the models in the
    cache (marked cached) and a few known names; Load reads the cache, offline."""
    import huggingface_hub.constants as constants

    from tests.app.conftest import TIMEOUT

    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hf_tiny.save_in_cache("gpt2", home, repo="tiny-org/tiny-gpt2")
    panel = window.model_panel
    with qtbot.waitSignal(window.controller.catalog_ready, timeout=TIMEOUT):
        window.controller.start()
    groups = [panel.list.topLevelItem(i).text(0) for i in range(panel.list.topLevelItemCount())]
    assert any(g.startswith("Hugging Face (transformers)") for g in groups)
    assert panel.select_spec("hf:openai-community/gpt2") and panel.list.currentItem().text(1) == "downloads"
    assert panel.select_spec("hf:tiny-org/tiny-gpt2")
    assert panel.list.currentItem().text(1) == "cached"
    with qtbot.waitSignal(window.controller.model_loaded, timeout=TIMEOUT):
        panel.load_button.click()
    loaded = window.session.model
    assert loaded.spec == "hf:tiny-org/tiny-gpt2" and loaded.tokenizer is not None
    assert window.batch_panel.text_box.isVisibleTo(window.batch_panel)


@pytest.mark.slow
def test_the_run_panel_shows_a_causal_lms_target_as_the_next_token_at_the_last_position(qtbot, window, folder):
    """The plain top1 of a causal language model is the predicted next token at the last
    position: the run panel shows it so (classes on the last dim, the last position), a run
    from it reads that position, and choosing every position sums over them."""
    from gradexplorer.pipeline.options import BatchSpec
    from gradexplorer_app.window.launch import start
    from tests.app.conftest import TIMEOUT

    options = CaptureOptions(model=f"hf:{folder}", batch=BatchSpec(texts=("the cat sat", "a dog")))
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        start(window, options, True)
    assert done.args == ["ok"]
    panel, s = window.run_panel, window.session
    assert s.capture.meta["target"] == "top1,dim=-1,pos=-1"
    assert panel.target_combo.currentData() == "top1"
    assert panel.class_dim_combo.isVisibleTo(panel) and panel.class_dim_combo.currentData() == -1
    assert panel.position_combo.isVisibleTo(panel) and panel.position_combo.currentData() == -1
    assert "next token at the last position" in panel.target_combo.toolTip()
    assert s.target == "top1"  # still the model's own default
    panel.position_combo.setCurrentIndex(panel.position_combo.findData("all"))
    assert s.target == "top1,dim=-1"
    assert "summed over positions" in panel.target_combo.toolTip()
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT):
        panel.run_button.click()
    cap = s.capture
    assert cap.meta["target"] == "top1,dim=-1"
    model, kwargs = window.session.model.module, window.session.batch.inputs.kwargs
    logits = model(**kwargs).logits
    want = torch.autograd.grad(logits.max(-1).values.sum(), model.lm_head.weight)[0]
    torch.testing.assert_close(cap["lm_head"].param_grads["weight"], want, rtol=1e-5, atol=1e-7)
    panel.position_combo.setCurrentIndex(panel.position_combo.findData(-1))
    assert s.target == "top1"
    # dim 1 of per-token logits is the position: plain top1 stands for the model's own target,
    # and the panel shows that one again rather than a choice that would not run
    panel.class_dim_combo.setCurrentIndex(panel.class_dim_combo.findData(1))
    assert s.target == "top1" and panel.class_dim_combo.currentData() == -1


@pytest.mark.slow
def test_the_window_takes_hf_class_and_input_grad_from_the_command_line(qtbot, window, folder, monkeypatch):
    """``gradexplorer --model hf:FOLDER --hf-class base --text ... --input-grad --run``: the
    window builds the class asked for and records the input gradient, as ``capture`` does."""
    import gradexplorer_app.window.launch
    from gradexplorer_app.cli import main as cli
    from gradexplorer_app.window.launch import start
    from tests.app.conftest import TIMEOUT

    calls = []
    monkeypatch.setattr(gradexplorer_app.window.launch, "launch",
                        lambda options=None, run=False, screenshot=None, **_: calls.append((options, run)) or 0)
    assert cli.main(["--model", f"hf:{folder}", "--hf-class", "base", "--text", "the cat sat",
                     "--input-grad", "--target", "sum", "--run"]) == 0
    ((options, run),) = calls
    assert options.hf_class == "base" and options.input_grad
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        start(window, options, run)
    assert done.args == ["ok"]
    s = window.session
    assert type(s.model.module).__name__ == "GPT2Model"
    assert s.capture.input_grad is not None and tuple(s.capture.input_grad.shape) == (1, 3, 32)
    assert s.capture_options().hf_class == "base"  # a second run, a comparison: the same class
    assert cli.main(["--hf-class", "base"]) == 2  # without --model: a usage error


@pytest.mark.slow
def test_the_run_panel_follows_a_causal_lm_loaded_after_another_model(qtbot, demo, folder):
    """The demo first, then ``window.load_model("hf:...")`` and a run: the run panel shows
    the target the capture used, the next token at the last position (classes on the last
    dim, the Position row shown), not the demo's "Classes on: dim 1" with Position hidden."""
    from tests.app.conftest import TIMEOUT

    panel = demo.run_panel
    assert not panel.class_dim_combo.isVisibleTo(panel)  # the demo's classifier: no axis to choose
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.load_model(f"hf:{folder}", run=True)
    assert done.args == ["ok"]
    s = demo.session
    assert s.capture.meta["target"] == "top1,dim=-1,pos=-1"
    assert panel.target_combo.currentData() == "top1"
    assert panel.class_dim_combo.isVisibleTo(panel) and panel.class_dim_combo.currentData() == -1
    assert panel.position_combo.isVisibleTo(panel) and panel.position_combo.currentData() == -1
    assert "next token at the last position" in panel.target_combo.toolTip()
    assert panel.effective_target() == parse_target(s.capture.meta["target"])


FACTORY = '''
from tests import hf_tiny


def gpt2():
    return hf_tiny.gpt2()
'''


@pytest.fixture
def factory_and_tokenizer(tmp_path, monkeypatch):
    """A factory that builds a transformers language model (it brings no tokenizer), and a
    tokenizer saved to a folder of its own, as ``tokenizer.save_pretrained`` writes it."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # the factory imports tests.hf_tiny
    (tmp_path / "mymodels.py").write_text(FACTORY)
    tok = tmp_path / "tok"
    hf_tiny.tokenizer().save_pretrained(tok)
    return f"{tmp_path / 'mymodels.py'}:gpt2", tok


def _same_capture(a, b) -> None:
    """Two captures of one model and batch: the same layers, calls and tensors, bit for bit."""
    assert list(a.layers) == list(b.layers)
    for name, layer in a.layers.items():
        other = b.layers[name]
        assert len(layer.calls) == len(other.calls), name
        for x, y in zip(layer.calls, other.calls):
            for kind in ("activation", "grad_output"):
                u, v = getattr(x, kind), getattr(y, kind)
                assert (u is None) == (v is None) and (u is None or torch.equal(u, v)), (name, kind)
        assert set(layer.param_grads) == set(other.param_grads), name
        for p, g in layer.param_grads.items():
            assert torch.equal(g, other.param_grads[p]), (name, p)
    assert torch.equal(a.output, b.output) and torch.equal(a.input_grad, b.input_grad)
    for key in ("tokens", "target", "predicted_tokens", "model"):
        assert a.meta[key] == b.meta[key], key


@pytest.mark.slow
def test_a_factory_model_with_tokenizer_runs_in_the_window_as_on_the_command_line(
        qtbot, window, factory_and_tokenizer, tmp_path, monkeypatch):
    """``gradexplorer --model mymodels.py:gpt2 --trust --tokenizer FOLDER --text ... --run``:
    the window takes --tokenizer, runs the capture ``gradexplorer capture`` writes from the
    same words, and its next run would too; the capture equals autograd."""
    import gradexplorer_app.window.launch
    from gradexplorer.files.capture_file import load_capture
    from gradexplorer_app.cli import common, main as cli
    from gradexplorer_app.window.launch import start
    from tests.app.conftest import TIMEOUT

    spec, tok = factory_and_tokenizer
    calls = []
    monkeypatch.setattr(gradexplorer_app.window.launch, "launch",
                        lambda options=None, run=False, screenshot=None, **_: calls.append((options, run)) or 0)
    words = ["--model", spec, "--trust", "--tokenizer", str(tok), "--text", "the cat sat", "--text", "a dog",
             "--input-grad"]
    assert cli.main([*words, "--run"]) == 0
    ((options, run),) = calls
    out = tmp_path / "cli.pt"
    assert options == common.capture_options(cli.build_parser().parse_args(["capture", *words, "--out", str(out)]))
    assert options.tokenizer == str(tok) and run
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        start(window, options, run)
    assert done.args == ["ok"]
    s = window.session
    assert s.capture_options(force=options.force).tokenizer == str(tok)  # a second run loads it too
    assert cli.main(["-q", "capture", *words, "--out", str(out)]) == 0
    _same_capture(s.capture, load_capture(out))
    assert s.capture.meta["tokens"] == [["the", "cat", "sat"], ["[pad]", "a", "dog"]]
    # Against autograd: the gradient at the embeddings, on the same model and inputs.
    model = s.model.module
    seen = {}
    handle = model.transformer.wte.register_forward_hook(lambda m, a, o: seen.setdefault("e", o))
    logits = model(**s.batch.inputs.kwargs).logits
    handle.remove()
    want = torch.autograd.grad(logits[:, -1].max(-1).values.sum(), seen["e"])[0]
    torch.testing.assert_close(s.capture.input_grad, want, rtol=1e-5, atol=1e-6)
    assert window.batch_panel.text_box.isVisibleTo(window.batch_panel)
    panel = window.model_panel
    assert panel.tokenizer_row.isVisibleTo(panel) and panel.tokenizer_label.text() == "Tokenizer: tok"
    assert str(tok) in s.files_read()  # no export goes over the tokenizer's files


@pytest.mark.slow
def test_text_for_a_factory_model_without_tokenizer_offers_to_choose_one(
        qtbot, window, factory_and_tokenizer, shown_errors, monkeypatch):
    """The window's message says what is missing in its own words, offers the tokenizer's
    folder, and the run that was asked for goes on with it."""
    from gradexplorer.pipeline.options import BatchSpec
    from gradexplorer_app import dialogs
    from gradexplorer_app.window.launch import start
    from tests.app.conftest import TIMEOUT

    spec, tok = factory_and_tokenizer
    options = CaptureOptions(model=spec, trust=True, batch=BatchSpec(texts=("the cat sat", "a dog")))
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        start(window, options, True)
    assert done.args == ["failed"] and window.session.capture is None
    title, _exc = shown_errors[-1]
    offered = shown_errors.offered[-1]
    message, fix = offered["words"]
    assert title == "The inputs cannot be used"
    assert "came without a tokenizer" in message and "--tokenizer" not in message + fix
    asked = []
    monkeypatch.setattr(dialogs, "ask_folder", lambda parent, caption: asked.append(caption) or str(tok))
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        dict(offered["actions"])["Choose tokenizer folder…"]()
    assert done.args == ["ok"] and asked
    s = window.session
    assert s.capture.meta["tokens"] == [["the", "cat", "sat"], ["[pad]", "a", "dog"]]
    assert s.capture_options().tokenizer == str(tok)


def test_the_model_panel_gives_a_factory_model_a_tokenizer(qtbot, window, factory_and_tokenizer, monkeypatch):
    """A factory model loaded without text: the Model panel's tokenizer row offers one; the
    model is loaded again with it, and the batch panel then takes text."""
    from gradexplorer_app import dialogs
    from tests.app.conftest import TIMEOUT

    spec, tok = factory_and_tokenizer
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model(spec, trust=True)
    panel = window.model_panel
    assert panel.tokenizer_row.isVisibleTo(panel) and "No tokenizer" in panel.tokenizer_label.text()
    assert not window.batch_panel.text_box.isVisibleTo(window.batch_panel)
    monkeypatch.setattr(dialogs, "ask_folder", lambda parent, caption: str(tok))
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        panel.tokenizer_button.click()
    s = window.session
    assert s.model.tokenizer is not None and s.model.spec == spec
    assert s.model_options.tokenizer == str(tok) and s.model_options.trust
    assert panel.tokenizer_label.text() == "Tokenizer: tok"
    assert window.batch_panel.text_box.isVisibleTo(window.batch_panel)
    # A torchvision model, a demo, an hf: model never show the row.
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model("demo:shapes")
    assert not panel.tokenizer_row.isVisibleTo(panel)
