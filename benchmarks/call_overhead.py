"""The fixed cost of each hooked module call: microseconds per leaf call above a bare pass.

    python -m benchmarks.call_overhead [--repeats 30] [--models mlp:4,resnet50:1]
                                       [--kinds hook_pair,naive,stats,full] [--clock cpu]
                                       [--runs 5]

Tensors so small that their arithmetic vanishes leave what a hook-based tool pays per call:
Python in the hooks, dispatch, bookkeeping. The model of record is a 200-leaf MLP
(100 × [Linear(64, 64), GELU]) at batch 4, whose 256-value tensors take nanoseconds to
read; resnet50 at batch 1 is the same question on a real network. One thread (torch and
numba), every kind timed interleaved with the bare pass in one run, median of repeats.
Per kind, the microseconds per leaf call above the bare forward + backward (the same
``torch.autograd.grad`` over the trainable parameters that a capture runs: each repeat's
pass less the bare pass of the same repeat, median over repeats), and that figure over the
bare hook pair's:

- ``hook_pair``: a forward hook on every leaf that registers a no-op tensor hook on the
  output (the floor of any tool built on hooks);
- ``naive``: a forward hook on every leaf that takes ``torch.var_mean`` and
  ``torch.aminmax`` of the output, and the same of its gradient through a tensor hook;
- ``stats``, ``full``: gradexplorer's statistics-only and full capture of every leaf. The
  statistics are computed during the capture and left, as the naive hook leaves its
  tensors, in the tables the kernel wrote; they are written into the capture's records
  when the records are first read (``gradexplorer.stats.pending``);
- ``stats_read``: statistics-only capture, then its records read (written): what a reader
  of every record (the window, a capture file, a table) pays once per capture;
- ``param_stats``: the bare pass, then the statistics of every trainable parameter's
  gradient, batched as a capture batches them. A capture summarises those too and the
  baselines above do not: the MLP's 200 parameter gradients hold 416 K values, against
  the 51 K values of its 400 activations and activation gradients. Printed beside the
  others, and subtracted from ``stats`` in the line below the table;
- ``watch``: a training step (forward, ``loss.backward()``, ``w.step()``) watched at every
  step by ``gradexplorer.watch`` (every leaf and parameter, its log written), against the
  same step unwatched (``bare train``, timed in the same run).

Targets: statistics-only within 3× and full capture within 4× the bare hook pair.
``--clock cpu`` (the default) times the process's CPU time, which other jobs on a shared
machine do not inflate as they do the wall clock (they still slow its caches and memory: the
minimum of the repeats, printed beside the median, is the pass least disturbed). Figures only:
nothing here asserts a time.

``--runs N`` repeats the whole measurement in N fresh processes, one after the other, and ends
with each kind's ratio to the hook pair in every run and their median. Each run's ratio is taken
within the run (the kind and the hook pair timed interleaved, in the same process), so the
median over runs is over whole measurements: on a shared machine the hook pair's own figure
moved by 10–15% from one run to the next (docs/benchmarks.md), and a single run's ratio moves
with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.selection import leaf_names
from gradexplorer.stats.batched import batched_stats

#: The repository's root: the runs of ``--runs`` import ``benchmarks`` from there.
ROOT = Path(__file__).resolve().parents[1]
KINDS = ("hook_pair", "naive", "stats", "stats_read", "full", "param_stats", "watch")
#: Each kind's per-call cost at most this many times the bare hook pair's.
TARGETS = {"stats": 3.0, "full": 4.0}


def mlp(depth: int = 100, width: int = 64) -> nn.Module:
    """``depth`` × [Linear(width, width), GELU]: 2 × ``depth`` leaves."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers).eval()


def model_and_input(spec: str) -> tuple[nn.Module, torch.Tensor]:
    """``mlp:B`` or a torchvision classifier ``NAME:B`` at 224 px, random init, eval mode."""
    name, _, b = spec.partition(":")
    batch = int(b or 1)
    torch.manual_seed(0)
    if name == "mlp":
        return mlp(), torch.randn(batch, 64)
    import torchvision

    return torchvision.models.get_model(name).eval(), torch.randn(batch, 3, 224, 224)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def bare(model: nn.Module, x: torch.Tensor) -> None:
    out = model(x)
    torch.autograd.grad(out.max(dim=1).values.sum(), _params(model))


