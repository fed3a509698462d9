"""A watch's outputs never land inside a model cache: its log (with the ``.lock``, ``-wal`` and
``-shm`` files beside it), its TensorBoard folder, and what ``gradexplorer export`` writes
from a log. Refused in words (problem and fix) when the watch is made, before any training
step and before anything is created; a link from elsewhere into a cache is followed first."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradexplorer as gx
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.recording.watch_log import WatchLogWriter, open_log
from gradexplorer_app.cli.main import main

REV = "0123456789abcdef0123456789abcdef01234567"


def _tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: a file's digest, a link's target, a folder's name."""
    out = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = "-> " + os.readlink(p)
        elif p.is_file():
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[key] = "/"
    return out


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A Hugging Face home laid out as huggingface_hub lays it: a snapshot whose files are
    links to blobs, and refs/main."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    repo = home / "hub" / "models--acme--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    snapshot = repo / "snapshots" / REV
    snapshot.mkdir(parents=True)
    for name, data in (("config.json", b'{"model_type": "gpt2"}'), ("model.safetensors", b"weights")):
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        os.symlink(Path("..", "..", "blobs", digest), snapshot / name)
    return home, snapshot


@pytest.fixture
def torch_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    checkpoints = tmp_path / "torch_home" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "resnet18-f37072fd.pth").write_bytes(b"weights")
    return checkpoints


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _refused(info: pytest.ExceptionInfo, cache: str) -> None:
    assert isinstance(info.value, GradExplorerError)
    assert f"inside {cache}" in info.value.problem, info.value.problem
    assert info.value.fix == "Choose a path outside the model caches."


@pytest.mark.parametrize("name", ["run.gxw", "model.safetensors", "../../blobs/run.gxw", "../../refs/run.gxw"])
def test_gx_watch_refuses_a_log_inside_the_hugging_face_cache_when_it_is_made(hf_cache, name):
    home, snapshot = hf_cache
    before = _tree(home)
    model = _model()
    with pytest.raises(GradExplorerError) as info:
        gx.watch(model, out=str(snapshot / name))
    _refused(info, "the Hugging Face cache")
    assert _tree(home) == before  # no log, no .lock, no -wal beside it; the blobs whole
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_the_log_writer_itself_refuses_a_model_cache_and_a_link_into_one(hf_cache, torch_cache, tmp_path):
    """The one writer of logs checks too: any watch (a trainer's, a subclass's) is covered."""
    home, snapshot = hf_cache
    before = _tree(home), _tree(torch_cache)
    with pytest.raises(GradExplorerError) as info:
        WatchLogWriter(torch_cache / "run.gxw")
    _refused(info, "torch's hub cache")
    link = tmp_path / "logs"
    os.symlink(snapshot, link)  # a harmless-looking folder that is the snapshot
    with pytest.raises(GradExplorerError) as info:
        WatchLogWriter(link / "run.gxw")
    _refused(info, "the Hugging Face cache")
    with pytest.raises(GradExplorerError) as info:
        gx.watch(_model(), out=str(link / "run.gxw"))
    _refused(info, "the Hugging Face cache")
    assert (_tree(home), _tree(torch_cache)) == before


def test_a_tensorboard_folder_inside_a_cache_is_refused_before_it_is_made(hf_cache, torch_cache, tmp_path):
    home, snapshot = hf_cache
    before = _tree(home), _tree(torch_cache)
    for folder, cache in ((snapshot / "tb", "the Hugging Face cache"), (torch_cache / "tb", "torch's hub cache")):
        with pytest.raises(GradExplorerError) as info:
            gx.watch(_model(), out=str(tmp_path / "run.gxw"), tensorboard=folder)
        _refused(info, cache)
    assert (_tree(home), _tree(torch_cache)) == before
    assert not (tmp_path / "run.gxw").exists()


def test_a_watch_outside_the_caches_still_writes(hf_cache, tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gx.watch(model, out=str(tmp_path / "run.gxw"), every=1) as w:
        x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        w.step(loss=loss)
    con = open_log(tmp_path / "run.gxw")
    assert [step for (step,) in con.execute("SELECT step FROM steps")] == [0]
    con.close()


def test_the_trainer_callbacks_refuse_a_cache_when_they_are_made(hf_cache, torch_cache):
    """Before the trainer runs at all (it would have trained until the watch's start)."""
    home, snapshot = hf_cache
    made = 0
    for module in ("gradexplorer.integrations.lightning", "gradexplorer.integrations.transformers"):
        try:
            callback = __import__(module, fromlist=["WatchCallback"]).WatchCallback
        except ImportError:
            continue
        made += 1
        with pytest.raises(GradExplorerError) as info:
            callback(snapshot / "run.gxw")
        _refused(info, "the Hugging Face cache")
        with pytest.raises(GradExplorerError) as info:
            callback("run.gxw", tensorboard=torch_cache / "tb")
        _refused(info, "torch's hub cache")
    if not made:
        pytest.skip("neither Lightning nor transformers is installed")


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "run.gxw"
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gx.watch(model, out=str(log), every=1) as w:
        for _ in range(2):
            loss = F.cross_entropy(model(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
    return log


@pytest.mark.parametrize("flag", ["--tensorboard", "--csv", "--parquet"])
def test_export_refuses_every_output_inside_a_cache_and_writes_none(hf_cache, tmp_path, capsys, flag):
    home, snapshot = hf_cache
    log = _log(tmp_path)
    before = _tree(home)
    target = snapshot / ("tb" if flag == "--tensorboard" else "rows" + flag.replace("--", "."))
    ok = tmp_path / "rows.csv"
    args = ["export", str(log), flag, str(target)] + (["--csv", str(ok)] if flag != "--csv" else [])
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "inside the Hugging Face cache" in err and "Choose a path outside the model caches" in err, err
    assert _tree(home) == before and not ok.exists()  # nothing written, the other output neither
