"""GPU check: captures on the GPU equal captures on the CPU, copies are synchronised, and
what capture costs on the GPU.

    python scripts/gpu_check.py [--quick]

Where CUDA exists: resnet50 (batch 8) and vit_b_16 (batch 4), random init with the same
weights and input, captured on cuda:0 and on the CPU (TF32 off, cuDNN deterministic);
every captured tensor (activations, gradients, parameter gradients, input gradient) and
every statistic compared within float tolerance, statistics-only GPU captures against the
CPU statistics too; the captured tensors of the GPU run compared with a plain synchronous
``.cpu()`` of the same values recomputed on the GPU (garbage from an unsynchronised
``non_blocking`` copy would differ); and the median time of a bare forward + backward,
statistics-only and full capture on the GPU, with ``torch.cuda.synchronize()`` around each.
Exit status 0 when every check passes. Where CUDA is absent it says so and exits 0.
Needs nothing but the project (``pip install -e .``); runs in well under five minutes.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TENSOR_TOL = 2e-3  # max |gpu - cpu| relative to max |cpu| of the tensor
STAT_TOL = 2e-3
HIST_TOL = 0.03  # share of the elements whose bin differs


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are zero); infinite when shapes differ."""
    if a.shape != b.shape:
        return math.inf
    a, b = a.double(), b.double()
    finite = torch.isfinite(b)
    if not torch.equal(finite, torch.isfinite(a)):
        return math.inf
    scale = b[finite].abs().max().item() if finite.any() else 0.0
    diff = (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0
    return diff / scale if scale > 0 else diff


def stats_error(a: dict | None, b: dict | None) -> float:
    """The largest relative disagreement between two statistics dicts."""
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    if a["numel"] != b["numel"] or a["nan_count"] != b["nan_count"] or a["inf_count"] != b["inf_count"]:
        return math.inf
    if b["numel"] == 0:
        return 0.0
    scale = max(abs(b["min"]), abs(b["max"]), 1e-30)
    worst = 0.0
    for key in ("min", "max", "mean", "std", "mean_abs"):
        if math.isnan(b[key]) and math.isnan(a[key]):
            continue
        worst = max(worst, abs(a[key] - b[key]) / scale)
    worst = max(worst, abs(a["l2"] - b["l2"]) / max(abs(b["l2"]), 1e-30))
    worst = max(worst, abs(a["zero_fraction"] - b["zero_fraction"]) / 10)  # ReLU ties may flip
    if a["hist_exact"] and b["hist_exact"]:
        moved = (a["hist"] - b["hist"]).abs().sum().item() / 2 / max(b["numel"], 1)
        worst = max(worst, moved * STAT_TOL / HIST_TOL)
    return worst


def compare_captures(gpu, cpu, tensors: bool = True) -> tuple[float, float, str]:
    """(largest tensor error, largest statistics error, where) between two captures of the
    same model and batch."""
    worst_t, worst_s, where = 0.0, 0.0, ""
    if list(gpu.layers) != list(cpu.layers):
        return math.inf, math.inf, "different layers"

    def see_t(err, name):
        nonlocal worst_t, where
        if err > worst_t:
            worst_t, where = err, name

    def see_s(err, name):
        nonlocal worst_s, where
        if err > worst_s:
            worst_s = err
            if worst_s > STAT_TOL:
                where = name

    for name, i, c in cpu.iter_calls():
        g = gpu[name].calls[i]
        for kind in ("activation", "grad_output", "grad_input"):
            if tensors:
                a, b = g.tensor(kind), c.tensor(kind)
                if (a is None) != (b is None):
                    see_t(math.inf, f"{name}[{i}].{kind}")
                elif a is not None:
                    see_t(rel_error(a, b), f"{name}[{i}].{kind}")
            see_s(stats_error(g.stats[kind], c.stats[kind]), f"{name}[{i}].stats.{kind}")
    for name, layer in cpu.layers.items():
        for p, b in layer.param_grads.items():
            a = gpu[name].param_grads.get(p)
            if tensors and b is not None:
                see_t(math.inf if a is None else rel_error(a, b), f"{name}.{p}.grad")
            see_s(stats_error(gpu[name].param_stats.get(p), layer.param_stats[p]), f"{name}.{p}.stats")
    if tensors and cpu.input_grad is not None:
        see_t(rel_error(gpu.input_grad, cpu.input_grad), "input_grad")
    if tensors:
        see_t(rel_error(gpu.output, cpu.output), "output")
    return worst_t, worst_s, where


def recomputed_on_gpu(model, x, names):
    """Activations of ``names`` (first call) and parameter gradients for the top1 target,
    computed where ``model`` is, without gradexplorer's capture, and copied with a plain
    synchronous ``.cpu()``."""
    from core.capture import primary_tensor

    acts = {}

    def keep(name):
        def hook(module, args, output):
            if name not in acts:  # the first call, before any later in-place change
                acts[name] = primary_tensor(output)[1].detach().clone()
        return hook

    handles = [model.get_submodule(n).register_forward_hook(keep(n)) for n in names]
    try:
        out = model(x)
    finally:
        for h in handles:
            h.remove()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.max(dim=1).values.sum(), params)
    names_of = {id(p): n for n, p in model.named_parameters()}
    return ({n: t.cpu() for n, t in acts.items()},
            {names_of[id(p)]: g.cpu() for p, g in zip(params, grads)})


