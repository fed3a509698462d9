"""Reference gradients by plain autograd, independent of gradexplorer.capturing.capture.

Every selected module's first input and primary output are replaced by clones through
forward pre-hooks and forward hooks. The originals are then never touched by later
in-place operations (those act on the clones), so ``torch.autograd.grad`` with respect to
the originals gives exactly "the gradient at this call's output / input" and the
originals still hold the values at call time. Clones are the identity in forward and
backward, so the numbers are those of the unmodified model. The scalar backward starts
from is written out here too (:func:`target_by_hand`), not taken from gradexplorer's targets.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gradexplorer.capturing.capture import primary_tensor


def _replace_primary(output: Any, key: str, new: torch.Tensor) -> Any:
    if key == "":
        return new
    head, _, rest = key.partition(".")
    if isinstance(output, dict):
        k = next(k for k in output if str(k) == head)
        out = type(output)(output)
        out[k] = _replace_primary(output[k], rest, new)
        return out
    fields = getattr(output, "_fields", None)
    idx = fields.index(head) if fields and head in fields else int(head)
    items = list(output)
    items[idx] = _replace_primary(items[idx], rest, new)
    return type(output)(*items) if fields else type(output)(items)


def _element(output: Any, key: str | None) -> torch.Tensor:
    """The output element a target names, picked by hand: a tensor itself; a dict's (a
    ModelOutput's) ``key``, by default ``out``, else ``logits``, else its first; a tuple's
    field or index, by default its first."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        if key is None:
            key = "out" if "out" in output else "logits" if "logits" in output else next(iter(output))
        return _element(output[key], None)
    fields = getattr(output, "_fields", None)
    if key is None:
        return _element(output[0], None)
    return _element(getattr(output, key) if fields and key in fields else output[int(key)], None)


def target_by_hand(output: Any, target: str, labels: torch.Tensor | None = None) -> torch.Tensor:
    """The scalar of the targets the tests compare with, written out in plain torch
    (``sum``, ``mean``, ``top1``, ``class:N``, ``cross_entropy``, each with ``@KEY``):
    classes on dim 1, as a ``(B, C, ...)`` output holds them. Any other target is refused,
    so that no test takes its truth from gradexplorer's own reduction."""
    kind, _, key = target.partition("@")
    y = _element(output, key or None)
    if kind == "sum":
        return y.sum()
    if kind == "mean":
        return y.mean()
    if kind == "top1":
        return y.max(dim=1).values.sum()
    if kind.startswith("class:"):
        return y[:, int(kind.removeprefix("class:"))].sum()
    if kind == "cross_entropy":
        assert labels is not None, "cross_entropy needs labels"
        return F.cross_entropy(y, labels.long())
    raise ValueError(f"the reference has no hand-written target {target!r}")


def reference(model: nn.Module, x: torch.Tensor, names: list[str], target="top1",
              labels=None, train: bool = False, input_grad: bool = False) -> dict:
    """Returns ``{"calls": {name: [ {activation, grad_output, grad_input} ]},
    "params": {name: {pname: grad}}, "input_grad": tensor or None}``."""
    was = {m: m.training for m in model.modules()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.train(train)
    calls: dict[str, list[dict]] = {n: [] for n in names}
    handles = []
    wanted = set(names)
    open_calls: dict[str, list[dict]] = {}

    def pre(name):
        def hook(module, args):
            rec = {"input": None, "output": None, "key": ""}
            calls[name].append(rec)
            open_calls.setdefault(name, []).append(rec)
            if args and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
                rec["input"] = args[0]
                return (args[0].clone(), *tuple(args[1:]))
            return None
        return hook

    def post(name):
        def hook(module, args, output):
            rec = open_calls[name].pop()
            key, y = primary_tensor(output)
            rec["key"] = key
            if y is None:
                return None
            rec["value"] = y.detach().clone()
            if y.requires_grad:
                rec["output"] = y
                return _replace_primary(output, key, y.clone())
            return None
        return hook

    try:
        for name, module in model.named_modules():
            if name in wanted:
                handles.append(module.register_forward_pre_hook(pre(name)))
                handles.append(module.register_forward_hook(post(name)))
        xx = x.detach().clone().requires_grad_(input_grad)
        out = model(xx)
        scalar = target_by_hand(out, target, labels)
        tensors = []
        for name in names:
            for rec in calls[name]:
                for k in ("input", "output"):
                    if rec[k] is not None:
                        tensors.append(rec[k])
        params = {n: dict(model.get_submodule(n).named_parameters(recurse=False)) for n in names}
        flat_params = [p for d in params.values() for p in d.values() if p.requires_grad]
        extra = [xx] if input_grad else []
        grads = torch.autograd.grad(scalar, tensors + flat_params + extra, allow_unused=True)
        gi = iter(grads)
        result_calls = {}
        for name in names:
            result_calls[name] = []
            for rec in calls[name]:
                entry = {"activation": rec.get("value"), "grad_input": None, "grad_output": None}
                if rec["input"] is not None:
                    entry["grad_input"] = next(gi)
                if rec["output"] is not None:
                    entry["grad_output"] = next(gi)
                result_calls[name].append(entry)
        pgrads = {}
        for name in names:
            pgrads[name] = {}
            for pname, p in params[name].items():
                pgrads[name][pname] = next(gi) if p.requires_grad else None
        return {"calls": result_calls, "params": pgrads,
                "input_grad": next(gi) if input_grad else None, "output": out}
    finally:
        for h in handles:
            h.remove()
        for m, t in was.items():
            m.training = t
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])


