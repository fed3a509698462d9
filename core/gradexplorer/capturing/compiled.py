"""Models under ``torch.compile``: hooks added to a compiled model that has already run
never fire (dynamo runs its traced graph), so a capture would record 0 calls.

A compiled root is captured through its eager module, ``compiled._orig_mod``: the same
parameters and the same names, hooks that fire, numbers of the uncompiled model. A
compiled submodule cannot be swapped without changing the user's model, so layers inside
one are refused in words.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from torch import nn

from gradexplorer.base.errors import GradExplorerError

__all__ = ["ORIG_PREFIX", "compiled_modules", "eager_root", "refuse_compiled_layers"]

#: The prefix ``torch.compile``'s wrapper puts before the eager module's names.
ORIG_PREFIX = "_orig_mod."


def _optimized_module() -> type | None:
    """The class of ``torch.compile``'s wrapper, when anything in this process can be one.

    A compiled module exists only once dynamo is imported (``torch.compile`` imports it, and
    unpickling one imports its class), so it is looked up, never imported: importing dynamo
    imports sympy and Triton, hundreds of MiB and seconds of every capture that compiled nothing
    (docs/benchmarks.md, "Start-up").
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None) if eval_frame is not None else None


def compiled_modules(model: nn.Module,
                     of_type: Callable[[type], list[tuple[str, nn.Module]]] | None = None) -> list[str]:
    """Qualified names of the modules wrapped by ``torch.compile`` (the root is ``""``).
    ``of_type``: the (name, module) pairs of a type in the model, when known without a
    walk (``gradexplorer.capturing.structure.ModelStructure.of_type``, which leaves the
    root out)."""
    kind = _optimized_module()
    if kind is None:
        return []
    if of_type is not None:
        return ([""] if isinstance(model, kind) else []) + [name for name, _ in of_type(kind)]
    return [name for name, m in model.named_modules() if isinstance(m, kind)]


def eager_root(model: nn.Module) -> nn.Module:
    """``model`` itself, or the eager module inside a compiled root (``_orig_mod``),
    unwrapped as many times as it was compiled."""
    kind = _optimized_module()
    while kind is not None and isinstance(model, kind):
        model = model.get_submodule("_orig_mod")
    return model


def refuse_compiled_layers(model: nn.Module, selected: Sequence[str],
                           of_type: Callable[[type], list[tuple[str, nn.Module]]] | None = None) -> None:
    """Refuse layers that sit inside a compiled submodule: their hooks would never fire.
    ``of_type`` as in ``compiled_modules``.

    Raises
    ------
    GradExplorerError
        Naming the compiled submodules and how to capture them.
    """
    compiled = [c for c in compiled_modules(model, of_type) if c]
    if not compiled:
        return
    inside = [n for n in selected if any(n == c or n.startswith(c + ".") for c in compiled)]
    if inside:
        names = ", ".join(compiled[:3]) + (f" and {len(compiled) - 3} more" if len(compiled) > 3 else "")
        raise GradExplorerError(
            f"{len(inside)} selected layer(s) are inside modules compiled with torch.compile "
            f"({names}): hooks added to compiled code never fire, so they would record 0 calls.",
            "Capture the model before compiling those modules, or leave their layers out "
            "(--layers); a whole compiled model is captured through its eager module.",
        )
