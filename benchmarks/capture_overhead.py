"""Capture overhead: gradexplorer beside its peers, same model and batch, same run.

    python -m benchmarks.capture_overhead [--models resnet50:8,vit_b_16:4,efficientnet_b0:8]
                                          [--repeats 5] [--no-memory] [--kinds bare,stats,full]
                                          [--threads 1 --clock cpu]

Prints, per model, the median time of a bare forward + backward (the same
``torch.autograd.grad`` over the trainable parameters that capture runs), and the median
ratio to it of each kind below, timed interleaved in one process so that drift in machine
load hits them alike; then the peak resident memory of each kind, measured in a fresh
process (the model, one warm-up and one run). Kinds:

- ``stats``, ``full``: gradexplorer statistics-only and full capture of every leaf layer;
- ``read``: a forward hook per leaf that only reads the output once, and the gradient
  through a tensor hook (``torch.sum`` in float32, torch's multithreaded reduction): no
  statistic of those tensors can cost less, so this is the floor beneath ``stats``, and
  what ``stats`` costs above it is arithmetic (float64 sums) and bookkeeping, not memory;
- ``clone``: a naive forward hook per leaf that clones the output and, through a tensor
  hook, the gradient (what full capture must not cost more than);
- ``naive``: a forward hook per leaf computing each statistic separately, as a tutorial does;
- ``wandb``: a W&B-style ``watch(log="all")``: a 64-bin histogram (with min, max and the
  NaN/Inf filter) of every parameter and every parameter gradient;
- ``torchlens``: TorchLens ``trace`` saving every layer, with gradients (when installed);
- ``captum``: Captum ``LayerGradientXActivation`` over the convolutions and linears (when
  installed; it keeps no gradient and no statistics, so it is a floor rather than a peer).

Also the first-use compile time of the CPU statistics kernel (numba), from an empty cache
and from the on-disk cache. Random init, CPU, eval mode, float32; the target is the top-1
logit. Targets on the CPU: statistics-only <= 1.2x, full <= 1.4x. ``pip install
gradexplorer[bench]`` installs the optional peers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torchvision

from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.selection import leaf_names

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("bare", "stats", "full", "read", "clone", "naive", "wandb", "torchlens", "captum")
TARGETS = {"stats": 1.2, "full": 1.4}
#: Targets beside the floors of the same run: statistics-only at most this much above
#: ``read``, full capture at most this much above ``clone`` (in units of the bare pass).
FLOOR_TARGETS = {"stats": ("read", 0.08), "full": ("clone", 0.05)}


def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def bare(model, x):
    out = model(x)
    torch.autograd.grad(out.max(dim=1).values.sum(), _params(model))


def _leaf_hooks(model, hook):
    names = set(leaf_names(model))
    return [m.register_forward_hook(hook) for n, m in model.named_modules() if n in names]


def _with_hooks(model, x, hook):
    handles = _leaf_hooks(model, hook)
    try:
        bare(model, x)
    finally:
        for h in handles:
            h.remove()


def _per_tensor(model, x, fn):
    """A forward hook per leaf calling ``fn`` on its output and, through a tensor hook, on
    that output's gradient; what ``fn`` returned, kept until the end."""
    got = []

    def hook(module, inputs, output):
        if isinstance(output, torch.Tensor):
            got.append(fn(output.detach()))
            if output.requires_grad:
                output.register_hook(lambda g: got.append(fn(g.detach())))

    _with_hooks(model, x, hook)
    return got


def read(model, x):
    """Each output and gradient read once (a float32 sum)."""
    return _per_tensor(model, x, torch.sum)


def clone(model, x):
    """A clone of each output and of its gradient, kept."""
    return _per_tensor(model, x, torch.clone)


def naive(model, x):
    """Every statistic of each output and gradient computed separately, as in a tutorial."""

    def stats(t):
        t = t.detach()
        return [t.numel(), t.min().item(), t.max().item(), t.mean().item(), t.std().item(),
                t.abs().mean().item(), t.norm().item(), (t == 0).float().mean().item(),
                torch.isnan(t).sum().item(), torch.isinf(t).sum().item(),
                torch.histc(t.float(), 64, t.min().item(), t.max().item())]

    return _per_tensor(model, x, stats)


def _wandb_histogram(t: torch.Tensor):
    """What wandb.watch logs per tensor: NaN/Inf dropped, min, max, histc of 64 bins."""
    flat = t.detach().reshape(-1).float().cpu()
    flat = flat[torch.isfinite(flat)]
    if not flat.numel():
        return None
    lo, hi = flat.min().item(), flat.max().item()
    return torch.histc(flat, bins=64, min=lo, max=hi), torch.linspace(lo, hi, 65)