def reference_by_edges(model: nn.Module, args: tuple, names: list[str], target: str = "top1",
                       labels: torch.Tensor | None = None) -> dict:
    """Reference gradients that leave the model's graph exactly as it is: no clone is put in
    it. Each named module's first tensor input and primary output are recorded at call time
    as gradient edges (``torch.autograd.graph.get_gradient_edge``), with a copy of the
    output's value; then ``torch.autograd.grad(target, edges)`` gives "the gradient at this
    call's output / input" of the target's own backward, and only of it: a model whose
    forward runs a backward of its own (a force field, a gradient penalty, a PINN) gets
    the gradients of the target alone, ``None`` where the target does not depend on the
    tensor. Same result layout as :func:`reference`."""
    from torch.autograd.graph import get_gradient_edge

    was = {m: m.training for m in model.modules()}
    model.eval()
    calls: dict[str, list[dict]] = {n: [] for n in names}
    handles = []

    def pre(name):
        def hook(module, hook_args):
            rec = {"input": None, "output": None, "value": None}
            x = next((a for a in hook_args if isinstance(a, torch.Tensor)), None)
            if x is not None and x.requires_grad:
                rec["input"] = get_gradient_edge(x)
            calls[name].append(rec)
        return hook

    def post(name):
        def hook(module, hook_args, output):
            rec = next(r for r in reversed(calls[name]) if "done" not in r)
            rec["done"] = True
            _, y = primary_tensor(output)
            if y is not None:
                rec["value"] = y.detach().clone()
                if y.requires_grad:
                    rec["output"] = get_gradient_edge(y)
        return hook

    try:
        for name, module in model.named_modules():
            if name in calls:
                handles.append(module.register_forward_pre_hook(pre(name)))
                handles.append(module.register_forward_hook(post(name)))
        out = model(*[a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args])
    finally:
        for h in handles:
            h.remove()
        for m, t in was.items():
            m.training = t
    scalar = target_by_hand(out, target, labels)
    edges, where = [], []
    for name in names:
        for i, rec in enumerate(calls[name]):
            for key in ("input", "output"):
                if rec[key] is not None:
                    edges.append(rec[key])
                    where.append((name, i, key))
    owned = [(n, pn, p) for n in names for pn, p in model.get_submodule(n).named_parameters(recurse=False)
             if p.requires_grad]
    grads = torch.autograd.grad(scalar, edges + [p for *_, p in owned], allow_unused=True)
    result_calls = {n: [{"activation": rec["value"], "grad_input": None, "grad_output": None}
                        for rec in calls[n]] for n in names}
    for (name, i, key), g in zip(where, grads):
        result_calls[name][i]["grad_" + key] = g
    params: dict[str, dict] = {n: {pn: None for pn, _ in model.get_submodule(n).named_parameters(recurse=False)}
                               for n in names}
    for (n, pn, _), g in zip(owned, grads[len(edges):]):
        params[n][pn] = g
    return {"calls": result_calls, "params": params, "input_grad": None, "output": out}


def max_rel_error(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """max |a-b| / max(max |b|, tiny): 0 when both are None, inf when only one is."""
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return float("inf")
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    if a.shape != b.shape:
        return float("inf")
    scale = b.abs().max().item() if b.numel() else 0.0
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    return diff / max(scale, 1e-30)


def compare(cap, ref, names) -> float:
    """Worst relative error over every call, tensor and parameter gradient."""
    worst = 0.0
    for name in names:
        got_calls = cap.layers[name].calls
        want_calls = ref["calls"][name]
        assert len(got_calls) == len(want_calls), (name, len(got_calls), len(want_calls))
        for got, want in zip(got_calls, want_calls):
            for kind in ("activation", "grad_output", "grad_input"):
                err = max_rel_error(getattr(got, kind), want[kind])
                assert err < float("inf"), (name, kind, getattr(got, kind) is None, want[kind] is None)
                worst = max(worst, err)
        for pname, g in ref["params"][name].items():
            worst = max(worst, max_rel_error(cap.layers[name].param_grads.get(pname), g))
    return worst


def param_grads_by_autograd(model: nn.Module, scalar: torch.Tensor, retain_graph: bool = False,
                            ) -> dict[str, torch.Tensor]:
    """Every parameter's gradient of ``scalar`` by plain autograd, by qualified name; a
    parameter shared by two modules (a language model's tied ``lm_head.weight``) under each
    of its names, a parameter the scalar does not reach left out."""
    named = [(n, p) for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad]
    grads = torch.autograd.grad(scalar, [p for _, p in named], allow_unused=True, retain_graph=retain_graph)
    return {n: g for (n, _), g in zip(named, grads) if g is not None}


def assert_param_grads_equal(cap: Any, want: dict[str, torch.Tensor], rtol: float = 1e-5,
                             atol: float = 1e-7) -> int:
    """The capture's parameter gradients are autograd's ``want``: the same names (a gradient
    the capture lacks, or one autograd has not, fails) and the same values. Returns how
    many gradients were compared."""
    got = {(f"{layer}.{pname}" if layer else pname): g
           for layer, rec in cap.layers.items() for pname, g in rec.param_grads.items() if g is not None}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert not missing and not extra, f"captured without a gradient: {missing}; captured, not autograd's: {extra}"
    for name, g in got.items():
        torch.testing.assert_close(g, want[name], rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")
    return len(got)
