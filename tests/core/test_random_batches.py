"""A random batch follows the model: its dtype, token ids for an Embedding, its shape."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import BatchError
from gradexplorer.batches import load_batch, random_batch, random_batch_for, recipe_for
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer_app.cli.main import main


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.embed(ids)).mean(1)


def _loaded(module: nn.Module, input_shape=None) -> LoadedModel:
    return LoadedModel(module=module, spec="test", name="test", input_shape=input_shape)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_random_values_take_the_models_dtype(dtype):
    model = nn.Sequential(nn.Linear(6, 3)).to(dtype)
    batch = load_batch(["random"], _loaded(model))
    assert batch.tensor.dtype == dtype and batch.tensor.shape == (2, 6)
    assert str(dtype).replace("torch.", "") in batch.source
    # The same values as float32, rounded: the seed still makes the batch.
    plain = random_batch("2x6").tensor
    assert torch.equal(batch.tensor, plain.to(dtype))
    model(batch.tensor)


def test_explicit_shape_still_follows_the_dtype():
    model = nn.Sequential(nn.Conv2d(3, 4, 3)).to(torch.bfloat16)
    batch = load_batch(["random:1x3x20x20"], _loaded(model, (3, None, None)))
    assert batch.tensor.dtype == torch.bfloat16 and batch.tensor.shape == (1, 3, 20, 20)


def test_embedding_model_gets_token_ids_in_range():
    model = TinyLM(vocab=50)
    batch = load_batch(["random:4x12"], _loaded(model))
    ids = batch.tensor
    assert ids.dtype == torch.int64 and ids.shape == (4, 12)
    assert int(ids.min()) >= 0 and int(ids.max()) < 50
    assert len(ids.unique()) > 10  # drawn, not constant
    assert "token ids in [0, 50)" in batch.source
    model(ids)


def test_shape_from_the_first_layer_when_the_model_says_nothing():
    assert load_batch(["random"], _loaded(TinyLM())).tensor.shape == (2, 16)
    conv = nn.Sequential(nn.Conv2d(5, 2, 3), nn.ReLU())
    assert load_batch(["random"], _loaded(conv)).tensor.shape == (2, 5, 64, 64)
    assert recipe_for(nn.Sequential(nn.Conv1d(7, 2, 3))).sample_shape == (7, 64)


def test_known_input_shape_wins_over_the_first_layer():
    model = nn.Sequential(nn.Conv2d(3, 2, 3))
    assert random_batch_for(model, (3, 32, 48)).tensor.shape == (2, 3, 32, 48)


def test_no_shape_at_all_is_one_clear_error():
    class Opaque(nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(BatchError) as info:
        load_batch(["random"], _loaded(Opaque()))
    assert "2x3x224x224" in info.value.fix and "random:" not in str(info.value)


def test_cli_random_for_a_bf16_token_model(tmp_path, capsys):
    nets = tmp_path / "lm.py"
    nets.write_text(textwrap.dedent(
        """
        import torch
        from torch import nn

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(30, 8)
                self.head = nn.Linear(8, 30)

            def forward(self, ids):
                return self.head(self.embed(ids)).mean(1)

        def build():
            torch.manual_seed(0)
            return LM().to(torch.bfloat16)
        """
    ))
    out = tmp_path / "lm.pt"
    code = main(["capture", "--model", f"{nets}:build", "--trust", "--random", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    from gradexplorer.files.capture_file import load_capture

    capture = load_capture(out)
    assert capture.input.dtype == torch.int64 and capture.input.shape == (2, 16)
    assert int(capture.input.max()) < 30
