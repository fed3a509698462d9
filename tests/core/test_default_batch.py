"""The one rule for "which batch when the user named none" (gradexplorer.pipeline.job.default_batch_spec)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.job import CaptureJob, default_batch_spec, probe_model
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 40, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.embed(ids)).mean(1)


class Opaque(nn.Module):
    def forward(self, x):
        return x * 2


def _loaded(module: nn.Module, input_shape=None, spec: str = "test") -> LoadedModel:
    return LoadedModel(module=module, spec=spec, name=spec, input_shape=input_shape)


def test_a_known_input_shape_is_written_out_in_the_spec():
    spec = default_batch_spec(_loaded(nn.Sequential(nn.Conv2d(3, 4, 3)), (3, 32, 48)))
    assert spec == BatchSpec(random="2x3x32x48")
    assert default_batch_spec(_loaded(nn.Sequential(nn.Conv2d(3, 4, 3)), (3, 32, 48)), n=1) == BatchSpec(
        random="1x3x32x48")


def test_a_demo_model_gets_its_own_batch():
    from gradexplorer.models.demos import load_demo

    loaded = load_demo("demo:seed-mlp")
    assert default_batch_spec(loaded) == BatchSpec(demo=True)


def test_an_embedding_model_gets_token_ids_in_range_from_the_job():
    loaded = _loaded(TinyLM(vocab=40))
    assert default_batch_spec(loaded) == BatchSpec(random="2x16")
    job = CaptureJob(CaptureOptions("test"), loaded=loaded)
    ids = job.load_batch().tensor
    assert ids.dtype == torch.int64 and ids.shape == (2, 16)
    assert int(ids.min()) >= 0 and int(ids.max()) < 40
    assert job.batch_spec() == BatchSpec(random="2x16")


def test_an_fp16_model_gets_fp16_values():
    loaded = _loaded(nn.Sequential(nn.Linear(6, 3)).half())
    job = CaptureJob(CaptureOptions("test"), loaded=loaded)
    x = job.load_batch().tensor
    assert x.dtype == torch.float16 and x.shape == (2, 6)


def test_named_inputs_win_over_the_default():
    loaded = _loaded(nn.Sequential(nn.Linear(6, 3)))
    job = CaptureJob(CaptureOptions("test", batch=BatchSpec(random="5x6")), loaded=loaded)
    assert job.batch_spec() == BatchSpec(random="5x6") and job.load_batch().tensor.shape == (5, 6)


def test_no_shape_known_is_one_clear_error():
    job = CaptureJob(CaptureOptions("test"), loaded=_loaded(Opaque()))
    assert default_batch_spec(job.loaded) is None
    with pytest.raises(GradExplorerError) as info:
        job.load_batch()
    assert "input shape is not known" in info.value.problem
    assert "--input" in info.value.fix and "--random SHAPE" in info.value.fix


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_probe_without_a_batch_follows_the_models_dtype(dtype):
    # A float32 zero sample would fail in the first Linear of a half model.
    prepared = probe_model(_loaded(nn.Sequential(nn.Linear(6, 3), nn.ReLU()).to(dtype), (6,)))
    assert prepared.probe_error is None and prepared.tree.probed


def test_the_probe_without_a_batch_gives_an_embedding_token_ids():
    prepared = probe_model(_loaded(TinyLM(vocab=40), (16,)))
    assert prepared.probe_error is None and prepared.tree.probed
