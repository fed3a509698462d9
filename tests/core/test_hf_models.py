"""Hugging Face models by name and text in, offline: tiny GPT-2 and BERT models saved with
``save_pretrained`` (into a folder and into a Hugging Face cache layout) with a tokenizer
trained here; every capture checked against ``torch.autograd.grad`` on the same model."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from gradexplorer.base.errors import ModelLoadError, TrustRequired
from gradexplorer.batches import load_batch
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.targets import parse_target
from gradexplorer.files.capture_file import load_capture
from gradexplorer.files.meta import capture_meta
from gradexplorer.models import load_model
from gradexplorer_app.cli.main import main
from tests import hf_tiny
from tests.conftest import assert_no_hooks, assert_unchanged, snapshot
from tests.ground_truth import assert_param_grads_equal, param_grads_by_autograd


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"gpt2": hf_tiny.save("gpt2", root / "gpt2"), "bert": hf_tiny.save("bert", root / "bert")}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    return hf_tiny.offline_home(monkeypatch, tmp_path / "hf_home")


def _truth(model, kwargs, target, embedding):
    """Parameter gradients and the gradient at the embedding's output, by autograd alone."""
    seen = {}
    handle = embedding.register_forward_hook(lambda m, a, o: seen.setdefault("emb", o))
    try:
        out = model(**kwargs)
    finally:
        handle.remove()
    logits = out.logits
    t = parse_target(target)
    y = logits[:, t.position] if t.position is not None else logits
    scalar = y.max(dim=-1).values.sum()
    by_param = param_grads_by_autograd(model, scalar, retain_graph=True)
    (emb_grad,) = torch.autograd.grad(scalar, [seen["emb"]])
    return by_param, emb_grad, logits.detach()


def _check_against_autograd(cap, model, kwargs, target, embedding):
    by_param, emb_grad, logits = _truth(model, kwargs, target, embedding)
    torch.testing.assert_close(cap.output, logits, rtol=0, atol=1e-6)
    assert_param_grads_equal(cap, by_param, rtol=1e-5, atol=1e-6)
    assert cap.input_grad is not None and cap.input_grad.shape == emb_grad.shape
    torch.testing.assert_close(cap.input_grad, emb_grad, rtol=1e-5, atol=1e-6)


