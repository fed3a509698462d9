"""Hostile Hugging Face and timm models from a local cache: code named by any config the
loader follows never runs without trust (not even with "y" on stdin), pickled weights under
any name need trust, files that are FIFOs or links out of the cache are named, a model too
large for the budget is refused from its config before anything is built, and every failure
is one message (exit 1), never an internal error (exit 70).

Planted code writes a marker file when it runs: its absence proves nothing ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gradexplorer.base.errors import BatchError, ModelLoadError, TrustRequired
from gradexplorer.batches import load_batch
from gradexplorer.models import load_model
from gradexplorer_app.cli.main import main
from tests import hf_hostile, hf_tiny

pytest.importorskip("transformers")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """An empty Hugging Face home under tmp_path, offline."""
    return hf_tiny.offline_home(monkeypatch, tmp_path / "hf_home")


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    return lines[-1]


# -- 1. trust from everything the loader reads ------------------------------------------------


@pytest.mark.parametrize("route", list(hf_hostile.ROUTES))
def test_code_named_by_any_config_never_runs_without_trust_even_with_y_on_stdin(offline, tmp_path, monkeypatch,
                                                                                 route):
    marker = tmp_path / "code-ran"
    snapshot = hf_hostile.cached(offline, "acme/evil")
    hf_hostile.ROUTES[route](snapshot, marker)
    # transformers' prompt reads sys.stdin: "y" is waiting there.
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 20))
    with pytest.raises(TrustRequired, match=r"code of its own .*auto_map in") as info:
        load_model("hf:acme/evil")
    assert not marker.exists(), marker.read_text()
    assert "[y/N]" not in str(info.value)


def test_with_trust_the_configuration_files_route_does_run_the_code(offline, tmp_path):
    """The control: the planted code is real, and trust is what lets it run."""
    marker = tmp_path / "code-ran"
    snapshot = hf_hostile.cached(offline, "acme/evil")
    hf_hostile.configuration_files_route(snapshot, marker)
    with contextlib.suppress(ModelLoadError):  # the planted class does not fit the config it names
        load_model("hf:acme/evil", trust=True)
    assert marker.exists()


@pytest.mark.slow
def test_the_command_line_never_asks_with_y_on_stdin(offline, tmp_path):
    """The issue's command, in a process of its own with "y" on its stdin."""
    marker = tmp_path / "code-ran"
    snapshot = hf_hostile.cached(offline, "acme/cfgfiles")
    hf_hostile.configuration_files_route(snapshot, marker)
    env = dict(os.environ, HF_HOME=str(offline), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-m", "gradexplorer", "capture", "--model", "hf:acme/cfgfiles", "--text", "the cat",
         "--out", str(tmp_path / "x.pt")],
        input="y\n", capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "[y/N]" not in said and "custom code" not in said
    assert "auto_map in config.4.0.0.json" in _one_error_line(done.stderr) and "--trust" in done.stderr
    assert not marker.exists() and not (tmp_path / "x.pt").exists()


def test_every_transformers_call_passes_the_users_trust(offline, tmp_path, monkeypatch):
    """transformers asks on the terminal only when trust_remote_code is left out (None): every
    from_pretrained of the loader (config, model, tokenizer, image processor) passes it."""
    import transformers

    folder = hf_tiny.save("vit", tmp_path / "vit")
    hf_tiny.tokenizer().save_pretrained(folder)
    seen: dict[str, object] = {}

    def spy(owner):
        real = owner.from_pretrained

        def from_pretrained(*args, **kwargs):
            seen[owner.__name__] = kwargs.get("trust_remote_code", "left out")
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, "from_pretrained", from_pretrained)

    for owner in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoImageProcessor,
                  transformers.ViTForImageClassification):
        spy(owner)
    load_model(f"hf:{folder}")
    assert seen == {"AutoConfig": False, "AutoTokenizer": False, "AutoImageProcessor": False,
                    "ViTForImageClassification": False}


# -- 4. pickles by what a file is ------------------------------------------------------------


def test_a_pickled_shard_under_any_name_needs_trust(offline):
    snapshot = hf_hostile.cached(offline, "acme/pickled")
    shard = hf_hostile.pickled_shard(snapshot)
    with pytest.raises(TrustRequired, match=r"'weights\.pkl' is a pickle") as info:
        load_model("hf:acme/pickled")
    assert "pickled weights" in info.value.subject
    loaded = load_model("hf:acme/pickled", trust=True)
    state = torch.load(shard, weights_only=True)
    own = loaded.module.state_dict()
    assert all(torch.equal(own[k], v) for k, v in state.items())


