"""How much memory a capture will hold, told before anything is allocated.

The estimate follows what ``core.capture`` keeps, tensor by tensor, using what one probe
forward (``ModuleTree.probe``) saw: each call's output and first input, their sizes, and
their identity (the same tensor object at the same version counter):

* activations: one per call of a selected module. Capture copies each to the CPU, except
  (on the CPU, from the second full capture of a model on) outputs it learnt are never
  modified later: those are kept as they are, so a module that returns its input
  unchanged (``Dropout`` in eval, ``Identity``) then shares the previous output's memory.
* gradients: capture hooks each tensor value once and gives its gradient to every record
  that saw it (a module's input gradient is usually the previous module's output
  gradient), so unique tensor values are counted. Two sharing rules of autograd matter:
  an in-place ``+=`` outside any module (ResNet, EfficientNet residuals) passes the same
  gradient to the value before and after it; and an output that no later module takes
  as its input (a residual branch, a ``cat`` branch, ``flatten`` before the classifier)
  gets its gradient as a view of, or the very tensor of, a gradient that is counted
  elsewhere, so it adds nothing.
* parameter gradients: a copy per trainable parameter of each selected module.
* input, output, input gradient, and the statistics (a 64-bin histogram and a few
  numbers per tensor: about 1 KiB each).

Statistics-only captures hold only the statistics, whatever the batch size: layers x
calls x about 1 KiB. ``transient`` is the working memory of the forward and backward
pass itself (what autograd saves, roughly every module output once, plus the gradients
of all parameters), needed on the run's device while the capture runs, whatever is
selected.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from core.module_tree import ModuleTree

#: Share of the free memory a capture may use before ``check_budget`` warns.
BUDGET_SHARE = 0.5


def _stats_dict_bytes() -> int:
    from core.stats import tensor_stats

    stats = tensor_stats(torch.arange(4.0))
    size = sys.getsizeof(stats)
    for value in stats.values():
        if isinstance(value, torch.Tensor):
            size += value.untyped_storage().nbytes() + sys.getsizeof(value)
        else:
            size += sys.getsizeof(value)
    return size


#: Bytes one statistics dict holds (its histogram, numbers and the dict itself).
STATS_BYTES = _stats_dict_bytes()


@dataclass
class MemoryEstimate:
    """Bytes a capture will hold, by kind.

    Attributes
    ----------
    activations, grad_outputs, grad_inputs, param_grads : int
        Tensors of the selected layers (0 in statistics-only mode). ``grad_inputs`` counts
        only input gradients that are not also some selected call's output gradient.
    io : int
        The input batch, the output, and the input gradient when asked for.
    stats : int
        The statistics dicts.
    transient : int
        Working memory of the forward and backward pass on the run's device, freed when
        the capture returns (not in ``total``).
    mode : str
    layers, calls : int
        Selected layers and their calls per forward.
    """

    activations: int = 0
    grad_outputs: int = 0
    grad_inputs: int = 0
    param_grads: int = 0
    io: int = 0
    stats: int = 0
    transient: int = 0
    mode: str = "full"
    layers: int = 0
    calls: int = 0

    @property
    def gradients(self) -> int:
        return self.grad_outputs + self.grad_inputs + self.param_grads

    @property
    def total(self) -> int:
        """Bytes held by the finished capture."""
        return self.activations + self.gradients + self.io + self.stats

    def describe(self) -> str:
        """One line for the Run button and the CLI, e.g.
        ``"≈ 1.2 GiB (activations 600 MiB, gradients 550 MiB, input/output 12 MiB)"``."""
        if self.mode == "stats":
            return (f"≈ {format_bytes(self.total)} (statistics only: {self.layers} layers × "
                    f"{self.calls} calls, bounded; input/output {format_bytes(self.io)})")
        parts = [f"activations {format_bytes(self.activations)}",
                 f"gradients {format_bytes(self.grad_outputs + self.grad_inputs)}"]
        if self.param_grads:
            parts.append(f"parameter gradients {format_bytes(self.param_grads)}")
        parts.append(f"input/output {format_bytes(self.io)}")
        return f"≈ {format_bytes(self.total)} ({', '.join(parts)})"


def format_bytes(n: int | float) -> str:
    """``1536`` -> ``"1.5 KiB"``; binary units, 2-3 significant figures."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.1f} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"  # pragma: no cover


def _input_bytes(inputs) -> int:
    if isinstance(inputs, torch.Tensor):
        return inputs.numel() * inputs.element_size()
    if inputs is None:
        return 0
    shape, dtype = (inputs, torch.float32) if isinstance(inputs[0], int) else inputs
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=dtype).element_size()


