"""Where a statistics-only capture's per-call cost goes, on the 200-leaf MLP of
``benchmarks/call_overhead.py``.

    python -m benchmarks.call_breakdown [--repeats 40] [--passes 200] [--batch 4]

Two tables, one thread, figures only (nothing here asserts a time):

1. **What-if rows.** The capture with one part of its work replaced by a no-op, timed
   interleaved with the unchanged capture, the bare pass and the bare hook pair (CPU time,
   each repeat's pass less the bare pass of the same repeat, median over repeats), in µs per
   leaf call and × the hook pair. What a part costs is the unchanged capture's figure less
   its row. The parts:

   - ``no onset notes``: the NaN/Inf onset tracker takes no note of any call and reads
     nothing at the end (``gradexplorer.capturing.nonfinite.OnsetTracker``);
   - ``no parameter statistics``: the layers' parameters' gradients are neither summarised
     nor recorded (what the bare hook pair and the naive hook never do; the
     ``param_stats`` kind of ``benchmarks.call_overhead`` times their statistics alone);
   - both.

   One more row adds work instead: ``every record read``, the capture followed by the first
   read of its records, which writes the statistics computed during the capture into them
   (``gradexplorer.stats.pending``: the 14 keys, their floats, the histogram's view of the
   shared table, and their freeing later). Its extra cost is what a reader of every record
   (the window, a file, a watch's log) pays once per capture.

   A what-if capture is not a correct capture: it measures, nothing else. Each patch is
   undone when its pass ends.

   One more row is not the capture at all: ``notes and batched statistics only``, the floor
   of the capture's design on this model. A forward pre-hook and forward hook on every leaf
   (installed as the capture installs them, ``Hooks.call_hooks``) note the call's input and
   version, copy the output's bytes into the capture's buffer (``ImmediateStats``) and take
   its gradient edge; backward is ``torch.autograd.grad`` over the parameters and the edges;
   the outputs' and all the gradients' statistics are computed by the same batch kernel and
   left pending, as a capture leaves them. What it leaves out: the records and their
   assembly, the routing of a gradient to every call that saw the value, the checks a model
   of another kind needs (pass-through outputs, views, in-place changes, leaves, several
   outputs), the NaN/Inf onset, the model's state saved and put back, progress and cancel.
   The unchanged capture's figure less this row is what those cost.

2. **Phases.** Timers around the parts of ``--passes`` statistics-only captures (wall clock):
   forward with its hooks, backward, the flush after forward, the batch after backward, the
   layers' records, the edges' gradients recorded, the onset's reading, the metadata, and the
   rest (the capture's frame: hooks on and off, the model's state saved and put back, the
   module tree's check, the scalar), beside the bare forward and backward; and, after each
   capture and outside its time, the first read of its records.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import cast

import torch
from torch import nn
from torch.autograd.graph import GradientEdge

import gradexplorer.capturing.capture as capture_module
from benchmarks.call_overhead import _pair_hook, _timed, _with_leaf_hooks, bare, leaf_calls, mlp
from gradexplorer.capturing import nonfinite
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.selection import leaf_names
from gradexplorer.hooks import Hooks
from gradexplorer.stats import cpu as cpu_stats, device
from gradexplorer.stats.immediate import ImmediateStats
from gradexplorer.stats.moments import HIST_EXACT_LIMIT
from gradexplorer.stats.pending import PendingRecords
from gradexplorer.stats.record import TensorStats

_NOTE = ("", 0, [], False)


@contextlib.contextmanager
def _replaced(owner: object, name: str, value: object) -> Iterator[None]:
    old = vars(owner)[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def no_onset_notes() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    tracker = nonfinite.OnsetTracker
    stack.enter_context(_replaced(tracker, "enter", lambda self, *args, **kwargs: _NOTE))
    stack.enter_context(_replaced(tracker, "leave", lambda self, *args, **kwargs: None))
    stack.enter_context(_replaced(tracker, "linked", lambda self, *args, **kwargs: None))
    stack.enter_context(_replaced(tracker, "known_stats", lambda self, *args, **kwargs: None))
    stack.enter_context(_replaced(tracker, "grad", lambda self, *args, **kwargs: None))
    stack.enter_context(_replaced(tracker, "result", lambda self, *args, **kwargs: None))
    return stack


def no_parameter_statistics() -> contextlib.AbstractContextManager:
    real = capture_module._layer_record

    def without(name, structure, recorder, grad_of):  # type: ignore[no-untyped-def]
        return real(name, structure, recorder, {})  # every parameter's gradient: not reached

    return _replaced(capture_module, "_layer_record", without)


def _together(*parts: Callable[[], contextlib.AbstractContextManager]) -> Callable[[], contextlib.ExitStack]:
    def enter() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for part in parts:
            stack.enter_context(part())
        return stack

    return enter


#: What-if rows: a label and what replaces the part.
WHAT_IF: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "no onset notes": no_onset_notes,
    "no parameter statistics": no_parameter_statistics,
    "both": _together(no_onset_notes, no_parameter_statistics),
}

#: The row that reads every record after the capture (the records written: stats.pending).
READ = "every record read"
#: The row of the design's floor (``notes_only``).
FLOOR = "notes and batched statistics only"


def notes_only(model: nn.Module, x: torch.Tensor) -> tuple[list[TensorStats], list[TensorStats], PendingRecords]:
    """The floor of the capture's design (the module's docstring): the statistics of every
    leaf's output (in call order) and of the gradients of the parameters and outputs (in
    that order), as records that ``PendingRecords.fill`` writes; and the pending records."""
    later = PendingRecords()
    now = ImmediateStats(min(device.SMALL_VALUES, HIST_EXACT_LIMIT), later=later)  # (the capture's)
    names = set(leaf_names(model))
    leaves = [m for n, m in model.named_modules() if n in names]
    inputs: list[tuple[torch.Tensor, int]] = []
    outputs: list[TensorStats] = []
    edges: list[GradientEdge] = []

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        a = args[0]
        inputs.append((a, a._version))

    def post(module: nn.Module, args: tuple, y: torch.Tensor) -> None:
        record = now.add(y)
        if record is None:
            raise TypeError(f"notes_only takes small float CPU outputs, not {tuple(y.shape)} {y.dtype}")
        outputs.append(record)
        edges.append(GradientEdge(y.grad_fn, y.output_nr))

    hooks = Hooks()
    hooks.call_hooks(leaves, post, pre)
    try:
        out = model(x)
        now.fill()
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(out.max(dim=1).values.sum(), params + edges)
    finally:
        hooks.remove()
    records: list[TensorStats] = [cast(TensorStats, {}) for _ in grads]
    cpu_stats.summarize_many(list(grads), HIST_EXACT_LIMIT, records, later)
    return outputs, records, later


def _stats(model: nn.Module, x: torch.Tensor) -> Capture:
    return capture(model, x, mode="stats")


def _stats_read(model: nn.Module, x: torch.Tensor) -> None:
    capture(model, x, mode="stats").layers  # noqa: B018 - (the first read writes the records)


def _what_if(part: Callable[[], contextlib.AbstractContextManager]) -> Callable[[nn.Module, torch.Tensor], None]:
    def run(model: nn.Module, x: torch.Tensor) -> None:
        with part():
            capture(model, x, mode="stats")

    return run


def what_if_rows(model: nn.Module, x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median µs per leaf call above the bare pass of each row, interleaved, CPU time."""
    kinds: dict[str, Callable[[nn.Module, torch.Tensor], None]] = {
        "bare": bare, "hook pair": _with_leaf_hooks(_pair_hook), "statistics only": _stats,
        READ: _stats_read, **{label: _what_if(part) for label, part in WHAT_IF.items()}, FLOOR: notes_only}
    times = _timed(kinds, model, x, repeats, time.process_time)  # interleaved, after a warm-up
    calls = leaf_calls(model, x)
    return {k: statistics.median(t - b for t, b in zip(v, times["bare"])) / calls * 1e6
            for k, v in times.items() if k != "bare"}