def test_a_safetensors_name_on_a_pickle_is_said_for_what_it_is(offline):
    snapshot = hf_hostile.cached(offline, "acme/renamed")
    torch.save({"w": torch.zeros(2)}, snapshot / "model.safetensors")
    for trust in (False, True):
        with pytest.raises(ModelLoadError, match=r"'model\.safetensors' .* is a pickle, not a safetensors file"):
            load_model("hf:acme/renamed", trust=trust)


def test_weights_named_by_the_config_are_judged_by_their_bytes(offline):
    """config.transformers_weights names the file transformers reads; a pickle there needs trust."""
    snapshot = hf_hostile.cached(offline, "acme/explicit")
    torch.save(hf_tiny.gpt2().state_dict(), snapshot / "adapter_model.bin")
    hf_hostile.edit_json(snapshot / "config.json", lambda c: c.update(transformers_weights="adapter_model.bin"))
    with pytest.raises(TrustRequired, match=r"adapter_model\.bin"):
        load_model("hf:acme/explicit")


def test_torchs_advice_to_load_unsafely_and_its_escapes_never_reach_the_user(offline):
    """A trusted pickled shard holding a global torch does not allow: torch's refusal offers
    "two options", weights_only=False among them, in bold (ANSI escapes)."""
    import pathlib

    snapshot = hf_hostile.cached(offline, "acme/odd")
    hf_hostile.pickled_shard(snapshot)
    torch.save({"transformer.wte.weight": torch.zeros(16, 32), "where": pathlib.PurePosixPath("/x")},
               snapshot / "weights.pkl")
    with pytest.raises(ModelLoadError) as info:
        load_model("hf:acme/odd", trust=True)
    text = str(info.value)
    assert "\x1b" not in text and "weights_only=False" not in text and "two options" not in text, text


def test_timm_cached_pickle_refusal_names_the_global_without_unsafe_advice(offline, tmp_path, capsys):
    timm = pytest.importorskip("timm")
    marker = tmp_path / "code-ran"
    repo = timm.models.get_pretrained_cfg("resnet18").hf_hub_id
    folder = offline / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "snapshots" / hf_hostile.REV).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(hf_hostile.REV)

    class Runs:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"fc.bias": Runs()}, folder / "snapshots" / hf_hostile.REV / "pytorch_model.bin")
    assert main(["capture", "--model", "timm:resnet18", "--weights", "DEFAULT", "--random",
                 "--out", str(tmp_path / "x.pt")]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "posix.system" in line and "weights_only=False" not in line and "retry" not in line
    assert not marker.exists()


# -- 5. every failure a message, never exit 70 -----------------------------------------------


def _deep(snapshot: Path) -> None:
    (snapshot / "config.json").write_text("[" * 100_000 + "]" * 100_000)


def _architectures(name: str):
    return lambda snapshot: hf_hostile.edit_json(snapshot / "config.json", lambda c: c.update(architectures=[name]))


@pytest.mark.parametrize(("case", "change", "extra", "said"), [
    ("deep", _deep, [], "nests its values deeper"),
    ("arch-tokenizer", _architectures("AutoTokenizer"), [], None),
    ("arch-generation", _architectures("GenerationConfig"), [], None),
    ("arch-config", _architectures("AutoConfig"), [], None),
    ("hf-class-tokenizer", None, ["--hf-class", "AutoTokenizer"], "not a model class"),
    ("hf-class-config", None, ["--hf-class", "AutoConfig"], "not a model class"),
])
def test_hub_cases_that_ended_in_an_internal_error_are_one_message(offline, tmp_path, capsys, case, change, extra,
                                                                   said):
    snapshot = hf_hostile.cached(offline, f"acme/{case}")
    if change is not None:
        change(snapshot)
    code = main(["-q", "capture", "--model", f"hf:acme/{case}", "--text", "the cat", *extra,
                 "--out", str(tmp_path / "x.pt")])
    err = capsys.readouterr().err
    if said is None:
        # An architectures entry that names no model class is passed over: AutoModel builds it.
        assert code == 0, err
        return
    assert code == 1
    assert said in _one_error_line(err)


def test_a_name_longer_than_any_path_is_one_message(offline, tmp_path, capsys):
    assert main(["capture", "--model", "hf:" + "a" * 5000, "--text", "the cat", "--out", str(tmp_path / "x.pt")]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "is not a Hugging Face model name" in line and len(line) < 600


def test_timm_unknown_tag_and_lying_header_are_one_message(offline, tmp_path, capsys):
    timm = pytest.importorskip("timm")
    assert main(["capture", "--model", "timm:resnet18.no_such_tag", "--random", "--out", str(tmp_path / "x.pt")]) == 1
    assert "not a pretrained tag of the timm model 'resnet18'" in _one_error_line(capsys.readouterr().err)
    repo = timm.models.get_pretrained_cfg("resnet18").hf_hub_id
    folder = offline / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "snapshots" / hf_hostile.REV).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(hf_hostile.REV)
    header = json.dumps({"fc.weight": {"dtype": "F32", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 16]}})
    (folder / "snapshots" / hf_hostile.REV / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header.encode() + bytes(16))
    assert main(["capture", "--model", "timm:resnet18", "--weights", "DEFAULT", "--random",
                 "--out", str(tmp_path / "x.pt")]) == 1
    assert "cannot be read as safetensors" in _one_error_line(capsys.readouterr().err)