def _median(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_model(name: str, batch: int, repeats: int) -> bool:
    import torchvision

    from core.capture import capture

    torch.manual_seed(0)
    cpu_model = torchvision.models.get_model(name).eval()
    gpu_model = copy.deepcopy(cpu_model).cuda()
    x = torch.randn(batch, 3, 224, 224)
    xg = x.cuda()
    ok = True

    t0 = time.perf_counter()
    cap_cpu = capture(cpu_model, x, mode="full", input_grad=True)
    t_cpu = time.perf_counter() - t0
    cap_gpu = capture(gpu_model, xg, mode="full", input_grad=True)
    stats_gpu = capture(gpu_model, xg, mode="stats", input_grad=True)
    # The device= path: a CPU model moved to the GPU for the run and moved back.
    moved = capture(copy.deepcopy(cpu_model), x, mode="stats", device="cuda:0", layers=["*.conv1", "*.ln_1"]
                    if name.startswith("vit") else ["*.conv1"])
    errors = {
        "full (tensors)": None, "full (stats)": None, "stats-only (stats)": None, "device= (stats)": None,
    }
    t_err, s_err, where = compare_captures(cap_gpu, cap_cpu)
    errors["full (tensors)"], errors["full (stats)"] = (t_err, where), (s_err, where)
    _t, s2, where2 = compare_captures(stats_gpu, cap_cpu, tensors=False)
    errors["stats-only (stats)"] = (s2, where2)
    sub = copy.copy(cap_cpu)
    sub.layers = {n: cap_cpu.layers[n] for n in moved.layers}
    _t, s3, where3 = compare_captures(moved, sub, tensors=False)
    errors["device= (stats)"] = (s3, where3)
    n_tensors = sum(1 for _n, _i, c in cap_cpu.iter_calls() for k in ("activation", "grad_output", "grad_input")
                    if c.tensor(k) is not None)
    print(f"{name} batch {batch}: {len(cap_cpu)} layers, {n_tensors} call tensors; CPU capture {t_cpu:.1f} s")
    for label, (err, at) in errors.items():
        tol = TENSOR_TOL if "tensors" in label else STAT_TOL
        good = err <= tol
        ok &= good
        print(f"  GPU vs CPU {label:<20} max rel error {err:.2e} (tolerance {tol:.0e}) "
              f"{'ok' if good else 'FAIL at ' + at}")

    # Synchronisation: the GPU capture's CPU tensors equal a synchronous copy of the same
    # values recomputed on the GPU.
    names = [n for n in cap_gpu.layers if cap_gpu[n].calls and cap_gpu[n].calls[0].activation is not None]
    acts, grads = recomputed_on_gpu(gpu_model, xg, names)
    worst = 0.0
    for n in names:
        worst = max(worst, rel_error(cap_gpu[n].calls[0].activation, acts[n]))
    for n, layer in cap_gpu.layers.items():
        for p, g in layer.param_grads.items():
            if g is not None:
                worst = max(worst, rel_error(g, grads[f"{n}.{p}" if n else p]))
    good = worst <= 1e-5
    ok &= good
    print(f"  device->host copies vs synchronous .cpu() of recomputed values: max rel error {worst:.1e} "
          f"{'ok' if good else 'FAIL (unsynchronised copy?)'}")

    params = [p for p in gpu_model.parameters() if p.requires_grad]

    def bare():
        out = gpu_model(xg)
        torch.autograd.grad(out.max(dim=1).values.sum(), params)

    t_bare = _median(bare, repeats)
    t_stats = _median(lambda: capture(gpu_model, xg, mode="stats"), repeats)
    t_full = _median(lambda: capture(gpu_model, xg, mode="full"), repeats)
    print(f"  GPU overhead: bare forward+backward {t_bare * 1000:.1f} ms; statistics-only "
          f"{t_stats / t_bare:.2f}x; full {t_full / t_bare:.2f}x (median of {repeats})")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer timing repeats")
    ap.add_argument("--models", default="resnet50:8,vit_b_16:4")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to check")
        return 0
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, TF32 off, cuDNN deterministic")
    t0 = time.perf_counter()
    ok = True
    for spec in args.models.split(","):
        name, _, b = spec.partition(":")
        ok &= check_model(name, int(b or 1), 3 if args.quick else 10)
    print(f"{'all checks passed' if ok else 'SOME CHECKS FAILED'} in {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