def wandb_style(model, x):
    """``wandb.watch(model, log="all", log_freq=1)``: a histogram of every parameter (at
    forward) and of every parameter gradient (a tensor hook on each parameter)."""
    logged = []
    handles = [p.register_hook(lambda g: logged.append(_wandb_histogram(g))) for p in _params(model)]

    def on_forward(module, inputs, output):
        for p in module.parameters():
            logged.append(_wandb_histogram(p))

    handles.append(model.register_forward_hook(on_forward))
    try:
        bare(model, x)
    finally:
        for h in handles:
            h.remove()
    return logged


def _torchlens():
    import torchlens
    from torchlens.options import CaptureOptions

    def run(model, x):
        trace = torchlens.trace(model, x, capture=CaptureOptions(layers_to_save="all", save_grads=True))
        out = trace[trace.output_layers[0]].out
        trace.backward(out.max(dim=1).values.sum())
        for p in model.parameters():  # Trace.backward accumulates into .grad
            p.grad = None
        return trace

    return run


def _captum(model):
    from captum.attr import LayerGradientXActivation

    # MultiheadAttention's out_proj is used through F.multi_head_attention_forward, never
    # called: its hooks would never fire (Captum then fails).
    inside_mha = {id(c) for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention) for c in m.modules()}
    layers = [m for m in model.modules()
              if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) and id(m) not in inside_mha]
    lgxa = LayerGradientXActivation(model, layers)

    def run(model, x):
        return lgxa.attribute(x, target=0)

    return run


def markdown_table(rows: list[dict], kinds) -> str:
    """The figures of ``main`` as the Markdown table of docs/benchmarks.md."""
    shown = [k for k in kinds if k != "bare"]
    lines = ["| model | bare | " + " | ".join(shown) + " |", "|---" * (len(shown) + 2) + "|"]
    for r in rows:
        cells = [f"{r[k + '_x']:.2f}x" if k + "_x" in r else "-" for k in shown]
        lines.append(f"| {r['model']} b{r['batch']} | {r['bare_s']:.2f} s | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def make_kind(kind: str, model):
    """The callable ``fn(model, x)`` of a kind, or ``None`` when its package is missing."""
    simple = {"bare": bare, "read": read, "clone": clone, "naive": naive, "wandb": wandb_style,
              "stats": lambda m, x: capture(m, x, mode="stats"),
              "full": lambda m, x: capture(m, x, mode="full")}
    if kind in simple:
        return simple[kind]
    try:
        return _torchlens() if kind == "torchlens" else _captum(model)
    except ImportError:
        return None


def _model(name: str):
    torch.manual_seed(0)
    return torchvision.models.get_model(name).eval()


def measure(name: str, batch: int, repeats: int, kinds=KINDS, clock: str = "wall") -> dict:
    """Median seconds of ``bare`` and the median ratio of every other installed kind.
    ``clock="cpu"``: the process's CPU time instead of the wall clock (with one thread, the
    work done, which other jobs on the machine do not inflate as they do the wall clock)."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    model = _model(name)
    x = torch.randn(batch, 3, 224, 224)
    fns = {k: make_kind(k, model) for k in kinds}
    missing = [k for k, f in fns.items() if f is None]
    fns = {k: f for k, f in fns.items() if f is not None}
    failed: dict[str, str] = {}

    def peer_failed(k: str, exc: Exception) -> None:
        # A peer that refuses (TorchLens's save budget on vit_b_16) is reported, and the
        # others are still measured; gradexplorer's own kinds must run.
        if k in ("bare", *TARGETS):
            raise exc
        failed[k] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        del fns[k]

    for k, fn in list(fns.items()):
        try:
            fn(model, x)  # warm-up
        except Exception as exc:  # noqa: BLE001 - reported per peer
            peer_failed(k, exc)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in list(fns.items()):
            if k == "bare" and len(fns) > 1:
                # Settle first: after the previous repeat's last peer (TorchLens's 10 GB on
                # resnet50) the allocator's state made the next bare pass 40% slower, and
                # every ratio of that run with it.
                fn(model, x)
            t0 = timer()
            try:
                result = fn(model, x)
            except Exception as exc:  # noqa: BLE001 - reported per peer
                peer_failed(k, exc)
                continue
            times[k].append(timer() - t0)
            del result
    med = {k: statistics.median(times[k]) for k in fns}
    out = {"model": name, "batch": batch, "layers": len(leaf_names(model)), "bare_s": med["bare"],
           "missing": missing, "failed": failed}
    out.update({f"{k}_x": med[k] / med["bare"] for k in fns if k != "bare"})
    return out


def peak_rss_mib(name: str, batch: int, kind: str) -> float | None:
    """Peak resident memory (MiB) of a fresh process while it runs ``kind`` twice on the
    model (the peak is reset after the imports and the model are built, so that it is the
    run's; where the kernel does not allow that, the process's peak); ``None`` when the
    kind is not installed."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.capture_overhead", "--child", kind,
                           "--models", f"{name}:{batch}"], check=False, capture_output=True, text=True, cwd=ROOT,
                          timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]


