"""``gradexplorer.explore``: the window on a live model, in the same process.

The captures it shows are checked against plain autograd on the same model and batch
(``tests/ground_truth.py``), and the model is checked to be left exactly as it was:
parameters, buffers (BatchNorm statistics), modes, ``.grad`` and hooks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gradexplorer as gx
from gradexplorer_app import explore as explore_module
from tests.ground_truth import compare, reference
from tests.memory_watch import LargestResult, RowReader, peak_rss_rise

TIMEOUT = 60_000


class Net(nn.Module):
    """Convolutions, BatchNorm (buffers that a forward in train mode would change),
    dropout (modes), two inputs' worth of keyword arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(0.5)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        y = self.pool(self.drop(self.relu(self.bn(self.conv(x))))).flatten(1)
        out = self.fc(y)
        return out * scale if scale is not None else out


def model_state(model: nn.Module) -> dict:
    """Everything explore must leave as it was."""
    return {
        "tensors": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "grads": {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                     + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules()),
        "tensor_hooks": sum(len(p._backward_hooks or {}) for p in model.parameters()),
    }


def assert_same_state(before: dict, after: dict) -> None:
    assert before["training"] == after["training"]
    assert before["requires_grad"] == after["requires_grad"]
    assert before["hooks"] == after["hooks"] == 0
    assert before["tensor_hooks"] == after["tensor_hooks"] == 0
    for k, v in before["tensors"].items():
        assert torch.equal(v, after["tensors"][k]), k
    for k, g in before["grads"].items():
        if g is None:
            assert after["grads"][k] is None, k
        else:
            assert torch.equal(g, after["grads"][k]), k


@pytest.fixture
def live():
    torch.manual_seed(0)
    model = Net()
    model.train()  # the user's mode: explore runs in eval and must put train back
    model.fc.weight.grad = torch.full_like(model.fc.weight, 0.25)  # a .grad the user accumulated
    x = torch.randn(3, 3, 12, 12)
    return model, x


@pytest.fixture(autouse=True)
def _close_windows():
    yield
    for window in list(explore_module._open_windows):
        window.close()
        window.shutdown()
    explore_module._open_windows.clear()


@pytest.mark.slow
def test_nonblocking_explore_shows_the_live_models_capture_exactly(qtbot, live):
    model, x = live
    before = model_state(model)
    window = gx.explore(model, x, block=False)
    qtbot.addWidget(window)
    assert window in explore_module._open_windows  # held while open: a notebook may drop it
    qtbot.waitUntil(lambda: window.session.capture is not None, timeout=TIMEOUT)
    cap = window.session.capture
    assert cap.meta["model"] == "live:Net"
    assert window.session.model is not None and window.session.model.module is model  # not a copy
    names = ["conv", "bn", "relu", "fc"]
    worst = compare(cap, reference(model, x, names, target="top1"), names)
    assert worst < 1e-6
    assert_same_state(before, model_state(model))
    assert window.isVisible()
    assert "Net" in window.windowTitle()
    window.close()
    assert window not in explore_module._open_windows  # closed: the model can be collected


@pytest.mark.slow
def test_explore_takes_the_command_lines_options(qtbot, live):
    model, x = live
    before = model_state(model)
    labels = torch.tensor([1, 4, 0])
    window = gx.explore(model, x, layers=["fc", "conv"], target="cross_entropy", labels=labels,
                        mode="stats", input_grad=True, block=False, name="my net")
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: window.session.capture is not None, timeout=TIMEOUT)
    cap = window.session.capture
    assert set(cap.layers) == {"fc", "conv"}
    assert cap.meta["model_name"] == "my net"
    assert cap.meta["labels"] == [1, 4, 0]
    assert window.session.mode == "stats"
    ref = reference(model, x, ["fc"], target="cross_entropy", labels=labels, input_grad=True)
    want = ref["calls"]["fc"][0]["grad_output"].double()
    got = cap.layers["fc"].calls[0].stats.get("grad_output")
    assert got is not None
    assert got["l2"] == pytest.approx(float(want.norm()), rel=1e-6)
    assert got["max"] == pytest.approx(float(want.max()), rel=1e-6)
    assert_same_state(before, model_state(model))