def test_weights_that_do_not_fit_the_config_are_named_not_reinitialised(offline):
    """transformers 5 reports shapes that differ in a table of its own (in colour) and
    raises; the loader names them."""
    snapshot = hf_hostile.cached(offline, "acme/shapes")
    hf_hostile.edit_json(snapshot / "config.json", lambda c: c.update(n_positions=3))
    with pytest.raises(ModelLoadError, match=r"do not fit the model its config\.json builds: "
                                             r"transformer\.wpe\.weight is 32x32 in the weights, 3x32 in the model"):
        load_model("hf:acme/shapes")


def test_messages_are_plain_text():
    from gradexplorer.base.errors import GradExplorerError

    exc = GradExplorerError("the file '\x1b]0;owned\x07a\x1b[31mb\x1b[0m.pt' is bad\x07;", "fix \x1b[2Jit")
    assert exc.problem == "the file 'ab.pt' is bad;" and exc.fix == "fix it"


# -- clear names: broken tokenizers, FIFOs, links out of the cache ----------------------------


def test_a_tokenizer_linked_out_of_the_cache_is_named(offline, tmp_path):
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("root:x:0:0\n")
    snapshot = hf_hostile.cached(offline, "acme/linked")
    hf_hostile.link_out(snapshot, "tokenizer.json", secret)
    with pytest.raises(ModelLoadError, match=r"'tokenizer\.json' .* link out of the cache, to '.*secret\.txt'"):
        load_model("hf:acme/linked")


def test_a_malformed_tokenizer_is_named_when_text_is_given(tmp_path):
    folder = hf_tiny.save("gpt2", tmp_path / "gpt2")
    (folder / "tokenizer.json").write_text("{not json")
    loaded = load_model(f"hf:{folder}")
    assert loaded.tokenizer is None and "tokenizer.json" in loaded.tokenizer_problem
    with pytest.raises(BatchError, match=r"has tokenizer files, but its tokenizer .* cannot be read"):
        load_batch(["text:the cat"], loaded)


def test_a_config_that_is_a_fifo_is_named(offline):
    snapshot = hf_hostile.cached(offline, "acme/fifo")
    (snapshot / "config.json").unlink()
    os.mkfifo(snapshot / "config.json")
    with pytest.raises(ModelLoadError, match=r"'config\.json' .* is a named pipe \(FIFO\)"):
        load_model("hf:acme/fifo")


def test_a_reference_that_leads_out_of_the_cache_is_refused(offline, tmp_path):
    snapshot = hf_hostile.cached(offline, "acme/refs")
    hf_tiny.copy(snapshot, tmp_path / "outside" / "snap")
    (snapshot.parent.parent / "refs" / "main").write_text("../../../../outside/snap")
    with pytest.raises(ModelLoadError, match="reference of 'acme/refs' leads out of the cache"):
        load_model("hf:acme/refs")


# -- 3. memory known before it is spent ---------------------------------------------------------


def _gpt2_config(**changes) -> dict:
    config = hf_tiny.gpt2().config.to_dict()
    config.update(changes)
    return config