def _vm_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _child(kind: str, spec: str) -> None:
    import resource

    name, _, b = spec.partition(":")
    model = _model(name)
    fn = make_kind(kind, model)
    if fn is None:
        print(json.dumps({"peak_mib": None}))
        return
    x = torch.randn(int(b or 1), 3, 224, 224)
    with contextlib.suppress(OSError):
        # "5" resets the peak RSS (VmHWM) to the current RSS: what follows is the run's peak.
        Path("/proc/self/clear_refs").write_text("5")
    for _ in range(2):
        result = fn(model, x)
        del result
    hwm = _vm_kib("VmHWM")
    peak = hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": peak / 1024}))


def compile_seconds() -> dict:
    """First use of the numba statistics kernel in a fresh process: from an empty cache
    (compiling) and from the on-disk cache that run wrote (loading). Empty when numba is
    missing."""
    code = ("import json, time, torch; t = time.perf_counter(); from gradexplorer.stats import cpu as cpu_stats; "
            "ok = cpu_stats.available() and cpu_stats.summarize(torch.randn(100_000), 1 << 14) is not None; "
            "print(json.dumps({'ok': bool(ok), 'seconds': time.perf_counter() - t}))")
    out = {}
    with tempfile.TemporaryDirectory() as empty:
        env = dict(os.environ, NUMBA_CACHE_DIR=empty)
        for label in ("cold", "cached"):
            done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT,
                                  env=env, timeout=600)
            if done.returncode == 0:
                r = json.loads(done.stdout.strip().splitlines()[-1])
                if r["ok"]:
                    out[label] = r["seconds"]
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50:8,vit_b_16:4,efficientnet_b0:8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak memory")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch and numba threads (default: torch's default); 1 with --clock cpu on a shared machine")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time the process's CPU time (meaningful with --threads 1 while other jobs run)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="comma-separated kinds to time (bare is always timed): " + ", ".join(KINDS))
    ap.add_argument("--markdown", action="store_true", help="also print the figures as a Markdown table")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.models)
        return []
    if args.threads:
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # read when numba starts its threads
        torch.set_num_threads(args.threads)
    compiled = compile_seconds()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, {args.clock} clock; "
          "statistics kernel first use: "
          + (f"{compiled.get('cold', float('nan')):.1f} s compiling, {compiled.get('cached', float('nan')):.2f} s "
             "from the cache" if compiled else "numba missing, torch operations"), flush=True)
    asked = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in asked if k not in KINDS]
    if unknown:
        ap.error(f"unknown kind(s) {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    kinds = ("bare", *(k for k in KINDS if k != "bare" and k in asked))
    rows = []
    for spec in args.models.split(","):
        name, _, b = spec.partition(":")
        r = measure(name, int(b or 1), args.repeats, kinds, args.clock)
        if not args.no_memory:
            r["peak_mib"], r["memory_failed"] = {}, {}
            for k in kinds:
                if k in r["missing"] or k in r["failed"]:
                    continue
                try:
                    r["peak_mib"][k] = peak_rss_mib(name, r["batch"], k)
                except RuntimeError as exc:
                    # A peer that refuses in the fresh process (TorchLens's save budget) is
                    # reported beside its time; gradexplorer's own kinds must run.
                    if k in ("bare", *TARGETS):
                        raise
                    r["memory_failed"][k] = str(exc).strip()
        rows.append(r)
        print(f"\n{name} batch {r['batch']} ({r['layers']} leaves): bare forward+backward {r['bare_s']:.2f} s")
        for k in kinds:
            if k in r["missing"]:
                print(f"  {k:<10} not installed")
                continue
            if k in r["failed"]:
                print(f"  {k:<10} failed: {r['failed'][k]}")
                continue
            ratio = "1.00x" if k == "bare" else f"{r[k + '_x']:.2f}x"
            mem = r.get("peak_mib", {}).get(k)
            target = f"  (target <= {TARGETS[k]}x)" if k in TARGETS else ""
            why = r.get("memory_failed", {}).get(k)
            memory = f"   peak RSS {mem:,.0f} MiB" if mem else (f"   peak RSS not measured: {why}" if why else "")
            print(f"  {k:<10} {ratio:>7}" + memory + target, flush=True)
        for k, (floor, most) in FLOOR_TARGETS.items():
            if f"{k}_x" in r and f"{floor}_x" in r:
                above = r[f"{k}_x"] - r[f"{floor}_x"]
                verdict = "met" if above <= most else "NOT met"
                print(f"  {k} - {floor}: {above:+.2f}x (target <= +{most:.2f}x: {verdict})", flush=True)
    print(f"\nmedian of repeats, interleaved, ratio to the bare forward+backward of the same run ({args.clock} clock)")
    if args.markdown:
        print("\n" + markdown_table(rows, kinds))
    return rows


if __name__ == "__main__":
    main()
