"""The models people bring, as ``file.py:fn`` factories for the CLI and the window (``--trust``).

Each reuses a test model that already exists where one does: the token LSTM of
``tests/core/test_compare.py``, the two-frame model of ``tests/core/test_several_inputs.py``
(which also takes a keyword), the dict-output model of ``tests/core/test_compare.py``, the token
model of ``tests/app/test_sequences.py`` in fp16, and the demo's shapes CNN in bf16. Only the
Transformer encoder is new here (no test had one). Weights are seeded: two calls give the same model.
"""

from __future__ import annotations

import torch
from torch import nn

from gradexplorer.models.demos import ShapesCNN
from tests.app.test_sequences import TokenModel
from tests.core.test_compare import DictOut, TinySeq
from tests.core.test_several_inputs import TwoFrames

#: Token ids run from 0 to VOCAB - 1 for both sequence models.
VOCAB = 11


class TinyEncoder(nn.Module):
    """Token ids (B, T) -> embedding -> one Transformer encoder layer -> mean over tokens -> 3 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)).mean(1))


def _seeded(make):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return make()


def lstm() -> nn.Module:
    return _seeded(TinySeq)


def transformer() -> nn.Module:
    return _seeded(TinyEncoder)


def two_inputs() -> nn.Module:
    return _seeded(TwoFrames)


def dict_output() -> nn.Module:
    return _seeded(DictOut)


def fp16() -> nn.Module:
    return _seeded(TokenModel).half()


def bf16() -> nn.Module:
    return _seeded(ShapesCNN).to(torch.bfloat16)