@pytest.mark.parametrize("changes", [{"n_layer": 20}, {"n_layer": 40, "n_embd": 16}])
def test_the_size_told_from_a_smaller_copy_is_the_built_models(changes):
    """The extrapolated size of a model of many layers against the model itself, built."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from gradexplorer.models.hf_size import estimated_bytes

    config = _gpt2_config(**changes)
    built = GPT2LMHeadModel(GPT2Config.from_dict(config))
    truth = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                                                       [*built.parameters(), *built.buffers()]}.values())
    told = estimated_bytes(config, lambda values: GPT2LMHeadModel._from_config(GPT2Config.from_dict(values)))
    assert told == truth


def test_an_encoder_decoders_two_counts_are_told_exactly():
    from transformers import T5Config, T5ForConditionalGeneration

    from gradexplorer.models.hf_size import estimated_bytes

    config = hf_tiny.t5().config.to_dict()
    config.update(num_layers=20, num_decoder_layers=18)
    built = T5ForConditionalGeneration(T5Config.from_dict(config))
    truth = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                                                       [*built.parameters(), *built.buffers()]}.values())
    told = estimated_bytes(config, lambda v: T5ForConditionalGeneration._from_config(T5Config.from_dict(v)))
    assert told == truth


# Run in a process of its own, under an address-space cap of what it holds after its imports
# plus 1 GiB: a model that were built, or a file read whole, would fail to allocate instead
# of being refused.
_CAPPED = textwrap.dedent("""
    import json, resource, sys
    import torch, transformers
    from gradexplorer.models import load_model
    from gradexplorer.batches import load_batch
    from gradexplorer.base.errors import GradExplorerError

    def vm_size():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))

    cap = vm_size() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        exec(sys.argv[1])
        outcome = "done"
    except GradExplorerError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:
        outcome = f"FAILED {type(exc).__name__}: {str(exc)[:300]}"
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    print(json.dumps({"outcome": outcome, "grown": grown}))
""")


def _capped(code: str, home: Path) -> dict:
    # Threads pinned: each takes address space (a stack, a malloc arena), so the cap must
    # not depend on how many cores the machine has.
    env = dict(os.environ, HF_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="2",
               MKL_NUM_THREADS="2", NUMBA_NUM_THREADS="2", MALLOC_ARENA_MAX="2")
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _CAPPED, code], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(("repo", "changes"), [
    # 9.5 billion parameters: 38 GB in float32, and no weights file at all.
    ("acme/huge", {"n_embd": 8192, "n_head": 64, "n_layer": 8, "vocab_size": 370_000}),
    ("acme/deep-layers", {"n_layer": 1_000_000}),
])
def test_a_model_too_large_is_refused_from_its_config_under_an_address_space_cap(offline, repo, changes):
    snapshot = hf_hostile.cached(offline, repo)
    hf_hostile.edit_json(snapshot / "config.json", lambda c: c.update(changes))
    if repo == "acme/huge":
        (snapshot / "model.safetensors").unlink()
    result = _capped(f"load_model('hf:{repo}', memory_budget=4 << 30)", offline)
    assert result["outcome"].startswith("ModelTooLarge:"), result
    assert "memory budget is 4.0 GiB" in result["outcome"]
    assert result["grown"] < 1 << 30


@pytest.mark.slow
def test_a_3_gb_text_file_is_refused_by_its_size_without_being_read(offline, tmp_path):
    folder = hf_tiny.save("gpt2", tmp_path / "gpt2")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: 3 GB declared, nothing written
        f.truncate(3 << 30)
    code = (f"loaded = load_model('hf:{folder}')\n"
            f"load_batch(['text:{big}'], loaded, memory_budget=8 << 30)")
    result = _capped(code, offline)
    assert result["outcome"].startswith("BatchError: the text file"), result
    assert "memory budget is 8.0 GiB" in result["outcome"]
    assert result["grown"] < 1 << 30


def test_a_text_batch_too_large_for_the_budget_is_refused_before_tokenising(tmp_path):
    folder = hf_tiny.save("gpt2", tmp_path / "gpt2")
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(" ".join(hf_tiny.WORDS[:10]) for _ in range(200_000)))
    loaded = load_model(f"hf:{folder}")
    # The file's 7.4 MiB fit 4 GiB as tokens; its 200,000 samples padded to the longest do not.
    with pytest.raises(BatchError, match=r"200,000 text samples .* memory budget is 4\.0 GiB"):
        load_batch([f"text:{lines}"], loaded, memory_budget=4 << 30)
    with pytest.raises(BatchError, match=r"lines\.txt' is 7\.4 MiB: as tokens it could take 3\.7 GiB, but the "
                                         r"memory budget is 256 MiB"):
        load_batch([f"text:{lines}"], loaded, memory_budget=256 << 20)
    assert load_batch(["text:the cat sat"], loaded, memory_budget=256 << 20).tensor.shape == (1, 3)


def test_a_config_whose_copies_its_rules_refuse_is_built_as_it_is():
    """A config that refuses fewer layers than it declares (here: a rule of the builder) is
    counted from the model as declared, when that many layers can be built."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from gradexplorer.models.hf_size import estimated_bytes

    def build(values):
        if values["n_layer"] < 20:
            raise ValueError("this config needs at least 20 layers")
        return GPT2LMHeadModel._from_config(GPT2Config.from_dict(values))

    config = _gpt2_config(n_layer=24)
    built = GPT2LMHeadModel(GPT2Config.from_dict(config))
    assert estimated_bytes(config, build) == sum(p.numel() * 4 for p in built.parameters())
    with pytest.raises(ModelLoadError, match="n_layer = 1,000,000, and its size could not be told"):
        estimated_bytes(_gpt2_config(n_layer=1_000_000), build)
