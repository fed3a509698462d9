"""A Hugging Face model's size told from its config, before anything of it is built.

transformers builds a model from its config and then fills in the weights; a config that
declares 38 GB of parameters (or a million layers) allocates all of it, or spends minutes
making modules, before any file says otherwise. :func:`check_model_fits` counts the
parameters first, the way the capture's estimate tells a forward's memory: the model is
built on the meta device, where tensors have sizes but no memory.

Building is cheap on the meta device except for the modules themselves: a million layers
are a million Python objects. Counts that make modules (layers, experts, blocks, stage
depths) above :data:`BUILT_AS_IS` are therefore built at two small values each and the size
extrapolated to the declared ones, multilinearly (exact for a model whose size is a sum over
its layers and their experts, which is what such counts mean).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gradexplorer.base import tensor_memory
from gradexplorer.base.errors import ModelLoadError
from gradexplorer.base.units import format_bytes

__all__ = ["BUILT_AS_IS", "BUILT_TO_COUNT", "ModelTooLarge", "check_model_fits", "estimated_bytes"]

#: Counts of modules up to this are built as they are.
BUILT_AS_IS = 16
#: Counts up to this are built as they are when copies with fewer cannot be (a config's own
#: rules may refuse them); larger ones are then refused, their size untold.
BUILT_TO_COUNT = 512
# A larger count is built at these two values, and the size extrapolated from them.
_LOW, _HIGH = 8, 16
# At most this many large counts are varied together (2**3 builds); any further ones add
# their own share, each varied alone.
_JOINT = 3
# The keys of a config whose integer values count modules: num_hidden_layers, n_layer,
# encoder_layers, num_decoder_layers, num_experts, n_routed_experts, num_blocks, depths.
_COUNT_KEY = re.compile(r"(layers?|experts|blocks|depths?)$")

KeyPath = tuple[Any, ...]


class ModelTooLarge(ModelLoadError):
    """A model's parameters, counted from its config, need more memory than the budget holds."""


def _counts(value: dict[str, Any], prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, int]]:
    """The (key path, value) of every large count of modules in a config's dict, sub-configs
    (``text_config``...) and per-stage lists (Swin's ``depths``) included."""
    for key, item in value.items():
        path = (*prefix, key)
        if isinstance(item, dict):
            yield from _counts(item, path)
        elif isinstance(item, bool) or not _COUNT_KEY.search(str(key)):
            continue
        elif isinstance(item, int) and item > BUILT_AS_IS:
            yield path, item
        elif isinstance(item, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in item):
            yield from (((*path, i), x) for i, x in enumerate(item) if x > BUILT_AS_IS)


def _with_counts(config: dict[str, Any], values: dict[KeyPath, int], declared: dict[KeyPath, int]) -> dict[str, Any]:
    """A copy of ``config`` with each count at ``values``; lists beside a count that have one
    entry per module (``layer_types``) cut to the new count."""
    import copy

    out = copy.deepcopy(config)
    for path, value in values.items():
        holder = out
        for key in path[:-1]:
            holder = holder[key]
        old = declared[path]
        holder[path[-1]] = value
        if isinstance(holder, dict):
            for key, item in list(holder.items()):
                if key != path[-1] and isinstance(item, list) and len(item) == old:
                    holder[key] = item[:value]
    return out


def _meta_bytes(module: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += math.prod(int(s) for s in tensor.shape) * tensor.element_size()
    return total


def estimated_bytes(config: dict[str, Any], build: Callable[[dict[str, Any]], torch.nn.Module]) -> int | None:
    """The bytes of a model's parameters and buffers, told from ``config`` on the meta device.

    Parameters
    ----------
    config : dict
        The model's config as a dict (``PreTrainedConfig.to_dict()``).
    build : callable
        ``build(config_dict)``: the model of a config dict; called under
        ``torch.device("meta")``.

    Returns
    -------
    int or None
        Exact when no count of modules exceeds :data:`BUILT_AS_IS`; otherwise extrapolated
        from copies with fewer modules. None when the model cannot be built from ``config``
        as it is (its class does not fit it): building it for real fails the same way, and
        says why, allocating nothing.

    Raises
    ------
    ModelLoadError
        A copy with fewer modules cannot be built, while the config declares more than
        :data:`BUILT_TO_COUNT` (its error said).
    """
    declared = dict(_counts(config))

    def size(values: dict[KeyPath, int]) -> int:
        with torch.device("meta"):
            return _meta_bytes(build(_with_counts(config, values, declared)))

    def as_declared() -> int | None:
        try:
            with torch.device("meta"):
                return _meta_bytes(build(config))
        except Exception:  # noqa: BLE001 - a class that does not fit the config: from_pretrained says so
            return None

    if not declared:
        return as_declared()
    paths = sorted(declared, key=lambda p: -declared[p])
    joint, alone = paths[:_JOINT], paths[_JOINT:]
    base = dict.fromkeys(paths, _LOW)
    try:
        total = 0.0
        for corner in itertools.product((_LOW, _HIGH), repeat=len(joint)):
            values = {**base, **dict(zip(joint, corner))}
            weight = 1.0
            for p, at in zip(joint, corner):
                t = declared[p]
                weight *= (_HIGH - t) / (_HIGH - _LOW) if at == _LOW else (t - _LOW) / (_HIGH - _LOW)
            total += weight * size(values)
        low = size(base) if alone else 0
        for p in alone:
            total += (declared[p] - _LOW) * (size({**base, p: _HIGH}) - low) / (_HIGH - _LOW)
    except Exception as exc:
        if max(declared.values()) <= BUILT_TO_COUNT:
            # A config whose copies its own rules refuse (a count of shared layers that must
            # stay below the number of layers): built as it is, which this many modules allow.
            return as_declared()
        names = ", ".join(f"{'.'.join(map(str, p))} = {declared[p]:,}" for p in paths[:3])
        raise ModelLoadError(
            f"The config declares {names}, and its size could not be told from a copy with fewer "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}).",
            "Check the config's counts of layers and experts.",
        ) from exc
    return max(0, round(total))


def check_model_fits(config: dict[str, Any], build: Callable[[dict[str, Any]], torch.nn.Module], what: str,
                     budget: int | None = None) -> int | None:
    """Refuse a model whose parameters and buffers need more than the memory budget.

    Parameters
    ----------
    config : dict
        The model's config as a dict.
    build : callable
        ``build(config_dict)``, as for :func:`estimated_bytes`.
    what : str
        The model in words ("'hf:acme/big' (GPT2LMHeadModel)").
    budget : int, optional
        Bytes (``--memory-budget``); by default half the free RAM
        (``gradexplorer.base.tensor_memory.read_budget``).

    Returns
    -------
    int or None
        The bytes told (None: not told, :func:`estimated_bytes`).

    Raises
    ------
    ModelTooLarge
        With the size, the budget and where the budget came from.
    ModelLoadError
        The size cannot be told (:func:`estimated_bytes`).
    """
    need = estimated_bytes(config, build)
    limit = tensor_memory.read_budget(budget)
    if need is not None and limit is not None and need > limit:
        source = "set by --memory-budget" if budget is not None else "half of the free RAM"
        raise ModelTooLarge(
            f"{what} needs {format_bytes(need)} for its parameters once built (told from its config), but the "
            f"memory budget is {format_bytes(limit)} ({source});",
            "choose a smaller model, or raise --memory-budget if this machine has the memory.",
        )
    return need