@pytest.mark.slow
def test_explore_with_several_inputs_as_keyword_arguments(qtbot, live):
    model, x = live
    scale = torch.tensor([[2.0], [0.5], [1.0]])
    window = gx.explore(model, {"x": x, "scale": scale}, layers="fc", block=False)
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: window.session.capture is not None, timeout=TIMEOUT)
    cap = window.session.capture
    model.eval()
    with torch.no_grad():
        want = model(x, scale=scale) / scale  # fc's output, before the scale
    got = cap.layers["fc"].calls[0].activation
    assert got is not None and torch.allclose(got, want, atol=1e-6)


@pytest.mark.slow
def test_explore_a_capture_object_and_a_capture_file(qtbot, live, tmp_path):
    model, x = live
    cap = gx.capture(model, x, layers=["fc"])
    window = gx.explore(cap, block=False)
    qtbot.addWidget(window)
    assert window.session.capture is cap
    path = tmp_path / "cap.pt"
    gx.save_capture(cap, path)
    other = gx.explore(str(path), block=False)
    qtbot.addWidget(other)
    qtbot.waitUntil(lambda: other.session.capture is not None, timeout=TIMEOUT)
    assert list(other.session.capture.layers) == ["fc"]
    assert torch.equal(other.session.capture.layers["fc"].calls[0].grad_output,
                       cap.layers["fc"].calls[0].grad_output)


@pytest.mark.slow
def test_explore_returns_at_once_under_ipythons_qt_loop(qtbot, live, monkeypatch):
    """In IPython with ``%gui qt`` on (or turned on by explore, as napari does), the
    window is returned at once and the loop between cells drives it."""
    model, x = live

    class Shell:
        def __init__(self) -> None:
            self.active_eventloop: str | None = None
            self.enabled: list[str] = []

        def enable_gui(self, gui: str) -> None:
            self.enabled.append(gui)
            self.active_eventloop = gui

    shell = Shell()
    fake = type(sys)("IPython")
    fake.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    exec_calls = []
    from PySide6.QtWidgets import QApplication

    monkeypatch.setattr(QApplication, "exec", lambda *a: exec_calls.append(a) or 0)
    window = gx.explore(model, x, layers="fc")
    qtbot.addWidget(window)
    assert shell.enabled == ["qt"]  # %gui qt was turned on
    assert exec_calls == []  # nothing blocked
    qtbot.waitUntil(lambda: window.session.capture is not None, timeout=TIMEOUT)


@pytest.mark.slow
def test_explore_without_ipython_blocks_until_closed(qtbot, live, monkeypatch):
    """From a script: the event loop runs until the window closes (stood in for here)."""
    model, x = live
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    ran = []
    from PySide6.QtWidgets import QApplication

    monkeypatch.setattr(QApplication, "exec", lambda *a: ran.append(True) or 0)
    window = gx.explore(model, x, layers="fc", run=False)
    qtbot.addWidget(window)
    assert ran == [True]
    assert window not in explore_module._open_windows


def test_explore_inside_a_running_event_loop_returns_at_once(qtbot, live, monkeypatch):
    from PySide6.QtCore import QTimer

    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    seen = []
    QTimer.singleShot(0, lambda: seen.append(explore_module._event_loop_running()))
    qtbot.waitUntil(lambda: bool(seen), timeout=5000)
    assert seen == [True]
    assert explore_module._event_loop_running() is False  # the test's body runs outside the loop