def estimate_capture_memory(
    tree: ModuleTree,
    selected: list[str],
    mode: str = "full",
    inputs: "torch.Tensor | tuple | None" = None,
    input_grad: bool = False,
    model: nn.Module | None = None,
) -> MemoryEstimate:
    """Estimate the memory a capture of ``selected`` will hold, from a probed tree.

    Parameters
    ----------
    tree : ModuleTree
        Probed (``tree.probe(model, x)``) with a batch of the size the capture will use.
    selected : list of str
        Qualified names of the layers to capture (``core.selection.resolve_layers``).
    mode : {"full", "stats"}
    inputs : Tensor, shape tuple, or (shape, dtype), optional
        The batch (only its size is used); defaults to what the probe saw. When it is
        larger or smaller than the probe's batch (a tree probed with one sample), the
        sizes the probe saw are scaled by the ratio of the two batches' bytes.
    input_grad : bool
        Whether the input gradient is asked for.
    model : nn.Module, optional
        The model (for its parameters and what capture already learnt about it); without
        it parameter gradients are not counted and every output is assumed trainable.

    Returns
    -------
    MemoryEstimate

    Raises
    ------
    ValueError
        When the tree has not been probed.
    """
    if not tree.probed or not tree.call_io:
        raise ValueError("estimate_capture_memory needs a probed ModuleTree (tree.probe(model, x)).")
    chosen = set(selected)
    modules = dict(model.named_modules()) if model is not None else {}

    def trainable(name: str, recurse: bool) -> bool:
        m = modules.get(name)
        if m is None:
            return model is None
        return any(p.requires_grad for p in m.parameters(recurse=recurse))

    has_params = model is None or any(p.requires_grad for p in model.parameters())
    own_trainable = {name: trainable(name, False) for name in tree.nodes}
    root = tree.call_io[0]
    x_key = root.input_key
    x_bytes = _input_bytes(inputs) if inputs is not None else root.input_bytes
    # Activations and gradients grow with the batch: scale a probe of another batch size.
    scale = x_bytes / root.input_bytes if root.input_bytes else 1.0
    want_x_grad = input_grad or not has_params
    # Which activations capture keeps without a copy (see module docstring).

    events = []
    for i, call in enumerate(tree.call_io):
        events.append((call.start, 0, i))
        events.append((call.end, 1, i))
    events.sort()

    flags: dict[tuple, bool] = {}
    if x_key is not None:
        flags[x_key] = want_x_grad
    size: dict[tuple, int] = {}
    parent: dict[tuple, tuple] = {}
    latest: dict[int, tuple] = {}
    consumed: set[tuple] = set()
    grad_keys: dict[tuple, str] = {}
    input_flag: dict[int, bool] = {}
    seen_grad = False
    est = MemoryEstimate(mode=mode, layers=len(chosen))
    shared_acts: set[tuple] = set()
    n_stats = 0

    for _tick, kind, i in events:
        call = tree.call_io[i]
        if kind == 0:
            key = call.input_key
            flag = False
            if key is not None:
                size.setdefault(key, call.input_bytes)
                if key not in flags:
                    last = latest.get(key[0])
                    if last is not None and last[1] < key[1]:
                        # Changed in place outside any module (``+=``): same gradient.
                        parent[key] = last
                        flags[key] = flags.get(last, seen_grad)
                    else:
                        flags[key] = seen_grad
                flag = flags[key]
                if call.name:
                    consumed.add(key)
                if latest.get(key[0], key) <= key:
                    latest[key[0]] = key
                seen_grad |= flag
            input_flag[i] = flag
            if own_trainable.get(call.name, False):
                seen_grad = True
            continue
        # The call returned.
        key = call.output_key
        if key is not None:
            size.setdefault(key, call.output_bytes)
            flags.setdefault(key, seen_grad or trainable(call.name, True))
            if latest.get(key[0], key) <= key:
                latest[key[0]] = key
        if call.name not in chosen:
            continue
        est.calls += 1
        if key is not None:
            if key not in shared_acts:
                # Capture keeps one summary and one copy (or none) per tensor value, however
                # many calls return it.
                shared_acts.add(key)
                n_stats += 1
                if mode == "full":
                    est.activations += call.output_bytes
            if flags[key]:
                grad_keys.setdefault(key, "out")
        if call.input_key is not None and input_flag[i]:
            grad_keys.setdefault(call.input_key, "in")

    def find(key: tuple) -> tuple:
        while key in parent:
            key = parent[key]
        return key

    n_stats += len(grad_keys)  # one statistics dict per hooked tensor value
    group_consumed: set[tuple] = {find(k) for k in consumed}
    root_out = root.output_key
    groups: dict[tuple, tuple[int, str]] = {}
    for key, kind in grad_keys.items():
        group = find(key)
        if group not in group_consumed and key != root_out and key != x_key:
            continue  # a branch whose gradient is a view of one counted elsewhere
        bytes_, first_kind = groups.get(group, (0, kind))
        groups[group] = (max(bytes_, size.get(key, 0)), first_kind)
    if mode == "full":
        for bytes_, kind in groups.values():
            if kind == "out":
                est.grad_outputs += bytes_
            else:
                est.grad_inputs += bytes_

    param_bytes = 0
    for name in chosen:
        m = modules.get(name)
        if m is None:
            continue
        for p in m.parameters(recurse=False):
            if p.requires_grad:
                n_stats += 1
                param_bytes += p.numel() * p.element_size()
    if mode == "full":
        est.param_grads = param_bytes

    x_grad_shared = x_key is not None and x_key in grad_keys and mode == "full"
    for name in ("activations", "grad_outputs", "grad_inputs"):
        setattr(est, name, round(getattr(est, name) * scale))
    est.io = x_bytes + round(root.output_bytes * scale)
    if input_grad and not x_grad_shared:
        est.io += x_bytes
    est.stats = n_stats * STATS_BYTES

    leaf_outputs = sum(c.output_bytes for c in tree.call_io if c.name and tree.nodes[c.name].is_leaf)
    all_params = 0 if model is None else sum(
        p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    est.transient = round(leaf_outputs * scale) + all_params + x_bytes
    return est


def measure_capture_memory(capture) -> int:
    """Bytes a ``Capture`` holds: every tensor storage once (views and shared tensors
    counted once), plus its statistics dicts.

    Parameters
    ----------
    capture : core.capture_data.Capture

    Returns
    -------
    int
    """
    seen: set[tuple] = set()
    seen_stats: set[int] = set()
    total = 0

    def add(t) -> None:
        nonlocal total
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key = (t.device.type, t.device.index, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()

    def add_stats(stats) -> None:
        nonlocal total
        if not stats or id(stats) in seen_stats:
            return
        seen_stats.add(id(stats))  # one dict is shared by the records that saw one tensor
        total += sys.getsizeof(stats)
        for value in stats.values():
            if isinstance(value, torch.Tensor):
                total += sys.getsizeof(value)
                add(value)
            else:
                total += sys.getsizeof(value)

    add(capture.input)
    add(capture.output)
    add(capture.input_grad)
    for _name, _i, call in capture.iter_calls():
        add(call.activation)
        add(call.grad_output)
        add(call.grad_input)
        for stats in call.stats.values():
            add_stats(stats)
    for layer in capture.layers.values():
        for g in layer.param_grads.values():
            add(g)
        for stats in layer.param_stats.values():
            add_stats(stats)
    return total


def largest_tensor_bytes(capture) -> int:
    """The largest single tensor a capture holds in its layers (activations, gradients,
    parameter gradients and histograms; not the input and output)."""
    largest = 0

    def see(t) -> None:
        nonlocal largest
        if isinstance(t, torch.Tensor):
            largest = max(largest, t.untyped_storage().nbytes())

    for _name, _i, call in capture.iter_calls():
        for t in (call.activation, call.grad_output, call.grad_input):
            see(t)
        for stats in call.stats.values():
            if stats:
                see(stats.get("hist"))
    for layer in capture.layers.values():
        for g in layer.param_grads.values():
            see(g)
        for stats in layer.param_stats.values():
            if stats:
                see(stats.get("hist"))
    return largest


def budget_bytes(device: "str | torch.device" = "cpu") -> int | None:
    """The memory a capture may use on ``device``: ``BUDGET_SHARE`` of what is free now.

    Returns
    -------
    int or None
        None when the free memory cannot be told.
    """
    from core.devices import free_memory

    free = free_memory(device)
    return None if free is None else int(free * BUDGET_SHARE)


def check_budget(estimate: MemoryEstimate, device: "str | torch.device" = "cpu",
                 budget: int | None = None) -> str | None:
    """A warning when the capture would not fit, or None when it does.

    The finished capture lives in RAM (full tensors are moved to the CPU); the forward and
    backward pass need ``estimate.transient`` on the run's device as well.

    Parameters
    ----------
    estimate : MemoryEstimate
    device : str or torch.device
        Where the capture runs.
    budget : int, optional
        Bytes the capture may use, in RAM and on the device (``CaptureOptions.memory_budget``);
        default: ``BUDGET_SHARE`` of what is free on each.

    Returns
    -------
    str or None
        The problem and what to do about it, in one or two sentences.
    """
    device = torch.device(device)
    ram = budget if budget is not None else budget_bytes("cpu")
    share = "the memory budget you set" if budget is not None else "half of the free RAM"
    need_ram = estimate.total + (estimate.transient if device.type == "cpu" else 0)
    if ram is not None and need_ram > ram:
        held = estimate.total
        if estimate.mode == "full" and held > ram - (need_ram - held):
            fix = ("Switch to statistics-only capture (about "
                   f"{format_bytes(estimate.stats + estimate.io)}), or tick fewer layers.")
        else:
            fix = "Use a smaller batch, or a GPU."
        return (f"This capture needs {format_bytes(need_ram)} of memory but the budget is "
                f"{format_bytes(ram)} ({share}). {fix}")
    if device.type == "cuda":
        gpu = budget if budget is not None else budget_bytes(device)
        if gpu is not None and estimate.transient > gpu:
            return (f"The forward and backward pass need about {format_bytes(estimate.transient)} on "
                    f"{device} but the budget is {format_bytes(gpu)} "
                    f"({'the memory budget you set' if budget is not None else 'half of its free memory'}). "
                    "Use a smaller batch, or run on the CPU.")
    return None
