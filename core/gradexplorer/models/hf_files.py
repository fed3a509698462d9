"""What a Hugging Face model folder holds, read and checked before transformers reads any of it.

transformers follows more than ``config.json`` (read in its 5.x source,
``configuration_utils.PreTrainedConfig.get_config_dict``, ``models/auto/*_auto.py``,
``modeling_utils._get_resolved_checkpoint_files``):

- ``configuration_files`` in ``config.json`` names other configs, one of which (picked by the
  installed version) replaces it;
- ``auto_map`` in any of the configs the Auto classes read (the model's, the tokenizer's
  ``tokenizer_config.json``, the processors' ``preprocessor_config.json`` and
  ``processor_config.json``...) names Python code of the repository, which loading runs;
- the weights are ``config.transformers_weights`` when set, else ``model.safetensors`` or the
  shards of ``model.safetensors.index.json``, else ``pytorch_model.bin`` or the shards of
  ``pytorch_model.bin.index.json``, whatever those shards are named.

This module reads all of them first, with bounds, so that trust is decided from everything
the loader would read: :func:`check_folder` (every file a regular file, and nothing in the
cache a link out of it), :func:`read_json` (a size and a nesting bound, errors in words),
:func:`code_references` (every ``auto_map``, wherever it sits) and :func:`weights_plan`
(the weights files, and what each is by its bytes, not its name).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradexplorer.base.errors import ModelLoadError
from gradexplorer.base.units import format_bytes

__all__ = ["CONFIG_LIMIT", "JSON_DEPTH_LIMIT", "WeightsPlan", "check_folder", "code_references", "read_json",
           "weights_plan"]

#: The largest JSON file read as a config or an index: configs are a few KiB, the index of a
#: model of a thousand shards under a MiB.
CONFIG_LIMIT = 16 << 20
#: The deepest nesting of a config: real ones nest a few levels (a sub-config's dict of
#: labels); Python's JSON reader, and transformers' copies of the dict, fail near a thousand.
JSON_DEPTH_LIMIT = 64

# The endings of the files the loader reads (configs, weights, tokenizers).
_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model", ".pkl", ".pt", ".pth", ".py", ".jinja")
_SAFE_WEIGHTS, _SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
_PICKLE_WEIGHTS, _PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def _special_kind(mode: int) -> str | None:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return None if stat.S_ISREG(mode) else "not a regular file"


def _inside(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:
        return False


def check_folder(folder: Path, spec: str, cache_root: Path | None = None) -> None:
    """Refuse a model folder one of whose files the loader cannot safely read.

    Parameters
    ----------
    folder : Path
        The ``save_pretrained`` folder, or the cache's snapshot.
    spec : str
        The user's ``hf:`` spec, for messages.
    cache_root : Path, optional
        For a model from the Hugging Face cache, its ``models--ORG--NAME`` folder: every
        link in the snapshot must lead into it (huggingface_hub links snapshots to blobs
        there, never elsewhere).

    Raises
    ------
    ModelLoadError
        A file is a named pipe, a device or a socket (reading it would wait forever or never
        end), a link to a missing file, or, in the cache, a link out of the model's folder
        (a planted link to ``/etc/passwd`` or ``/dev/zero``). The message names the file. In
        a folder of the user's own, only the files the loader reads are checked (configs,
        weights, tokenizer files) and links out of it are the user's to make.
    """
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise ModelLoadError(f"The folder of '{spec}' ('{folder}') cannot be read: {exc.strerror or exc}.",
                             "Check the folder's permissions.") from None
    root = os.path.realpath(cache_root) if cache_root is not None else None
    redo = (f"Download it again (remove '{cache_root}' first)" if cache_root is not None
            else "Save the model again with save_pretrained")
    for name in names:
        if root is None and not (name.endswith(_FILE_SUFFIXES) or name.startswith("tokenizer")):
            continue  # a folder of the user's own: only the files the loader reads are its business
        path = folder / name
        try:
            link = os.lstat(path)
        except OSError:
            continue  # gone meanwhile: the loader says so if it needs it
        if stat.S_ISLNK(link.st_mode):
            target = os.path.realpath(path)
            if root is not None and not _inside(target, root):
                raise ModelLoadError(
                    f"'{name}' in the Hugging Face cache of '{spec}' is a link out of the cache, to '{target}'; "
                    "huggingface_hub never makes such links.", f"{redo}.")
            try:
                info = os.stat(path)
            except OSError:
                raise ModelLoadError(f"'{name}' in '{folder}' is a link to a missing file ('{target}').",
                                     f"{redo}.") from None
        else:
            info = link
        kind = _special_kind(info.st_mode)
        if kind == "a folder" and not name.endswith(_FILE_SUFFIXES):
            continue  # a folder of the repository's own (onnx/, 1_Pooling/): not read by the loader
        if kind == "a folder":
            raise ModelLoadError(f"'{name}' in '{folder}' is a folder, not a file.", f"{redo}.")
        if kind is not None:
            raise ModelLoadError(f"'{name}' in '{folder}' is {kind}, not a file; reading it would never end.",
                                 f"{redo}.")


def check_snapshot(folder: Path, repo_folder: Path, name: str) -> None:
    """Refuse a cache snapshot that lies outside its model's ``snapshots`` folder: a
    ``refs/main`` that names a path (``../../../../elsewhere``) rather than a commit.

    Raises
    ------
    ModelLoadError
        Naming the folder the reference leads to.
    """
    snapshots = os.path.realpath(repo_folder / "snapshots")
    if not _inside(os.path.realpath(folder), snapshots):
        raise ModelLoadError(
            f"The Hugging Face cache's reference of '{name}' leads out of the cache, to '{folder}'; "
            "a reference names a commit, never a folder.",
            f"Download the model again (remove '{repo_folder}' first).")


def read_json(path: Path, what: str, limit: int = CONFIG_LIMIT) -> Any:
    """The JSON in ``path``, read up to ``limit`` bytes and at most :data:`JSON_DEPTH_LIMIT`
    levels deep.

    Parameters
    ----------
    path : Path
        A config, an index of shards.
    what : str
        How the file is named in messages ("the config.json of 'hf:acme/tiny'").
    limit : int
        The largest file read.

    Raises
    ------
    ModelLoadError
        The file is not a regular file, is larger than ``limit``, is not UTF-8 or not JSON,
        or nests deeper than the bound (Python's reader fails with a RecursionError near a
        thousand levels; transformers copies the dict, which fails sooner).
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ModelLoadError(f"{what} cannot be read: {exc.strerror or exc}.", "Check the file.") from None
    kind = _special_kind(info.st_mode)
    if kind is not None:
        raise ModelLoadError(f"{what} is {kind}, not a file.", "Save the model again with save_pretrained.")
    if info.st_size > limit:
        raise ModelLoadError(f"{what} is {format_bytes(info.st_size)}; a config is a few KiB, and gradexplorer "
                             f"reads one up to {format_bytes(limit)}.", "Check the file: it is no config.")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        value = json.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ModelLoadError(f"{what} cannot be read: {exc.strerror or exc}.", "Check the file.") from None
    except UnicodeDecodeError:
        raise ModelLoadError(f"{what} is not UTF-8 text.", "Save the model again with save_pretrained.") from None
    except RecursionError:
        raise ModelLoadError(f"{what} nests its values deeper than any config does (more than "
                             f"{JSON_DEPTH_LIMIT} levels).", "Check the file: it is no config.") from None
    except ValueError as exc:
        raise ModelLoadError(f"{what} is not valid JSON ({exc}).",
                             "Save the model again with save_pretrained.") from None
    if _depth(value) > JSON_DEPTH_LIMIT:
        raise ModelLoadError(f"{what} nests its values deeper than any config does (more than "
                             f"{JSON_DEPTH_LIMIT} levels).", "Check the file: it is no config.")
    return value


