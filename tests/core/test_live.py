"""A model and a batch from the caller's process (``gradexplorer.pipeline.live``): what
``gradexplorer.explore`` hands the window, without the window."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.pipeline.compare_sources import Variant, compare_variant
from gradexplorer.pipeline.job import CaptureJob
from gradexplorer.pipeline.live import LIVE_WEIGHTS, LiveOptions, is_live, live_batch, live_request
from tests.ground_truth import compare, reference


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))


def test_a_live_model_is_the_callers_object_and_says_where_it_came_from():
    model = net()
    x = torch.randn(3, 6)
    request = live_request(model, x, name="probe net", categories=list("abcd"))
    loaded = request.loaded
    assert loaded.module is model and is_live(loaded.spec) and loaded.spec == "live:probe net"
    assert loaded.weights == LIVE_WEIGHTS and loaded.categories == list("abcd")
    assert loaded.input_shape == (6,)  # from the batch: the window's random batches follow it
    assert request.options.device == "cpu"  # where the model is
    assert request.batch is not None and request.batch.names == ["sample 0", "sample 1", "sample 2"]


def test_a_live_batch_runs_the_capture_the_command_line_would_exactly():
    model = net()
    x = torch.randn(3, 6, requires_grad=True)  # part of the caller's graph: detached, not kept
    request = live_request(model, x, LiveOptions(target="cross_entropy", labels=[0, 3, 1]))
    assert request.batch is not None and not request.batch.tensor.requires_grad
    cap = CaptureJob(request.options, loaded=request.loaded, batch=request.batch).run()
    names = ["0", "1", "2"]
    ref = reference(model, x.detach(), names, target="cross_entropy", labels=torch.tensor([0, 3, 1]))
    assert compare(cap, ref, names) < 1e-6
    assert cap.meta["model"] == "live:Sequential" and cap.meta["weights"] == LIVE_WEIGHTS
    assert x.grad is None  # the caller's tensor was never differentiated


def test_positional_and_keyword_inputs():
    batch = live_batch((torch.zeros(2, 3), torch.ones(2)))
    assert isinstance(batch.inputs, ModelInputs) and len(batch.inputs.args) == 2
    assert "with more inputs" in batch.source
    batch = live_batch({"input_ids": torch.zeros(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5)})
    assert batch.inputs is not None and set(batch.inputs.kwargs) == {"input_ids", "attention_mask"}
    assert batch.tensor.dtype == torch.long and len(batch) == 2


@pytest.mark.parametrize("inputs, labels, words", [
    ("photos/", None, "cannot be called with"),
    ({"x": 1.0}, None, "hold no tensor"),
    ({1: torch.zeros(2)}, None, "not a name"),
    (torch.tensor(3.0), None, "single number"),
    (torch.zeros(0, 6), None, "no samples"),
    (torch.zeros(2, 6), [1, 2, 3], "3 labels for 2 samples"),
    (torch.zeros(2, 6), [0.5, 1.5], "class indices"),
])
def test_bad_inputs_are_said_in_words(inputs, labels, words):
    with pytest.raises(GradExplorerError, match=words):
        live_batch(inputs, labels=labels)


def test_not_a_module_is_refused():
    with pytest.raises(GradExplorerError, match=r"torch\.nn\.Module"):
        live_request(lambda x: x, torch.zeros(1, 2))


def test_compare_variants_reuse_the_live_model_and_refuse_other_weights():
    model = net()
    request = live_request(model, torch.randn(2, 6))
    runs = compare_variant(request.options, Variant(train=True), loaded=request.loaded, batch=request.batch)
    assert runs.b.meta["model"] == "live:Sequential"  # B ran on the same object, nothing loaded
    with pytest.raises(GradExplorerError, match="handed over in memory"):
        compare_variant(request.options, Variant(weights="DEFAULT"), loaded=request.loaded, batch=request.batch)


def test_a_compiled_model_is_shown_through_its_eager_module():
    model = net()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(3, 6)
    compiled(x)
    request = live_request(compiled, x)
    assert request.loaded.module is model and request.loaded.name == "Sequential"
    assert any("torch.compile" in note for note in request.loaded.notes)
    cap = CaptureJob(request.options, loaded=request.loaded, batch=request.batch).run()
    assert {n: len(r.calls) for n, r in cap.layers.items()} == {"0": 1, "1": 1, "2": 1}


def test_a_hugging_face_model_in_memory_takes_text_and_shows_its_tokens():
    """A transformers model and its tokenizer handed over: text is tokenised as --text is,
    the token strings come along, a causal LM's top1 is its next token, and the capture
    equals autograd on the same model."""
    pytest.importorskip("transformers")
    from tests import hf_tiny

    model, tok = hf_tiny.gpt2(), hf_tiny.tokenizer()
    request = live_request(model, ["the cat sat", "a dog"], LiveOptions(input_grad=True), tokenizer=tok)
    loaded, batch = request.loaded, request.batch
    assert loaded.default_target == "top1,dim=-1,pos=-1" and loaded.tokenizer is tok
    assert batch is not None and batch.tokens == [["the", "cat", "sat"], ["[pad]", "a", "dog"]]
    cap = CaptureJob(request.options, loaded=loaded, batch=batch).run()
    assert cap.meta["target"] == "top1,dim=-1,pos=-1" and cap.meta["tokens"] == batch.tokens
    seen = {}
    handle = model.transformer.wte.register_forward_hook(lambda m, a, o: seen.setdefault("e", o))
    logits = model(**batch.inputs.kwargs).logits
    handle.remove()
    want = torch.autograd.grad(logits[:, -1].max(-1).values.sum(), seen["e"])[0]
    torch.testing.assert_close(cap.input_grad, want, rtol=1e-5, atol=1e-7)
    # a tokenizer's own output (a BatchEncoding) is keyword arguments, named by its tokens
    encoded = tok(["the cat sat on a mat"], return_tensors="pt")
    again = live_request(model, encoded, tokenizer=tok).batch
    assert again is not None and again.tokens == [["the", "cat", "sat", "on", "a", "mat"]]
    with pytest.raises(GradExplorerError, match="tokenizer"):
        live_request(model, "the cat sat")


def test_the_callers_tokenizer_is_left_as_it_was():
    """Text is padded (on the left, for a causal LM) with a padding token GPT-2 lacks, but
    the tokenizer handed over is the user's: its padding side, padding token and backend
    are as they were, and its own padded call still refuses for want of a padding token."""
    pytest.importorskip("transformers")
    from gradexplorer.batches.text import load_text
    from tests import hf_tiny

    model, tok = hf_tiny.gpt2(), hf_tiny.tokenizer()

    def state():
        return tok.pad_token, tok.pad_token_id, tok.padding_side, tok.backend_tokenizer.padding, len(tok)

    before = state()
    assert before[0] is None and before[2] == "right"  # what this test is about
    request = live_request(model, ["the cat sat", "a dog"], tokenizer=tok)
    assert request.batch is not None
    assert request.batch.inputs.kwargs["attention_mask"].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert state() == before
    load_text(["the cat sat", "a dog"], request.loaded)
    assert state() == before
    with pytest.raises(ValueError, match="pad"):
        tok(["the cat sat", "a dog"], padding=True)


def test_a_hugging_face_classifier_in_memory_brings_its_class_names():
    pytest.importorskip("transformers")
    from tests import hf_tiny

    request = live_request(hf_tiny.bert(), ["the big dog ran"], tokenizer=hf_tiny.tokenizer(bert=True))
    assert request.loaded.categories == ["neg", "mid", "pos"] and request.loaded.default_target is None