@pytest.mark.slow
@pytest.mark.parametrize("bad, words", [
    (lambda m, x: gx.explore("resnet18", block=False), "no capture file"),
    (lambda m, x: gx.explore(__file__, block=False), "cannot be read"),
    (lambda m, x: gx.explore(object(), x, block=False), "torch.nn.Module"),
    (lambda m, x: gx.explore(m, "pictures/", block=False), "cannot be called with"),
    (lambda m, x: gx.explore(m, x[:0], block=False), "no samples"),
    (lambda m, x: gx.explore(m, x, labels=[1], block=False), "1 labels for 3 samples"),
    (lambda m, x: gx.explore(m, x, target="nonsense", block=False), "target"),
    (lambda m, x: gx.explore(m, x, mode="everything", block=False), "capture mode"),
    (lambda m, x: gx.explore(None), "needs a model"),
])
def test_bad_arguments_are_refused_in_words_before_a_window_opens(qtbot, live, bad, words, monkeypatch, tmp_path):
    model, x = live
    monkeypatch.chdir(tmp_path)
    before = model_state(model)
    from gradexplorer_app.window import error_dialog

    shown: list = []
    monkeypatch.setattr(error_dialog, "show_error", lambda parent, title, exc: shown.append((title, exc)))
    try:
        window = bad(model, x)
    except gx.GradExplorerError as exc:
        assert words in str(exc)
    else:  # a file that cannot be read is said in the window, which stays usable
        qtbot.addWidget(window)
        qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT)
        assert words in str(shown[0][1]) or words in shown[0][0]
    assert_same_state(before, model_state(model))


def test_screenshot_refuses_a_folder_before_anything_runs(live, tmp_path):
    model, x = live
    with pytest.raises(gx.GradExplorerError, match="folder"):
        gx.explore(model, x, screenshot=tmp_path)


SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from torch import nn
    import gradexplorer as gx

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    x = torch.randn(2, 3, 8, 8)
    model(x)  # materialise the lazy layer, as a user's notebook would have
    model.train()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    window = gx.explore(model, x, screenshot=sys.argv[1])
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())
    cap = window.session.capture
    assert cap is not None and len(cap) == 5, cap
    print("captured", len(cap), "layers; model unchanged")
""")


@pytest.mark.slow
def test_explore_from_a_script_saves_the_window_and_returns(tmp_path):
    script = tmp_path / "explore_script.py"
    script.write_text(SCRIPT)
    shot = tmp_path / "w.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen",
           "GRADEXPLORER_SETTINGS": str(tmp_path / "s.ini")}
    result = subprocess.run([sys.executable, str(script), str(shot)], capture_output=True, text=True,
                            timeout=240, env=env, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "captured 5 layers; model unchanged" in result.stdout
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(shot) as picture:
        assert picture.size[0] >= 800 and picture.size[1] >= 500


KERNEL_CELLS = [
    ("import torch, gradexplorer as gx\n"
     "torch.manual_seed(0)\n"
     "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))\n"
     "x = torch.randn(4, 8)"),
    "w = gx.explore(m, x)",  # no %gui qt first: explore turns it on, as napari does
]
#: The longest wait for the window's run, polled from the notebook (a bound, not a check).
KERNEL_RUN_LIMIT_S = 600
#: Cells sent back to back with the window open: without the Qt loop handing back to the
#: kernel, one of them stalled (at the 2nd to the 267th) in six kernels of eight.
BACK_TO_BACK_CELLS = 1000
#: The longest wait for one of them (each takes milliseconds; a stalled one never ends).
BACK_TO_BACK_LIMIT_S = 60
#: A cell that starts an asyncio task: it sleeps 0.2 s, then writes a file (the path printed).
ASYNCIO_CELL = ("import asyncio, pathlib\n"
                "_done = pathlib.Path('asyncio-task-ran').resolve()\n"
                "async def _later():\n"
                "    await asyncio.sleep(0.2)\n"
                "    _done.write_text('ran')\n"
                "_task = asyncio.ensure_future(_later())\n"
                "print(_done)")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One Jupyter kernel for this module, driven as a notebook drives it
    (``tests/notebook_kernel.py`` says why not ``execute_interactive``)."""
    pytest.importorskip("ipykernel")
    pytest.importorskip("jupyter_client")
    from tests.notebook_kernel import NotebookKernel, kernel_env

    folder = tmp_path_factory.mktemp("kernel")
    k = NotebookKernel(kernel_env(folder / "s.ini"), folder)
    yield k
    k.close()