def _depth(value: Any) -> int:
    """How deep ``value`` nests, without recursion (a deep value must not exhaust the stack)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level > JSON_DEPTH_LIMIT:
            return level
        stack.extend((child, level + 1) for child in children)
    return deepest


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (dotted key path, value) of a dict's entries, however deep (no recursion)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        prefix, item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                path = f"{prefix}.{key}" if prefix else str(key)
                yield path, child
                stack.append((path, child))
        elif isinstance(item, list):
            stack.extend((f"{prefix}[{i}]", child) for i, child in enumerate(item))


def _plain_name(name: object) -> bool:
    """Whether ``name`` is a file of the folder itself (no folder part, no '..')."""
    return (isinstance(name, str) and bool(name) and name not in (".", "..") and "/" not in name
            and "\\" not in name and "\0" not in name)


def config_files(folder: Path, config: dict[str, Any], spec: str) -> list[str]:
    """The config files the loader may read, by name: ``config.json``, every file its
    ``configuration_files`` lists (transformers picks one by its own version: all are read
    here), and every other ``*config*.json`` of the folder (the tokenizer's, the processors',
    the generation config).

    Raises
    ------
    ModelLoadError
        ``configuration_files`` is not a list of file names in the folder.
    """
    names = ["config.json"]
    listed = config.get("configuration_files")
    if listed is not None:
        if not isinstance(listed, list) or not all(_plain_name(n) for n in listed):
            raise ModelLoadError(
                f"The config.json of '{spec}' lists configuration_files that are not file names of its folder "
                f"({str(listed)[:80]}).", "Save the model again with save_pretrained.")
        names += [n for n in listed if (folder / n).exists()]
    try:
        others = sorted(n for n in os.listdir(folder) if n.endswith(".json") and "config" in n)
    except OSError:
        others = []
    return list(dict.fromkeys(names + others))


def code_references(folder: Path, config: dict[str, Any], spec: str) -> list[str]:
    """Where the folder names Python code of its own, in words ("auto_map in
    config.4.0.0.json", "auto_map in tokenizer_config.json"): every ``auto_map`` with a value,
    at any depth, of every config the loader may read (:func:`config_files`).

    Parameters
    ----------
    folder : Path
    config : dict
        ``config.json`` as :func:`read_json` read it.
    spec : str
        The user's spec, for messages.

    Raises
    ------
    ModelLoadError
        A config cannot be read (:func:`read_json`).
    """
    found = []
    for name in config_files(folder, config, spec):
        value = config if name == "config.json" else read_json(folder / name, f"The {name} of '{spec}'")
        for path, item in _walk(value):
            if path.rsplit(".", 1)[-1] == "auto_map" and item not in (None, "", [], {}):
                found.append(f"auto_map in {name}" + ("" if path == "auto_map" else f" (at {path})"))
    return found


@dataclass(frozen=True)
class WeightsPlan:
    """The weights files ``from_pretrained`` would read, in its own order of preference.

    Attributes
    ----------
    files : tuple of Path
        The files (a single file, or an index's shards); empty when the folder has none.
    safetensors : bool
        Whether they are read as safetensors (``use_safetensors=True``) rather than with
        ``torch.load``.
    source : str
        Where the list came from, in words ("model.safetensors", "the shards of
        pytorch_model.bin.index.json").
    """

    files: tuple[Path, ...]
    safetensors: bool
    source: str


def _shards(folder: Path, index: str, spec: str) -> tuple[Path, ...]:
    data = read_json(folder / index, f"The {index} of '{spec}'")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"The {index} of '{spec}' has no weight_map of shards.",
                             "Save the model again with save_pretrained.")
    names = list(dict.fromkeys(weight_map.values()))
    bad = [n for n in names if not _plain_name(n)]
    if bad:
        raise ModelLoadError(f"The {index} of '{spec}' names a shard outside its folder ({str(bad[0])[:80]}).",
                             "Save the model again with save_pretrained.")
    return tuple(folder / n for n in names)


def weights_plan(folder: Path, config: dict[str, Any], spec: str) -> WeightsPlan:
    """The weights files transformers' ``from_pretrained`` would read from ``folder``.

    Raises
    ------
    ModelLoadError
        ``transformers_weights`` or an index names a file outside the folder, or an index
        cannot be read.
    """
    explicit = config.get("transformers_weights")
    if explicit is not None:
        if not _plain_name(explicit):
            raise ModelLoadError(f"The config.json of '{spec}' names weights outside its folder "
                                 f"(transformers_weights: {str(explicit)[:80]}).",
                                 "Save the model again with save_pretrained.")
        if str(explicit).endswith(".index.json"):
            return WeightsPlan(_shards(folder, explicit, spec), True, f"the shards of {explicit}")
        return WeightsPlan((folder / explicit,), str(explicit).endswith(".safetensors"), str(explicit))
    for name, index, safe in ((_SAFE_WEIGHTS, _SAFE_INDEX, True), (_PICKLE_WEIGHTS, _PICKLE_INDEX, False)):
        if (folder / name).is_file():
            return WeightsPlan((folder / name,), safe, name)
        if (folder / index).is_file():
            return WeightsPlan(_shards(folder, index, spec), safe, f"the shards of {index}")
    return WeightsPlan((), True, "")