def _with_leaf_hooks(hook: Callable) -> Callable[[nn.Module, torch.Tensor], None]:
    def run(model: nn.Module, x: torch.Tensor) -> None:
        names = set(leaf_names(model))
        handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n in names]
        try:
            bare(model, x)
        finally:
            for h in handles:
                h.remove()

    return run


def _nothing(grad: torch.Tensor) -> None:
    return None


def _pair_hook(module: nn.Module, args: tuple, output: object) -> None:
    if isinstance(output, torch.Tensor) and output.requires_grad:
        output.register_hook(_nothing)


_kept: list = []


def _summary(t: torch.Tensor) -> None:
    t = t.detach()
    _kept.append((torch.var_mean(t), torch.aminmax(t)))


def _naive_grad(grad: torch.Tensor) -> None:
    _summary(grad)


def _naive_hook(module: nn.Module, args: tuple, output: object) -> None:
    if isinstance(output, torch.Tensor):
        _summary(output)
        if output.requires_grad:
            output.register_hook(_naive_grad)


def param_stats(model: nn.Module, x: torch.Tensor) -> None:
    """The bare pass, then the statistics of its parameter gradients, batched as a
    statistics-only capture batches them (the fused CPU pass over a table of them)."""
    out = model(x)
    grads = torch.autograd.grad(out.max(dim=1).values.sum(), _params(model))
    _kept.append(batched_stats(list(grads)))


def leaf_calls(model: nn.Module, x: torch.Tensor) -> int:
    """Leaf module calls in one forward (a module called twice counts twice)."""
    count = [0]

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        count[0] += 1

    _with_leaf_hooks(hook)(model, x)
    return count[0]


def bare_train(model: nn.Module, x: torch.Tensor) -> None:
    """A training step's forward and backward (gradients into ``.grad``, cleared after)."""
    model(x).max(dim=1).values.sum().backward()
    for p in model.parameters():
        p.grad = None