def test_cli_captures_a_saved_gpt2_folder_from_text_exactly(saved, offline, tmp_path, capsys):
    out = tmp_path / "lm.pt"
    code = main(["-q", "capture", "--model", f"hf:{saved['gpt2']}", "--text", "the cat sat", "--text", "a dog",
                 "--input-grad", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "the logit of the predicted next token at the last position" in printed
    assert "padded on the left" in printed
    cap = load_capture(out)
    meta = capture_meta(cap)
    assert meta.target == "top1,dim=-1,pos=-1"
    assert meta.tokens == (("the", "cat", "sat"), ("[pad]", "a", "dog"))
    assert meta.input_grad and "transformer.wte" in meta.input_grad_of
    assert len(meta.predicted_tokens) == 2

    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(saved["gpt2"]).eval()
    kwargs = dict(cap.model_inputs["kwargs"])
    assert set(kwargs) == {"input_ids", "attention_mask", "position_ids", "labels"}
    _check_against_autograd(cap, model, kwargs, meta.target, model.transformer.wte)
    # left padding with counted positions: the padded sample predicts as it does alone
    alone = model(input_ids=kwargs["input_ids"][1:, 1:]).logits[0, -1]
    torch.testing.assert_close(cap.output[1, -1], alone, rtol=1e-5, atol=1e-5)

    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "the | cat | sat" in shown and "[pad] | a | dog" in shown
    assert "predicted next token" in shown
    csv_out = tmp_path / "tokens.csv"
    assert main(["inspect", str(out), "--csv", str(csv_out)]) == 0
    rows = csv_out.read_text().splitlines()
    assert rows[0] == "sample,position,token,saliency" and rows[1].startswith("0,0,the,")
    assert rows[4].startswith("1,0,[pad],")
    norms = cap.input_grad.double().norm(dim=-1)
    assert float(rows[3].split(",")[3]) == pytest.approx(float(norms[0, 2]), rel=1e-12)


def test_cli_captures_a_bert_classifier_from_the_cache_by_name(saved, offline, tmp_path, capsys):
    hf_tiny.copy(saved["bert"], offline / "hub" / "models--tiny-org--tiny-bert" / "snapshots" / ("1" * 40))
    (offline / "hub" / "models--tiny-org--tiny-bert" / "refs").mkdir()
    (offline / "hub" / "models--tiny-org--tiny-bert" / "refs" / "main").write_text("1" * 40)
    texts = tmp_path / "samples.txt"
    texts.write_text("the big dog ran\n\nthe small red cat sat on a mat\n")
    out = tmp_path / "cls.pt"
    code = main(["-q", "capture", "--model", "hf:tiny-org/tiny-bert", "--text", str(texts), "--input-grad",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr()
    cap = load_capture(out)
    meta = capture_meta(cap)
    assert meta.categories == ("neg", "mid", "pos") and meta.target == "top1"
    assert meta.tokens[0][:5] == ("[CLS]", "the", "big", "dog", "ran") and meta.tokens[0][-1] == "[pad]"
    assert "padded on the right" in meta.preprocessing
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(saved["bert"]).eval()
    kwargs = dict(cap.model_inputs["kwargs"])
    _check_against_autograd(cap, model, kwargs, "top1", model.bert.embeddings.word_embeddings)


def test_a_model_output_with_labels_gives_the_logits_to_the_target_not_the_loss(saved):
    """With labels passed, a ModelOutput's first element is the loss."""
    loaded = load_model(f"hf:{saved['bert']}")
    batch = load_batch(["text:the cat sat", "text:a dog ran"], loaded)
    kwargs = dict(batch.inputs.kwargs, labels=torch.tensor([0, 2]))
    model = loaded.module
    assert next(iter(model(**kwargs).keys())) == "loss"
    cap = capture(model, ModelInputs((), kwargs), target="top1", input_grad=True)
    assert tuple(cap.output.shape) == (2, 3)
    _check_against_autograd(cap, model, {k: v for k, v in kwargs.items() if k != "labels"}, "top1",
                            model.bert.embeddings.word_embeddings)
    # a scalar element picked on purpose says which elements hold the logits
    with pytest.raises(Exception, match="@logits"):
        capture(model, ModelInputs((), kwargs), target="top1@loss")


def test_input_gradient_of_token_ids_is_taken_at_the_embeddings(saved):
    loaded = load_model(f"hf:{saved['gpt2']}")
    model = loaded.module
    batch = load_batch(["text:the cat sat on a mat"], loaded)
    before = snapshot(model)
    cap = capture(model, batch.model_input, target="top1,dim=-1,pos=-1", input_grad=True)
    assert_no_hooks(model)
    assert_unchanged(model, before)
    assert cap.input_grad is not None and tuple(cap.input_grad.shape) == (1, 6, 32)
    assert cap.meta["input_grad_of"] == "the output of 'transformer.wte' (the token embeddings)"
    _check_against_autograd(cap, model, dict(batch.inputs.kwargs), "top1,dim=-1,pos=-1", model.transformer.wte)


def test_input_gradient_of_ids_without_an_embedding_is_refused_in_words():
    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, ids):
            return self.lin(torch.nn.functional.one_hot(ids, 4).float().mean(1))

    with pytest.raises(Exception, match="token ids, which have no gradient"):
        capture(Counts(), torch.tensor([[0, 1, 3]]), input_grad=True)


def test_save_pretrained_weights_load_with_their_tied_key(saved, tmp_path):
    """save_pretrained leaves lm_head.weight (tied to transformer.wte.weight) out of its file."""
    from safetensors.torch import load_file

    file = saved["gpt2"] / "model.safetensors"
    assert "lm_head.weight" not in load_file(str(file))
    factory = tmp_path / "nets.py"
    factory.write_text(
        "from tests import hf_tiny\n"
        "def build():\n"
        "    import torch\n"
        "    torch.manual_seed(1)\n"
        "    return hf_tiny.gpt2()\n")
    pt = tmp_path / "weights.pt"
    torch.save(dict(load_file(str(file))), pt)
    for weights in (file, pt):
        loaded = load_model(f"{factory}:build", weights=str(weights), trust=True)
        wte = loaded.module.transformer.wte.weight
        assert torch.equal(wte, load_file(str(file))["transformer.wte.weight"])
        assert loaded.module.lm_head.weight.data_ptr() == wte.data_ptr()
        assert any("tied to transformer.wte.weight" in n for n in loaded.notes)


def test_not_in_the_cache_while_offline_says_so(offline):
    with pytest.raises(ModelLoadError, match=r"not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        load_model("hf:nobody/nothing-here")


def test_without_transformers_the_message_says_what_to_install(saved, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModelLoadError) as info:
        load_model(f"hf:{saved['gpt2']}")
    assert "pip install 'gradexplorer[hf]'" in str(info.value.fix)


def test_own_code_and_pickled_weights_need_trust(saved, tmp_path):
    folder = hf_tiny.copy(saved["gpt2"], tmp_path / "remote")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TrustRequired, match="code of its own"):
        load_model(f"hf:{folder}")
    pickled = hf_tiny.copy(saved["gpt2"], tmp_path / "pickled")
    (pickled / "model.safetensors").unlink()
    torch.save(hf_tiny.gpt2().state_dict(), pickled / "pytorch_model.bin")
    with pytest.raises(TrustRequired, match="pickle"):
        load_model(f"hf:{pickled}")


def test_the_class_comes_from_the_config_or_a_task_word(saved):
    assert type(load_model(f"hf:{saved['gpt2']}").module).__name__ == "GPT2LMHeadModel"
    base = load_model(f"hf:{saved['gpt2']}", hf_class="base")
    assert type(base.module).__name__ == "GPT2Model" and base.default_target is None
    with pytest.raises(ModelLoadError, match="task word"):
        load_model(f"hf:{saved['gpt2']}", hf_class="no-such-task")
    with pytest.raises(ModelLoadError, match="only with an hf: model"):
        load_model("resnet18", hf_class="base")


def test_text_needs_a_tokenizer(saved):
    from gradexplorer.base.errors import BatchError

    with pytest.raises(BatchError, match="has no tokenizer"):
        load_batch(["text:the cat"], load_model("demo:seed-mlp"))


def test_position_targets_parse_and_print():
    t = parse_target("top1,dim=-1,pos=-1")
    assert (t.class_dim, t.position, str(t)) == (-1, -1, "top1,dim=-1,pos=-1")
    assert t.describe() == "the logit of the predicted next token at the last position"
    with pytest.raises(Exception, match="per-token logits"):
        parse_target("sum,pos=-1")


def test_the_model_browser_lists_the_models_in_the_cache(offline):
    from gradexplorer.models.hf_models import HF_TASK, hf_catalog

    hf_tiny.save_in_cache("gpt2", offline, repo="tiny-org/tiny-gpt2")
    entries = {info.name: info for info in hf_catalog()}
    assert entries["hf:tiny-org/tiny-gpt2"].cached == ("hub",)
    assert entries["hf:tiny-org/tiny-gpt2"].task == HF_TASK
    assert entries["hf:openai-community/gpt2"].cached == ()
    loaded = load_model("hf:tiny-org/tiny-gpt2")
    assert loaded.tokenizer is not None and loaded.weights.endswith("0" * 40)


@pytest.fixture
def online(tmp_path, monkeypatch, saved):
    """An empty Hugging Face cache and a Hub on the loopback address serving the tiny GPT-2."""
    from tests.hf_fake_hub import FakeHub

    home = tmp_path / "hf_home"
    with FakeHub(saved["gpt2"], repo="tiny-org/tiny-gpt2") as hub:
        hub.point_hub_here(monkeypatch, home)
        yield hub, home


def test_a_model_not_in_the_cache_downloads_into_it_with_progress(online, saved):
    """The real download path (huggingface_hub's snapshot_download and its progress bars),
    against a Hub on the loopback address: the bytes written are reported as they arrive,
    and the files land in the cache the model browser lists."""
    from gradexplorer.models.hf_models import hf_catalog

    hub, home = online
    reports: list[tuple[int, int]] = []
    loaded = load_model("hf:tiny-org/tiny-gpt2", progress=lambda done, total: reports.append((done, total)))
    assert any(r.startswith("GET /tiny-org/tiny-gpt2/resolve/") and r.endswith("model.safetensors")
               for r in hub.requests)
    snapshot = home / "hub" / "models--tiny-org--tiny-gpt2" / "snapshots"
    assert "Hugging Face Hub" in loaded.notes[0] and str(snapshot) in loaded.notes[0]
    size = sum((saved["gpt2"] / f).stat().st_size for f in hub.files())
    assert reports and reports[-1] == (size, size)
    done = [d for d, _ in reports]
    assert done == sorted(done) and all(0 < d <= t for d, t in reports)
    assert loaded.tokenizer is not None and type(loaded.module).__name__ == "GPT2LMHeadModel"
    assert {i.name: i.cached for i in hf_catalog()}["hf:tiny-org/tiny-gpt2"] == ("hub",)
    # Now cached: the next load asks the Hub nothing.
    asked = len(hub.requests)
    load_model("hf:tiny-org/tiny-gpt2")
    assert len(hub.requests) == asked


def test_a_download_without_trust_fetches_no_code_and_no_pickles(tmp_path, monkeypatch):
    """A repository may hold the model's own code (``modeling_*.py``) and pickled weights
    beside its safetensors: without trust, neither is downloaded (they run code when
    loaded); the Hub on the loopback address says which files were asked for."""
    from tests.hf_fake_hub import FakeHub

    folder = hf_tiny.copy(hf_tiny.save("gpt2", tmp_path / "gpt2"), tmp_path / "repo")
    (folder / "modeling_tiny.py").write_text("raise SystemExit('the code ran')\n")
    torch.save({}, folder / "pytorch_model.bin")
    home = tmp_path / "hf_home"
    with FakeHub(folder, repo="tiny-org/tiny-gpt2") as hub:
        hub.point_hub_here(monkeypatch, home)
        loaded = load_model("hf:tiny-org/tiny-gpt2")
        fetched = {r.rsplit("/", 1)[1] for r in hub.requests if r.startswith("GET /tiny-org/tiny-gpt2/resolve/")}
    assert type(loaded.module).__name__ == "GPT2LMHeadModel" and loaded.tokenizer is not None
    assert "model.safetensors" in fetched and "config.json" in fetched
    assert not {"modeling_tiny.py", "pytorch_model.bin"} & fetched, fetched
    snapshots = home / "hub" / "models--tiny-org--tiny-gpt2" / "snapshots"
    assert not list(snapshots.rglob("*.py")) and not list(snapshots.rglob("*.bin"))


@pytest.mark.parametrize("trust", [False, True])
def test_the_files_asked_for_follow_trust(tmp_path, monkeypatch, trust):
    import huggingface_hub

    from gradexplorer.models.hf_models import resolve_folder

    asked: list[list[str]] = []
    snapshot = tmp_path / "hf_home" / "hub" / "models--tiny-org--tiny-gpt2" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)

    def snapshot_download(name, *, allow_patterns, **kwargs):
        asked.append(list(allow_patterns))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    resolve_folder("tiny-org/tiny-gpt2", trust=trust)
    (patterns,) = asked
    assert {"*.json", "*.safetensors", "tokenizer*"} <= set(patterns)
    assert ("*.py" in patterns) is trust and any(p.endswith(".bin") for p in patterns) is trust


def test_a_causal_lms_text_is_its_own_per_token_labels(saved, offline, tmp_path, capsys):
    """Text given to a causal language model is also its per-token labels (padding ignored):
    the output carries the model's own loss, and ``--target sum@loss`` differentiates the
    mean cross-entropy of each position's prediction of the next token, computed here by
    hand from the logits."""
    out = tmp_path / "loss.pt"
    code = main(["-q", "capture", "--model", f"hf:{saved['gpt2']}", "--text", "the cat sat on a mat",
                 "--text", "a dog ran", "--target", "sum@loss", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "labels: the text's own tokens" in printed
    cap = load_capture(out)
    kwargs = dict(cap.model_inputs["kwargs"])
    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
    assert torch.equal(kwargs["labels"], ids.masked_fill(mask == 0, -100))
    assert capture_meta(cap).tokens[1][:3] == ("[pad]", "[pad]", "[pad]")

    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(saved["gpt2"]).eval()
    inputs = {k: v for k, v in kwargs.items() if k != "labels"}
    logits = model(**inputs).logits
    # the truth: each real position predicts the next real token
    nxt, keep = ids[:, 1:], (mask[:, 1:] == 1)
    per_token = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), nxt, reduction="none")
    loss = per_token[keep].mean()
    assert_param_grads_equal(cap, param_grads_by_autograd(model, loss), rtol=1e-4, atol=1e-6)


def _param_grads_equal(cap, model, scalar) -> int:
    return assert_param_grads_equal(cap, param_grads_by_autograd(model, scalar), rtol=1e-5, atol=1e-7)


def test_an_encoder_decoder_reads_the_text_and_predicts_its_first_output_token(tmp_path):
    """T5 given text: the encoder reads it, the decoder starts from its start token, and the
    default target is the first token it would write."""
    folder = hf_tiny.save("t5", tmp_path / "t5")
    loaded = load_model(f"hf:{folder}")
    assert loaded.default_target == "top1,dim=-1,pos=-1"
    batch = load_batch(["text:the cat sat", "text:a dog"], loaded)
    kwargs = batch.inputs.kwargs
    assert kwargs["decoder_input_ids"].tolist() == [[0], [0]]
    assert "the decoder starts from its start token" in batch.preprocessing
    model = loaded.module
    cap = capture(model, batch.model_input, target=loaded.default_target, input_grad=True)
    logits = model(**kwargs).logits
    assert tuple(logits.shape[:2]) == (2, 1)
    assert _param_grads_equal(cap, model, logits[:, -1].max(-1).values.sum()) >= 10
    assert "embed_tokens" in cap.meta["input_grad_of"] and tuple(cap.input_grad.shape) == (2, 3, 32)


def test_a_vision_models_pictures_go_through_its_own_image_processor(tmp_path):
    """A Hugging Face ViT's pictures are prepared by its image processor (its size, and a
    mean and std of 0.5 rather than ImageNet's), as transformers would."""
    from PIL import Image
    from transformers import ViTImageProcessor

    folder = hf_tiny.save("vit", tmp_path / "vit")
    picture = tmp_path / "pic.png"
    Image.effect_noise((50, 40), 60).convert("RGB").save(picture)
    loaded = load_model(f"hf:{folder}")
    assert loaded.input_shape == (3, 32, 32)
    batch = load_batch([str(picture)], loaded)
    want = ViTImageProcessor.from_pretrained(folder)(images=Image.open(picture).convert("RGB"),
                                                     return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(batch.tensor, want, rtol=0, atol=1e-6)
    assert "image processor" in batch.preprocessing and "mean (0.5, 0.5, 0.5)" in batch.preprocessing
    model = loaded.module
    cap = capture(model, batch.model_input, target="top1")
    # The class token and position embeddings belong to ViTEmbeddings itself, not to a leaf
    # layer: a default capture holds them under it, as it holds every trainable parameter.
    scalar = model(pixel_values=want).logits.max(-1).values.sum()
    assert _param_grads_equal(cap, model, scalar) == sum(1 for p in model.parameters() if p.requires_grad)
    assert set(cap["vit.embeddings"].param_grads) == {"cls_token", "position_embeddings"}


FACTORY = '''
from tests import hf_tiny


def gpt2():
    return hf_tiny.gpt2()
'''


def test_a_factory_built_language_model_takes_text_with_tokenizer(saved, offline, tmp_path, capsys, monkeypatch):
    """A factory that builds a transformers model brings no tokenizer: --text is refused in
    words until --tokenizer names one (a saved folder, or hf:FOLDER of a model); the model
    is then read as an hf: one (padded on the left, its top1 the next token) and the capture
    equals autograd."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    (tmp_path / "lm.py").write_text(FACTORY)
    spec = f"{tmp_path / 'lm.py'}:gpt2"
    out = tmp_path / "lm.pt"
    code = main(["-q", "capture", "--model", spec, "--trust", "--text", "the cat sat", "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and "came without a tokenizer" in err and "--tokenizer FOLDER" in err and "Traceback" not in err
    tok_folder = tmp_path / "tok"
    hf_tiny.tokenizer().save_pretrained(tok_folder)
    for tokenizer in (str(tok_folder), f"hf:{saved['gpt2']}"):
        code = main(["-q", "capture", "--model", spec, "--trust", "--text", "the cat sat", "--text", "a dog",
                     "--tokenizer", tokenizer, "--input-grad", "--out", str(out)])
        printed = capsys.readouterr().out
        assert code == 0, printed
        assert "padded on the left" in printed and "predicted next token" in printed
        cap = load_capture(out)
        meta = capture_meta(cap)
        assert meta.target == "top1,dim=-1,pos=-1" and meta.tokens[1] == ("[pad]", "a", "dog")
        model = hf_tiny.gpt2()
        _check_against_autograd(cap, model, dict(cap.model_inputs["kwargs"]), meta.target, model.transformer.wte)
    # A folder without a tokenizer (the out written above is in it: an input's folder, so a new name).
    code = main(["-q", "capture", "--model", spec, "--trust", "--text", "the cat", "--tokenizer",
                 str(tmp_path), "--out", str(tmp_path / "other.pt")])
    err = capsys.readouterr().err
    assert code != 0 and "holds no tokenizer" in err and "Traceback" not in err
    # The tokenizer is an input: an --out over one of its files is refused before anything runs.
    before = (tok_folder / "tokenizer.json").read_bytes()
    code = main(["-q", "capture", "--model", spec, "--trust", "--text", "the cat", "--tokenizer",
                 str(tok_folder), "--out", str(tok_folder / "tokenizer.json")])
    err = capsys.readouterr().err
    assert code != 0 and "is the same file as the input" in err
    assert (tok_folder / "tokenizer.json").read_bytes() == before


def test_a_one_token_text_gets_no_labels_and_targets_the_logits(saved, offline, tmp_path, capsys):
    """One token has no next token to score: its loss would be NaN. The model gets no labels
    (the preprocessing says why), the target reads the logits, and every value is finite."""
    out = tmp_path / "one.pt"
    code = main(["-q", "capture", "--model", f"hf:{saved['gpt2']}", "--text", "cat", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "1 token, no padding; no labels: one token has no next token to score" in printed
    assert "NaN" not in printed
    cap = load_capture(out)
    kwargs = dict(cap.model_inputs["kwargs"])
    assert "labels" not in kwargs and cap.nonfinite_onset is None
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(saved["gpt2"]).eval()
    scalar = model(**kwargs).logits[:, -1].max(-1).values.sum()
    # Every parameter, by each of its names (lm_head.weight is tied to transformer.wte.weight).
    assert _param_grads_equal(cap, model, scalar) == len(dict(model.named_parameters(remove_duplicate=False)))
    # Two tokens or more: labels, and the model's own loss.
    code = main(["-q", "capture", "--model", f"hf:{saved['gpt2']}", "--text", "cat", "--text", "a dog",
                 "--target", "sum@loss", "--out", str(out)])
    assert code == 0 and "labels" in load_capture(out).model_inputs["kwargs"]
