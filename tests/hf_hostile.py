"""Hostile Hugging Face models in a cache built offline: tiny models (``tests/hf_tiny.py``)
whose configs name code of their own by every route transformers follows, whose weights are
pickles under other names, whose files are FIFOs or links out of the cache.

The planted code writes a marker file when it runs: its absence proves nothing ran.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from tests import hf_tiny

REV = "0" * 40


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def plant_code(snapshot: Path, marker: Path) -> None:
    """``modeling_evil.py``, ``configuration_evil.py`` and ``tokenization_evil.py``: each
    writes ``marker`` when imported, then defines a working class (so that, trusted, the
    load goes on)."""
    write = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (snapshot / "modeling_evil.py").write_text(write + "from transformers import GPT2Model as EvilModel\n")
    (snapshot / "configuration_evil.py").write_text(write + "from transformers import GPT2Config as EvilConfig\n")
    (snapshot / "tokenization_evil.py").write_text(
        write + "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")


def cached(home: Path, repo: str, kind: str = "gpt2", blobs: bool = False) -> Path:
    """A tiny model saved in the Hugging Face cache under ``home`` (``HF_HOME``); its snapshot.
    With ``blobs``, laid out as huggingface_hub lays it: each snapshot file a relative link to
    ``blobs/<sha256>``."""
    snapshot = hf_tiny.save_in_cache(kind, home, repo=repo, rev=REV)
    if blobs:
        import hashlib

        store = snapshot.parent.parent / "blobs"
        store.mkdir(exist_ok=True)
        for file in sorted(snapshot.iterdir()):
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            file.rename(store / digest)
            os.symlink(Path("..", "..", "blobs", digest), file)
    return snapshot


def configuration_files_route(snapshot: Path, marker: Path) -> None:
    """The issue's route: ``config.json`` lists ``config.4.0.0.json``, which transformers
    reads instead, and whose ``auto_map`` names the code; the model type is one the Auto
    classes do not map to a class of their own, so transformers would ask on the terminal."""
    plant_code(snapshot, marker)
    config = json.loads((snapshot / "config.json").read_text())
    config.pop("architectures", None)
    other = dict(config, model_type="blip_text_model", auto_map={"AutoModel": "modeling_evil.EvilModel"})
    (snapshot / "config.4.0.0.json").write_text(json.dumps(other))
    config["configuration_files"] = ["config.4.0.0.json"]
    (snapshot / "config.json").write_text(json.dumps(config))


def tokenizer_config_route(snapshot: Path, marker: Path) -> None:
    """``auto_map`` in ``tokenizer_config.json`` only."""
    plant_code(snapshot, marker)
    edit_json(snapshot / "tokenizer_config.json",
              lambda c: c.update(auto_map={"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]},
                                 tokenizer_class="EvilTokenizer"))


def preprocessor_config_route(snapshot: Path, marker: Path) -> None:
    """``auto_map`` in ``preprocessor_config.json`` only (an image processor of its own)."""
    plant_code(snapshot, marker)
    (snapshot / "preprocessor_config.json").write_text(json.dumps(
        {"auto_map": {"AutoImageProcessor": "modeling_evil.EvilModel"}, "image_processor_type": "EvilProcessor"}))


def nested_route(snapshot: Path, marker: Path) -> None:
    """``auto_map`` inside a sub-config of ``config.json``."""
    plant_code(snapshot, marker)
    edit_json(snapshot / "config.json",
              lambda c: c.update(text_config={"auto_map": {"AutoModel": "modeling_evil.EvilModel"}}))


ROUTES = {
    "configuration_files": configuration_files_route,
    "tokenizer_config": tokenizer_config_route,
    "preprocessor_config": preprocessor_config_route,
    "nested": nested_route,
}


def pickled_shard(snapshot: Path) -> Path:
    """The safetensors file replaced by ``pytorch_model.bin.index.json`` whose shard is
    ``weights.pkl`` (a torch.save pickle under a name no rule of names catches)."""
    state = {k: v.contiguous() for k, v in hf_tiny.gpt2().state_dict().items()}
    (snapshot / "model.safetensors").unlink()
    torch.save(state, snapshot / "weights.pkl")
    (snapshot / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": dict.fromkeys(state, "weights.pkl")}))
    return snapshot / "weights.pkl"


def link_out(snapshot: Path, name: str, target: Path) -> None:
    """``name`` in the snapshot replaced by a link to ``target``, outside the cache."""
    (snapshot / name).unlink()
    os.symlink(target, snapshot / name)