@pytest.mark.slow
def test_in_a_jupyter_kernel_explore_returns_and_the_notebook_stays_usable(kernel):
    """A real ipykernel: the cell with ``gx.explore`` returns, the next cells run while
    the window is open, cells sent back to back each run, and the kernel's Qt loop drives
    the window's run to its end."""
    for cell in KERNEL_CELLS:
        kernel.run(cell)
    assert kernel.run("print(1 + 1)").strip() == "2"  # the notebook is usable with the window open
    # Between cells the kernel runs the Qt loop, which carries the run through its workers.
    end = time.monotonic() + KERNEL_RUN_LIMIT_S
    while kernel.run("print(w.session.capture is not None)").strip() != "True" and time.monotonic() < end:
        time.sleep(0.25)
    assert kernel.run("print(len(w.session.capture), w.isVisible())").split() == ["3", "True"]
    # ipykernel runs the Qt loop inside its asyncio loop and leaves it only for a new message;
    # gx.explore has it hand back. Work of the notebook's asyncio loop runs while nothing is
    # sent (a task that sleeps, then writes a file) ...
    done = Path(kernel.run(ASYNCIO_CELL).strip())
    end = time.monotonic() + BACK_TO_BACK_LIMIT_S
    while not done.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert done.exists(), "the notebook's asyncio task did not run while the window was open"
    # ... and cells sent back to back each start and return.
    for i in range(BACK_TO_BACK_CELLS):
        assert kernel.run(f"print({i} * 2)", limit_s=BACK_TO_BACK_LIMIT_S).strip() == str(i * 2)
    assert kernel.run("w.close(); import gradexplorer_app.explore as e; print(len(e._open_windows))").strip() == "0"


def test_the_kernels_asyncio_loop_is_said_to_have_work_when_a_callback_is_ready_or_a_timer_due():
    """What the Qt loop asks before handing back to a Jupyter kernel, on a real asyncio loop."""
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        assert not explore_module._asyncio_has_work(loop)
        later = loop.call_later(3600, lambda: None)
        assert not explore_module._asyncio_has_work(loop)  # a timer not yet due
        later.cancel()
        loop.run_until_complete(asyncio.sleep(0))  # the cancelled timer leaves the queue
        assert not explore_module._asyncio_has_work(loop)
        handle = loop.call_soon(lambda: None)
        assert explore_module._asyncio_has_work(loop)  # a callback ready
        handle.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.call_at(loop.time() - 1, lambda: None)
        assert explore_module._asyncio_has_work(loop)  # a timer due
    finally:
        loop.close()
    assert explore_module._asyncio_has_work(object())  # a loop whose queues cannot be read: always


def test_screenshot_never_replaces_the_capture_it_shows(live, tmp_path):
    model, x = live
    path = tmp_path / "cap.pt"
    gx.save_capture(gx.capture(model, x, layers=["fc"]), path)
    before = path.read_bytes()
    with pytest.raises(gx.GradExplorerError):
        gx.explore(str(path), screenshot=path)
    assert path.read_bytes() == before