class _Watched:
    """A watched training step; one watch for the whole run, as around a training loop.

    The watch watches every other step (``every=2``) and each pass ends the unwatched step
    between (``w.step()``, which puts the hooks on and copies the weights, as before every
    watched step) before it runs the watched one: so that no hook is on the model while the
    other kinds run."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.w = None

    def __call__(self, model: nn.Module, x: torch.Tensor) -> None:
        if self.w is None:
            from gradexplorer.recording.watch import watch

            self.w = watch(model, out=os.path.join(self.folder, "run.gxw"), every=2).__enter__()
            self.w.step()  # step 0 (watched, empty): from here on each pass starts on an odd step
        self.w.step()  # the unwatched step ends: the hooks go on for this pass's watched step
        loss = model(x).max(dim=1).values.sum()
        loss.backward()
        self.w.step(loss=loss)  # the watched step ends: its rows are written, the hooks come off
        for p in model.parameters():
            p.grad = None

    def close(self) -> None:
        if self.w is not None:
            self.w.close()


def kinds_of(asked: tuple[str, ...], watched: _Watched) -> dict[str, Callable[[nn.Module, torch.Tensor], object]]:
    fns: dict[str, Callable[[nn.Module, torch.Tensor], object]] = {
        "hook_pair": _with_leaf_hooks(_pair_hook),
        "naive": _with_leaf_hooks(_naive_hook),
        "stats": lambda m, x: capture(m, x, mode="stats"),
        "stats_read": lambda m, x: capture(m, x, mode="stats").layers,
        "full": lambda m, x: capture(m, x, mode="full"),
        "param_stats": param_stats,
        "watch": watched,
    }
    bares = {"bare": bare, **({"bare_train": bare_train} if "watch" in asked else {})}
    return {**bares, **{k: fns[k] for k in asked}}


def _timed(fns: dict, model: nn.Module, x: torch.Tensor, repeats: int, timer: Callable[[], float]) -> dict:
    """Seconds per pass of each kind, ``repeats`` times, the kinds interleaved."""
    for fn in fns.values():  # warm-up: the statistics kernels compile or load once
        fn(model, x)
        fn(model, x)
    # Several passes per timing where one is short (the MLP's takes milliseconds).
    t0 = timer()
    bare(model, x)
    inner = max(1, int(0.05 / max(timer() - t0, 1e-4)))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            _kept.clear()
            t0 = timer()
            for _ in range(inner):
                result = fn(model, x)
                del result
            times[k].append((timer() - t0) / inner)
    _kept.clear()
    return times


def measure(spec: str, repeats: int, kinds: tuple[str, ...], clock: str = "cpu") -> dict:
    """Median seconds per pass of each kind, interleaved with the bare pass; the leaf calls."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    model, x = model_and_input(spec)
    calls = leaf_calls(model, x)
    with tempfile.TemporaryDirectory(prefix="gx-call-overhead-") as folder:
        watched = _Watched(folder)
        try:
            times = _timed(kinds_of(kinds, watched), model, x, repeats, timer)
        finally:
            watched.close()
    out: dict = {"model": spec, "calls": calls}

    def base(k: str) -> str:
        return "bare_train" if k == "watch" else "bare"

    # Paired: each repeat's pass of a kind less the bare pass of the same repeat (timed next
    # to it, under the same load), then the median over repeats. On a shared machine whose
    # speed drifts, the difference of two separate medians moved twice as much.
    out["per_call_us"] = {
        k: statistics.median(t - b for t, b in zip(v, times[base(k)]))
        / calls * 1e6 for k, v in times.items() if not k.startswith("bare")}
    best = {k: min(v) for k, v in times.items()}
    out["per_call_us_min"] = {k: (best[k] - best[base(k)]) / calls * 1e6
                              for k in times if not k.startswith("bare")}
    out["bare_s"] = statistics.median(times["bare"])
    return out


def ratio_to_pair(run: dict, label: str = "per_call_us") -> dict[str, float]:
    """Each kind's per-call cost in one run over the hook pair's of the same run (``label``:
    ``per_call_us``, the medians, or ``per_call_us_min``, the minima); with ``stats less
    param_stats`` where both were timed. Empty where the run has no positive hook pair."""
    us = {k: _us(run[label], k) for k in _kinds_of_run(run)}
    floor = us.get("hook_pair")
    if not floor or floor <= 0:
        return {}
    return {k: v / floor for k, v in us.items()}


def _kinds_of_run(run: dict) -> list[str]:
    """The kinds a run timed, with ``stats less param_stats`` where it timed both."""
    names = list(run["per_call_us"])
    return names + [LESS_PARAMS] if "stats" in names and "param_stats" in names else names


def _us(per_call: dict[str, float], kind: str) -> float:
    if kind == LESS_PARAMS:
        return per_call["stats"] - per_call["param_stats"]
    return per_call[kind]


def over_runs(runs: list[list[dict]]) -> list[dict]:
    """Per model (in the order measured), each kind's figures over the runs: its
    microseconds per call in every run (``us``) and their median (``median_us``), its ratio
    to the hook pair in every run that had a positive one (``ratios``) and their median
    (``median``, None when no run had one: resnet50's hook pair lies inside its bare pass's
    spread)."""
    out = []
    for i, first in enumerate(runs[0]):
        same = [run[i] for run in runs]
        each = [ratio_to_pair(r) for r in same]
        kinds: dict[str, dict] = {}
        for k in _kinds_of_run(first):
            rs = [e[k] for e in each if k in e]
            us = [_us(r["per_call_us"], k) for r in same]
            kinds[k] = {"us": us, "median_us": statistics.median(us), "ratios": rs,
                        "median": statistics.median(rs) if rs else None}
        out.append({"model": first["model"], "runs": len(same), "kinds": kinds})
    return out


#: The line of the table for statistics-only capture less the parameter gradients' statistics.
LESS_PARAMS = "stats less param_stats"