def _clocked(owner: object, name: str, label: str, acc: Counter) -> contextlib.AbstractContextManager:
    real = getattr(owner, name)

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            acc[label] += time.perf_counter() - t0

    return _replaced(owner, name, timed)


#: Phases timed: (owner, attribute, label).
PHASES = (
    (capture_module, "_forward", "forward with the hooks"),
    (capture_module, "_backward", "backward"),
    (device.DeferredStats, "flush", "the flush after forward"),
    (device.DeferredStats, "resolve", "the batch after backward"),
    (capture_module, "_layer_record", "the layers' records"),
    (capture_module._Recorder, "_take_edge_grads", "the edges' gradients recorded"),
    (nonfinite.OnsetTracker, "result", "the onset's reading"),
    (capture_module, "_capture_meta", "the metadata"),
)


_FLUSHES, _BATCH = PHASES[2][2], PHASES[3][2]


def phases(model: nn.Module, x: torch.Tensor,
           passes: int) -> tuple[dict[str, float], float, float, float, float]:
    """Milliseconds per capture of each phase, the whole capture's, the bare forward's and
    backward's, and the first read of the capture's records after it (wall clock,
    ``passes`` of each)."""
    for _ in range(3):
        _stats(model, x)
    acc: Counter = Counter()
    whole = read = 0.0
    with contextlib.ExitStack() as stack:
        for owner, name, label in PHASES:
            stack.enter_context(_clocked(owner, name, label, acc))
        for _ in range(passes):
            t0 = time.perf_counter()
            cap = _stats(model, x)
            t1 = time.perf_counter()
            cap.layers  # noqa: B018 - (writes the records)
            read += time.perf_counter() - t1
            whole += t1 - t0
            del cap
    fwd = bwd = 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(passes):
        t0 = time.perf_counter()
        out = model(x)
        t1 = time.perf_counter()
        torch.autograd.grad(out.max(dim=1).values.sum(), params)
        t2 = time.perf_counter()
        fwd += t1 - t0
        bwd += t2 - t1
        del out
    scale = 1e3 / passes
    return {k: v * scale for k, v in acc.items()}, whole * scale, fwd * scale, bwd * scale, read * scale


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40, help="interleaved repeats of the what-if rows")
    ap.add_argument("--passes", type=int, default=200, help="captures timed for the phases")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args(argv)
    os.environ["NUMBA_NUM_THREADS"] = "1"  # read when numba starts its threads
    torch.set_num_threads(1)
    model, x = mlp(), torch.randn(args.batch, 64)
    calls = leaf_calls(model, x)
    print(f"torch {torch.__version__}, 1 thread, CPU; the 200-leaf MLP at batch {args.batch}, {calls} leaf calls",
          flush=True)
    rows = what_if_rows(model, x, args.repeats)
    floor, whole = rows["hook pair"], rows["statistics only"]
    print(f"\nWhat if a part cost nothing (CPU time, median of {args.repeats}, interleaved, paired with the bare pass)")
    print(f"  {'':<36} {'us/call':>8} {'x hook pair':>12} {'part costs':>11}")
    for label, us in rows.items():
        ratio = f"{us / floor:.2f}x" if floor > 0 else "-"
        part = ("" if label in ("hook pair", "statistics only")
                else f"{us - whole:+.1f}" if label == READ else f"{whole - us:+.1f}")
        print(f"  {label:<36} {us:>8.1f} {ratio:>12} {part:>11}", flush=True)
    done, total, fwd, bwd, read = phases(model, x, args.passes)
    print(f"\nPhases of a statistics-only capture (wall clock, {args.passes} captures): {total:.2f} ms "
          f"against a bare pass of {fwd + bwd:.2f} (forward {fwd:.2f}, backward {bwd:.2f})")
    shown = dict(done)
    # DeferredStats.resolve flushes again: the flush after forward is the flushes' time less it.
    shown[_FLUSHES] = max(shown.get(_FLUSHES, 0.0) - shown.get(_BATCH, 0.0), 0.0)
    shown["the rest: the capture's frame"] = total - sum(shown.values())
    bare_of = {PHASES[0][2]: fwd, PHASES[1][2]: bwd}
    print(f"  {'':<40} {'ms':>7}  {'above bare':>10}  {'us/call':>7}")
    for label, ms in shown.items():
        above = ms - bare_of.get(label, 0.0)
        print(f"  {label:<40} {ms:7.3f}  {above:10.3f}  {above / calls * 1e3:7.2f}", flush=True)
    print(f"  {'after it: the records written on first read':<40} {read:7.3f}  {'':10}  {read / calls * 1e3:7.2f}")
    return {"rows": rows, "phases": shown, "total_ms": total, "bare_forward_ms": fwd, "bare_backward_ms": bwd,
            "read_ms": read}


if __name__ == "__main__":
    main()