@pytest.mark.slow
def test_explore_a_hugging_face_model_on_text_names_the_saliency_bars_by_their_tokens(qtbot):
    """A notebook's transformers model and tokenizer: the window runs on the text, the
    saliency bars are the tokens, and they equal autograd's gradient at the embeddings."""
    pytest.importorskip("transformers")
    from tests import hf_tiny

    model, tok = hf_tiny.gpt2(), hf_tiny.tokenizer()
    before = model_state(model)
    window = gx.explore(model, ["the cat sat on a mat"], tokenizer=tok, input_grad=True, block=False)
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: window.session.capture is not None, timeout=TIMEOUT)
    assert window.batch_panel.text_box.isVisibleTo(window.batch_panel)  # more text can be typed
    views = window.views
    views.show_view("Saliency")
    views.saliency_view.ensure_drawn()
    assert views.saliency_view._tick_texts == ["the", "cat", "sat", "on", "a", "mat"]
    seen = {}
    handle = model.transformer.wte.register_forward_hook(lambda m, a, o: seen.setdefault("e", o))
    logits = model(**window.session.batch.inputs.kwargs).logits
    handle.remove()
    want = torch.autograd.grad(logits[:, -1].max(-1).values.sum(), seen["e"])[0]
    bars = views.saliency_view.current_map()[0]
    np.testing.assert_allclose(bars, want[0].double().norm(dim=-1).numpy(), rtol=1e-5, atol=1e-9)
    assert_same_state(before, model_state(model))


EXPANDED_SHAPE = (64, 16384, 16384)  # 64 GiB declared, 4 bytes stored; one sample declares 1 GiB
MiB = 2**20


def _graph_settled(panel) -> bool:
    return not panel.extractions.is_busy() and not panel.layouts.is_busy() and (
        bool(panel.items) or panel.status.text().startswith("Graph:"))


@pytest.mark.slow
def test_explore_on_an_expanded_batch_copies_none_of_it_on_the_ui_thread_nor_for_the_graph(qtbot, shown_errors):
    """The graph view had made a random sample of the input's shape on the UI thread (1 GiB)
    when the model was announced before its batch; the graph now runs in a worker on a view
    of the batch's first sample."""
    x = torch.zeros(1).expand(*EXPANDED_SHAPE)
    model = RowReader()
    with LargestResult() as seen, peak_rss_rise() as rise:
        window = gx.explore(model, x, run=False, block=False)
        qtbot.addWidget(window)
        qtbot.waitUntil(lambda: window.session.batch is not None and window.session.tree is not None, timeout=TIMEOUT)
        panel = window.graph_panel
        window.module_tabs.setCurrentWidget(panel)
        qtbot.waitUntil(lambda: _graph_settled(panel), timeout=TIMEOUT)
    assert panel.graph is not None, panel.status.text()
    assert any(n.kind == "module" and n.name == "fc" for n in panel.graph)
    assert seen.largest <= 64 * MiB, seen.largest  # the UI thread: thumbnails at most
    assert rise.bytes < 512 * MiB, rise.bytes  # every thread: nothing of a sample's 1 GiB
    assert window.session.batch.tensor.untyped_storage().nbytes() == 4  # the caller's batch, not a copy
    assert not shown_errors


@pytest.mark.slow
def test_the_graph_over_the_memory_budget_is_refused_in_words(qtbot, shown_errors):
    """A model that copies its sample (1 GiB) under a 256 MiB budget: the graph panel says
    what it would need and what to do; nothing of that size is made."""
    x = torch.zeros(1).expand(*EXPANDED_SHAPE)
    with peak_rss_rise() as rise:
        window = gx.explore(RowReader(dense=True), x, run=False, block=False, memory_budget=256 * MiB)
        qtbot.addWidget(window)
        qtbot.waitUntil(lambda: window.session.batch is not None, timeout=TIMEOUT)
        panel = window.graph_panel
        window.module_tabs.setCurrentWidget(panel)
        qtbot.waitUntil(lambda: _graph_settled(panel), timeout=TIMEOUT)
    text = panel.status.text()
    assert panel.graph is None and "needs about 1.0 GiB" in text and "memory budget is 256 MiB" in text, text
    assert "smaller samples" in text
    assert rise.bytes < 512 * MiB, rise.bytes


