"""Outputs never land on an input of the run or inside a model cache: a Hugging Face
snapshot's files are links to blobs that every revision shares, and writing "through" one
would replace the cached model; the ``--text`` file is an input like ``--input``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gradexplorer.base.file_write import FileWriteError, atomic_write_bytes, check_output_path
from gradexplorer_app.cli.main import main
from tests import hf_hostile, hf_tiny

pytest.importorskip("transformers")


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    home = hf_tiny.offline_home(monkeypatch, tmp_path / "hf_home")
    snapshot = hf_hostile.cached(home, "acme/tiny", blobs=True)
    return home, snapshot


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "new.pt",
                                  "../../refs/main", "../../blobs"])
def test_out_inside_the_hugging_face_cache_is_refused_and_the_cache_stays_whole(cache, capsys, name):
    home, snapshot = cache
    before = _digests(home)
    out = snapshot / name
    code = main(["-q", "capture", "--model", "hf:acme/tiny", "--text", "the cat", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "inside the Hugging Face cache" in err and "Choose a path outside the model caches" in err
    assert _digests(home) == before
    assert not (snapshot / "new.pt").exists()


def test_a_link_from_elsewhere_into_the_cache_is_followed_before_the_check(cache, tmp_path):
    home, snapshot = cache
    before = _digests(home)
    link = tmp_path / "looks-harmless.pt"
    os.symlink(snapshot / "model.safetensors", link)
    with pytest.raises(FileWriteError, match="inside the Hugging Face cache"):
        atomic_write_bytes(link, b"overwritten")
    folder_link = tmp_path / "out"
    os.symlink(snapshot, folder_link)
    with pytest.raises(FileWriteError, match="inside the Hugging Face cache"):
        check_output_path(folder_link / "capture.pt")
    assert _digests(home) == before


def test_out_inside_torchs_hub_cache_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    import torch

    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    checkpoint = tmp_path / "torch_home" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    with pytest.raises(FileWriteError, match="inside torch's hub cache"):
        atomic_write_bytes(checkpoint, b"overwritten")
    assert checkpoint.read_bytes() == b"weights"


def test_out_over_the_text_file_is_refused_and_the_text_stays(cache, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\na dog ran\n")
    for out in (texts, tmp_path / "link.txt"):
        if out != texts:
            os.symlink(texts, out)
        code = main(["-q", "capture", "--model", "hf:acme/tiny", "--text", str(texts), "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 1, err
        assert "is the same file as the input" in err
        assert texts.read_text() == "the cat sat\na dog ran\n"
