"""Mutated Hugging Face caches for the tests and the fuzz: a valid cache of a tiny GPT-2 (its
snapshot's files links to blobs, as huggingface_hub lays them out), and seeded mutations of
the files the ``hf:`` loader reads.

Each mutation is one change to one of ``config.json`` (a value made odd, a key dropped,
``configuration_files`` and ``auto_map`` planted, its bytes damaged or grown), ``tokenizer.json``
and ``tokenizer_config.json`` (values, bytes, nesting), the safetensors header of
``model.safetensors`` (its length, dtypes, shapes and offsets lying, its bytes cut, a pickle
or a picture in its place), ``refs/main`` (no commit, a path, bytes), or of what a file is (a
FIFO, a folder, a link out of the cache, dangling or in a loop). ``name`` says what was done,
so that a failing case can be rebuilt from its seed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = "acme/fuzz"
SPEC = f"hf:{REPO}"
FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
ODD_VALUES: tuple[object, ...] = (
    None, -1, 0, 1, 3, 10**12, 2**63, 1e308, -1e308, 0.5, "text", "", [], {}, [1, 2], True, "gpt2", "bert",
    "x" * 100_000, {"a": [1, {"b": None}]},
)
CONFIG_KEYS = ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions", "n_inner", "model_type", "architectures",
               "dtype", "torch_dtype", "tie_word_embeddings", "id2label", "label2id", "bos_token_id",
               "eos_token_id", "activation_function", "layer_norm_epsilon", "transformers_version",
               "transformers_weights", "is_encoder_decoder", "use_cache", "scale_attn_weights", "num_labels")
TOKENIZER_CONFIG_KEYS = ("tokenizer_class", "model_max_length", "pad_token", "eos_token", "unk_token",
                         "added_tokens_decoder", "chat_template", "padding_side", "clean_up_tokenization_spaces",
                         "extra_special_tokens", "model_input_names")


@dataclass(frozen=True)
class Mutation:
    """One change to a valid cache: ``apply(snapshot, outside)`` makes it in a copy
    (``outside``: a folder beside the cache, for links that leave it)."""

    name: str
    apply: Callable[[Path, Path], None]


def valid_cache(home: Path) -> Path:
    """A tiny GPT-2 with its tokenizer in the Hugging Face cache under ``home`` (``HF_HOME``),
    its files links to blobs; returns the snapshot folder."""
    from tests import hf_hostile

    return hf_hostile.cached(home, REPO, blobs=True)


def snapshot_of(home: Path) -> Path:
    root = home / "hub" / ("models--" + REPO.replace("/", "--")) / "snapshots"
    return next(root.iterdir())


def _own(path: Path) -> bytes:
    """``path``'s bytes, the link to its blob replaced by a file of its own (so that a change
    is made to this file only)."""
    data = path.read_bytes()
    path.unlink()
    return data


def _write(path: Path, data: bytes) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_bytes(data)


def _edit_json(name: str, change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def run(snapshot: Path, outside: Path) -> None:
        value = json.loads(_own(snapshot / name))
        change(value)
        _write(snapshot / name, json.dumps(value).encode())
    return run


def _bytes(name: str, change: Callable[[bytearray, random.Random], None], seed: int) -> Callable[[Path, Path], None]:
    def run(snapshot: Path, outside: Path) -> None:
        data = bytearray(_own(snapshot / name))
        change(data, random.Random(seed))
        _write(snapshot / name, bytes(data))
    return run


def _flip(data: bytearray, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 32)):
        data[rng.randrange(len(data))] = rng.randrange(256)


def _cut(data: bytearray, rng: random.Random) -> None:
    del data[rng.randrange(0, max(1, len(data))):]


def _empty(data: bytearray, rng: random.Random) -> None:
    del data[:]


def _grow(data: bytearray, rng: random.Random) -> None:
    data[:0] = b" " * (17 << 20)  # larger than any config is read


def _not_utf8(data: bytearray, rng: random.Random) -> None:
    data[rng.randrange(len(data))] = 0xFF


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


def _config_value(rng: random.Random) -> Mutation:
    key = rng.choice(CONFIG_KEYS)
    value = rng.choice(ODD_VALUES)
    return Mutation(f"config.json {key} = {str(value)[:24]}", _edit_json("config.json", _set(key, value)))


def _configuration_files(rng: random.Random) -> Mutation:
    listed = rng.choice((["config.4.0.0.json"], ["config.99.0.0.json"], ["config.x.y.json"], ["config.json"],
                         ["../../../../outside/config.4.0.0.json"], "config.4.0.0.json", 5, [5], []))
    odd = rng.choice(ODD_VALUES)
    odd_key = rng.choice(CONFIG_KEYS)

    def run(snapshot: Path, outside: Path) -> None:
        config = json.loads((snapshot / "config.json").read_text())
        other = dict(config, **{odd_key: odd})
        _write(snapshot / "config.4.0.0.json", json.dumps(other).encode())
        (outside / "config.4.0.0.json").write_text(json.dumps(other))
        config["configuration_files"] = listed
        _write(snapshot / "config.json", json.dumps(config).encode())
    return Mutation(f"configuration_files = {str(listed)[:40]} ({odd_key} = {str(odd)[:16]})", run)


def _auto_map(rng: random.Random) -> Mutation:
    name = rng.choice(("config.json", "tokenizer_config.json"))
    value = rng.choice(({"AutoModel": "modeling_x.X"}, ["a.B", None], "x", {"AutoTokenizer": [None, "t.T"]}, {}, 5))
    return Mutation(f"{name} auto_map = {value}", _edit_json(name, _set("auto_map", value)))


def _tokenizer_config_value(rng: random.Random) -> Mutation:
    key = rng.choice(TOKENIZER_CONFIG_KEYS)
    value = rng.choice((*ODD_VALUES, "AutoTokenizer", "GPT2Tokenizer", "NoSuchTokenizer", "PreTrainedTokenizerFast",
                        10**30, {"content": 5}))
    return Mutation(f"tokenizer_config.json {key} = {str(value)[:24]}",
                    _edit_json("tokenizer_config.json", _set(key, value)))


def _tokenizer_json(rng: random.Random) -> Mutation:
    key = rng.choice(("model", "added_tokens", "pre_tokenizer", "normalizer", "post_processor", "decoder",
                      "version", "truncation", "padding"))
    value = rng.choice((*ODD_VALUES, {"type": "BPE"}, {"type": "WordLevel", "vocab": {"a": 10**12}},
                        {"type": "WordLevel", "vocab": "x"}, {"type": "NoSuch"}))
    return Mutation(f"tokenizer.json {key} = {str(value)[:24]}", _edit_json("tokenizer.json", _set(key, value)))


def _json_bytes(rng: random.Random, seed: int) -> Mutation:
    name = rng.choice(("config.json", "tokenizer.json", "tokenizer_config.json"))
    kind = rng.choice(("flip", "cut", "empty", "grow", "not utf-8", "deep 1000", "deep 100000", "deep 60"))
    if kind.startswith("deep"):
        depth = int(kind.split()[1])
        return Mutation(f"{name} nested {depth} deep",
                        lambda s, o: _write(s / name, _deep(depth).encode()))
    change = {"flip": _flip, "cut": _cut, "empty": _empty, "grow": _grow, "not utf-8": _not_utf8}[kind]
    return Mutation(f"{name} bytes: {kind} seed {seed}", _bytes(name, change, seed))


def _safetensors(rng: random.Random, seed: int) -> Mutation:
    kind = rng.choice(("length", "dtype", "shape", "offsets", "missing", "extra", "metadata", "not json", "deep",
                       "cut", "flip", "pickle", "picture"))

    def run(snapshot: Path, outside: Path) -> None:
        path = snapshot / "model.safetensors"
        data = _own(path)
        r = random.Random(seed)
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        body = data[8 + size:]
        names = [k for k in header if k != "__metadata__"]
        victim = r.choice(names)
        if kind == "length":
            lie = r.choice((0, 1, 7, size - 1, size + 1, len(data), 2**62, 2**64 - 1))
            _write(path, lie.to_bytes(8, "little") + data[8:])
            return
        if kind == "dtype":
            header[victim]["dtype"] = r.choice(("X", "F8", "", 5, None, "BOOL", "C64"))
        elif kind == "shape":
            header[victim]["shape"] = r.choice(([-1], [10**12, 10**12], [], [0], "x", [2**63], [1.5]))
        elif kind == "offsets":
            lo, hi = header[victim]["data_offsets"]
            header[victim]["data_offsets"] = r.choice(([hi, lo], [0, 0], [0, len(body) + 8], [-1, 4],
                                                       [lo, hi + 10**12], "x", [lo]))
        elif kind == "missing":
            del header[victim]
        elif kind == "extra":
            header["x.extra"] = {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4]}
        elif kind == "metadata":
            header["__metadata__"] = r.choice(({"format": "tf"}, {"format": 5}, "x", [1], {"a": {"b": 1}}))
        elif kind == "not json":
            raw = b"{not json" + b" " * (size - 9)
            _write(path, data[:8] + raw[:size] + body)
            return
        elif kind == "deep":
            raw = _deep(5000).encode()
            _write(path, len(raw).to_bytes(8, "little") + raw + body)
            return
        elif kind in ("cut", "flip"):
            grown = bytearray(data)
            (_cut if kind == "cut" else _flip)(grown, r)
            _write(path, bytes(grown))
            return
        elif kind == "pickle":
            import io

            import torch

            buffer = io.BytesIO()
            torch.save({"transformer.wte.weight": torch.zeros(2)}, buffer)
            _write(path, buffer.getvalue())
            return
        else:
            _write(path, b"\x89PNG\r\n\x1a\n" + bytes(64))
            return
        raw = json.dumps(header).encode()
        _write(path, len(raw).to_bytes(8, "little") + raw + body)
    return Mutation(f"model.safetensors header: {kind} seed {seed}", run)


def _refs(rng: random.Random) -> Mutation:
    value = rng.choice(("", "0" * 40 + "\n", "f" * 40, "../../../../outside", "/", "a" * 5000, "\x00", "\n\n",
                        "../snapshots/" + "0" * 40, "main", "\udcff"))

    def run(snapshot: Path, outside: Path) -> None:
        refs = snapshot.parent.parent / "refs" / "main"
        refs.write_bytes(value.encode("utf-8", "surrogateescape"))
    return Mutation(f"refs/main = {value[:24]!r}", run)


def _file_kind(rng: random.Random) -> Mutation:
    name = rng.choice(FILES)
    kind = rng.choice(("fifo", "folder", "link out", "dangling link", "link loop", "link to the cache root"))

    def run(snapshot: Path, outside: Path) -> None:
        path = snapshot / name
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "folder":
            path.mkdir()
        elif kind == "link out":
            target = outside / name
            target.write_text("root:x:0:0:root:/root:/bin/sh\n")
            os.symlink(target, path)
        elif kind == "dangling link":
            os.symlink(outside / "missing" / name, path)
        elif kind == "link loop":
            os.symlink(path, path)
        else:
            os.symlink(snapshot.parent.parent, path)
    return Mutation(f"{name} is a {kind}", run)


def _one(rng: random.Random, seed: int) -> Mutation:
    kind = rng.choice(("config", "config", "config", "configuration_files", "auto_map", "tokenizer_config",
                       "tokenizer_json", "json bytes", "json bytes", "safetensors", "safetensors", "refs",
                       "file kind"))
    if kind == "config":
        return _config_value(rng)
    if kind == "configuration_files":
        return _configuration_files(rng)
    if kind == "auto_map":
        return _auto_map(rng)
    if kind == "tokenizer_config":
        return _tokenizer_config_value(rng)
    if kind == "tokenizer_json":
        return _tokenizer_json(rng)
    if kind == "json bytes":
        return _json_bytes(rng, seed)
    if kind == "safetensors":
        return _safetensors(rng, seed)
    if kind == "refs":
        return _refs(rng)
    return _file_kind(rng)


def mutations(seed: int = 0, count: int = 500) -> list[Mutation]:
    """``count`` seeded mutations."""
    rng = random.Random(seed)
    return [_one(rng, seed * 1_000_003 + i) for i in range(count)]


def mutated(base: Path, mutation: Mutation, home: Path) -> Path:
    """A copy of the Hugging Face home ``base`` at ``home`` with ``mutation`` made; returns
    ``home``. A folder ``home/../outside`` receives what the mutation puts beside the cache."""
    if home.exists():
        shutil.rmtree(home)
    shutil.copytree(base, home, symlinks=True)
    outside = home.parent / "outside"
    if outside.exists():
        shutil.rmtree(outside)
    outside.mkdir()
    mutation.apply(snapshot_of(home), outside)
    return home