@pytest.mark.slow
@pytest.mark.qt_no_exception_capture  # the listener's traceback goes to sys.excepthook, on purpose
def test_a_listener_that_raises_is_a_message_and_the_run_goes_on(qtbot, live, shown_errors, monkeypatch):
    """A view that fails while the session announces a model (here the graph, out of
    memory) had stopped the controller half way: the batch was never set, the run never
    started, and explore waited for ever. Now the window says so and the rest goes on."""
    from gradexplorer_app.views.graph_view import GraphPanel

    def out_of_memory(*_a, **_k):
        raise MemoryError("cannot allocate 1073741824 bytes")

    monkeypatch.setattr(GraphPanel, "request_extract", out_of_memory)
    model, x = live
    window = gx.explore(model, x, layers="fc", block=False)
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: window.session.capture is not None, timeout=TIMEOUT)
    assert [title for title, _exc in shown_errors] == ["Part of the window was not updated"]
    assert isinstance(shown_errors[0][1], MemoryError)
    assert window.session.batch is not None and window.batch_panel.list.count() == 3  # later listeners ran
    worst = compare(window.session.capture, reference(model, x, ["fc"], target="top1"), ["fc"])
    assert worst < 1e-6


CAPPED_SCRIPT = textwrap.dedent("""
    import resource
    import sys
    import torch
    import gradexplorer as gx
    from gradexplorer_app.window.application import setup_application
    import gradexplorer_app.window.main_window  # everything imported before the cap
    from tests.memory_watch import RowReader

    setup_application()
    model = RowReader()
    size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize"))
    cap = size + 768 * 2**20  # far less than one sample's 1 GiB
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    x = torch.zeros(1).expand(64, 16384, 16384)
    window = gx.explore(model, x, run=False, screenshot=sys.argv[1])
    print("shown", window.session.model is not None, window.session.batch is not None, flush=True)
""")


@pytest.mark.slow
def test_explore_of_an_expanded_batch_under_a_memory_cap_returns(tmp_path):
    """The address space capped at 768 MiB above what the window needs: the window opens
    on the model and its batch and the screenshot is saved (it had raised inside a psygnal
    listener and explore waited for the run until its 300 s limit).

    The threads are pinned: every thread takes address space (its stack, a malloc arena of
    up to 64 MiB), so with one OpenMP thread per core the same cap ran out on a many-core
    machine before the window could be drawn, whatever the batch."""
    script = tmp_path / "capped.py"
    script.write_text(CAPPED_SCRIPT)
    shot = tmp_path / "w.png"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "GRADEXPLORER_SETTINGS": str(tmp_path / "s.ini"),
           "PYTHONPATH": str(root), "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "2",
           "MALLOC_ARENA_MAX": "2"}
    result = subprocess.run([sys.executable, str(script), str(shot)], capture_output=True, text=True,
                            timeout=200, env=env, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "shown True True" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_window_that_cannot_be_drawn_into_a_picture_is_an_error_and_explore_returns(live, tmp_path,
                                                                                         monkeypatch):
    """Out of memory for the picture (Qt gives a null pixmap, no exception): explore says so
    and returns, nothing is written, the model is as it was (the error had been printed from
    a timer's callback and explore waited forever on a loop nobody quit)."""
    from PySide6.QtGui import QPixmap
    from PySide6.QtWidgets import QWidget

    model, x = live
    before = model_state(model)
    monkeypatch.setattr(QWidget, "grab", lambda self, *a: QPixmap())
    shot = tmp_path / "w.png"
    with pytest.raises(gx.GradExplorerError, match="picture could not be made") as raised:
        gx.explore(model, x, run=False, screenshot=shot)
    assert "free memory" in raised.value.fix
    assert not shot.exists() and [p.name for p in tmp_path.iterdir() if p.suffix != ".ini"] == []
    assert_same_state(before, model_state(model))