def _print_run(r: dict) -> None:
    """One run's table: each kind timed, then statistics-only less the parameters' statistics."""
    print(f"\n{r['model']}: {r['calls']} leaf calls, bare forward+backward {r['bare_s'] * 1e3:.2f} ms (median)")
    print(f"  {'kind':<10} {'us/call':>8} {'x hook pair':>12}   {'min us/call':>11} {'x hook pair':>12}")
    labels = ("per_call_us", "per_call_us_min")
    ratios = [ratio_to_pair(r, label) for label in labels]
    for k in _kinds_of_run(r):
        cells = []
        for label, ratio in zip(labels, ratios):
            shown = f"{ratio[k]:.1f}x" if k in ratio else "-"
            cells.append(f"{_us(r[label], k):>8.1f} {shown:>12}")
        if k == LESS_PARAMS:
            print(f"  {LESS_PARAMS} (the baselines' work only): {cells[0]}   {cells[1]}", flush=True)
        else:
            target = f"  (target <= {TARGETS[k]:.0f}x)" if k in TARGETS else ""
            print(f"  {k:<10} {cells[0]}   {cells[1]:>24}{target}", flush=True)


def _print_over_runs(summary: list[dict]) -> None:
    for m in summary:
        print(f"\n{m['model']}, {m['runs']} runs: us per call (median over the runs), and each run's ratio to "
              f"its own hook pair (by the medians) with their median")
        for k, v in m["kinds"].items():
            target = f"  (target <= {TARGETS[k]:.0f}x)" if k in TARGETS else ""
            if k == "hook_pair":
                each = ", ".join(f"{x:.1f}" for x in v["us"])
                print(f"  {k:<23} {v['median_us']:>8.1f}   us per call in the runs: {each}")
            elif v["median"] is None:
                print(f"  {k:<23} {v['median_us']:>8.1f}   (no run's hook pair above its bare pass's spread)")
            else:
                each = ", ".join(f"{x:.2f}" for x in v["ratios"])
                print(f"  {k:<23} {v['median_us']:>8.1f}   median {v['median']:>5.2f}x   runs {each}{target}")
        sys.stdout.flush()


def _runs(argv: list[str], runs: int) -> list[list[dict]]:
    """The measurement of ``argv`` (without ``--runs``) in ``runs`` fresh processes, one after
    the other, each one's table printed as it ends; their rows."""
    out = []
    for i in range(runs):
        print(f"\n=== run {i + 1} of {runs} (a fresh process) ===", flush=True)
        done = subprocess.run([sys.executable, "-m", "benchmarks.call_overhead", *argv, "--json"],
                              capture_output=True, text=True, check=False, cwd=ROOT)
        lines = done.stdout.rstrip().splitlines()
        if done.returncode != 0 or not lines:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"run {i + 1} failed (exit {done.returncode})")
        print("\n".join(lines[:-1]), flush=True)
        out.append(json.loads(lines[-1]))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp:4,resnet50:1")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " + ", ".join(KINDS))
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch and numba threads (default 1)")
    ap.add_argument("--runs", type=int, default=1,
                    help="the whole measurement in this many fresh processes, then each ratio's median over them")
    ap.add_argument("--json", action="store_true", help="end with the figures as one line of JSON")
    args = ap.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error(f"unknown kind(s) {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.runs > 1:
        if "hook_pair" not in kinds:
            ap.error("--runs needs the hook_pair kind: each run's ratios are to its own hook pair")
        child = ["--models", args.models, "--repeats", str(args.repeats), "--kinds", ",".join(kinds),
                 "--clock", args.clock, "--threads", str(args.threads)]
        runs = _runs(child, args.runs)
        _print_over_runs(over_runs(runs))
        return [r for run in runs for r in run]
    os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # read when numba starts its threads
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU, {args.clock} clock, "
          f"median of {args.repeats}, interleaved", flush=True)
    rows = []
    for spec in args.models.split(","):
        r = measure(spec.strip(), args.repeats, kinds, args.clock)
        rows.append(r)
        _print_run(r)
    if args.json:
        print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
