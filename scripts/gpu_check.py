"""GPU check: captures on the GPU equal captures on the CPU, copies are synchronised, and
what capture costs on the GPU.

    python scripts/gpu_check.py [--quick] [--models resnet50:8:64,vit_b_16:4:16]

Where CUDA exists: resnet50 (batch 8) and vit_b_16 (batch 4), random init with BatchNorm
statistics measured on random batches (``well_conditioned``), the same weights and input,
captured on cuda:0 and on the CPU (TF32 off, cuDNN deterministic) for a fixed class
target; every captured tensor (activations, gradients, parameter gradients, input
gradient) and every statistic compared within float tolerance, statistics-only GPU
captures and a ``device="cuda:0"`` run of the CPU model against the CPU statistics too;
the captured tensors of the GPU run compared with a plain synchronous ``.cpu()`` of the
same values recomputed on the GPU (garbage from an unfinished ``non_blocking`` copy would
differ); and the median time of a bare forward + backward, statistics-only and full
capture on the GPU, with ``torch.cuda.synchronize()`` around each, at the checked batch
and at a larger one (the third field of ``--models``), and of full capture that keeps its
tensors on the GPU (``keep_on_device``), whose tensors are checked against the host
copies. Exit status 0 when every check passes. Where CUDA is absent it says so and exits 0.
Needs nothing but the project; runs in about a minute on an H200.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TENSOR_TOL = 2e-3  # max |a - b| relative to max |b| of the tensor (float32 comparisons)
TENSOR_TOL_64 = 1e-9  # the same, float64 GPU against float64 CPU
STAT_TOL_32 = 1e-4  # float32 statistics of the same values, by two code paths
STAT_TOL = 2e-3
HIST_TOL = 0.03  # share of the elements whose bin differs
TARGET_CLASS = 7


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
        # Values on a bin edge may land one bin over (rounding): two elements are free.
        moved = max((a["hist"] - b["hist"]).abs().sum().item() / 2 - 2, 0) / max(b["numel"], 1)
        worst = max(worst, moved * STAT_TOL / HIST_TOL)
    return worst


def compare_captures(gpu, cpu, tensors: bool = True) -> tuple[float, float, str, str]:
    """(largest tensor error, largest statistics error, where each is) between two captures
    of the same model and batch."""
    worst = {"t": 0.0, "s": 0.0}
    where = {"t": "", "s": ""}
    if list(gpu.layers) != list(cpu.layers):
        return math.inf, math.inf, "different layers", "different layers"

    def see(kind, err, name):
        if err > worst[kind]:
            worst[kind], where[kind] = err, name

    for name, i, c in cpu.iter_calls():
        g = gpu[name].calls[i]
        for kind in ("activation", "grad_output", "grad_input"):
            if tensors:
                a, b = g.tensor(kind), c.tensor(kind)
                if (a is None) != (b is None):
                    see("t", math.inf, f"{name}[{i}].{kind}")
                elif a is not None:
                    see("t", rel_error(a, b), f"{name}[{i}].{kind}")
            see("s", stats_error(g.stats[kind], c.stats[kind]), f"{name}[{i}].stats.{kind}")
    for name, layer in cpu.layers.items():
        for p, b in layer.param_grads.items():
            a = gpu[name].param_grads.get(p)
            if tensors and b is not None:
                see("t", math.inf if a is None else rel_error(a, b), f"{name}.{p}.grad")
            see("s", stats_error(gpu[name].param_stats.get(p), layer.param_stats[p]), f"{name}.{p}.stats")
    if tensors and cpu.input_grad is not None:
        see("t", rel_error(gpu.input_grad, cpu.input_grad), "input_grad")
    if tensors:
        see("t", rel_error(gpu.output, cpu.output), "output")
    return worst["t"], worst["s"], where["t"], where["s"]


def target_scalar(out: torch.Tensor) -> torch.Tensor:
    """The check's target, ``class:TARGET_CLASS``: a fixed class, so that a near tie between
    two logits cannot send the GPU and CPU gradients down different classes (top1 can)."""
    return out[:, TARGET_CLASS].sum()


def recomputed_on_gpu(model, x, names):
    """Activations of ``names`` (first call) and parameter gradients for the check's target,
    computed where ``model`` is, without gradexplorer's capture, and copied with a plain
    synchronous ``.cpu()``."""
    from gradexplorer.capturing.capture import primary_tensor

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
    grads = torch.autograd.grad(target_scalar(out), params)
    names_of = {id(p): n for n, p in model.named_parameters()}
    return ({n: t.cpu() for n, t in acts.items()},
            {names_of[id(p)]: g.cpu() for p, g in zip(params, grads)})


def well_conditioned(model: torch.nn.Module, size: int, batches: int = 4) -> torch.nn.Module:
    """``model`` in eval mode with BatchNorm running statistics measured on random batches.

    Freshly initialised BatchNorm (mean 0, variance 1) normalises nothing: activations grow
    block after block and GPU and CPU rounding differences grow with them, which a trained
    network does not do. Measured statistics make the random network behave like one.
    """
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if bns:
        for m in bns:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the calibration batches
        model.train()
        with torch.no_grad():
            for _ in range(batches):
                model(torch.randn(8, 3, size, size))
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(fn, repeats: int, device: torch.device) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stats_path(device: torch.device) -> str:
    """How statistics are computed on ``device``: fused kernels or torch operations."""
    from gradexplorer.stats import device as device_stats

    if device.type == "cuda" and device_stats.fused_available():
        return "fused Triton kernels"
    return "torch operations"


def own_stats_error(cap) -> tuple[float, str]:
    """The largest disagreement between a full capture's statistics and ``tensor_stats`` of
    its own captured tensors: the device's statistics path (the fused kernels on a GPU)
    against the CPU's, on exactly the same values."""
    from gradexplorer.stats.tensor_stats import tensor_stats

    worst, at = 0.0, ""
    for name, i, call in cap.iter_calls():
        for kind in ("activation", "grad_output", "grad_input"):
            t = call.tensor(kind)
            if t is not None:
                err = stats_error(call.stats[kind], tensor_stats(t))
                if err > worst:
                    worst, at = err, f"{name}[{i}].stats.{kind}"
    for name, layer in cap.layers.items():
        for p, g in layer.param_grads.items():
            if g is not None:
                err = stats_error(layer.param_stats[p], tensor_stats(g))
                if err > worst:
                    worst, at = err, f"{name}.{p}.stats"
    return worst, at


def relative_l2(gpu, cpu) -> tuple[float, str]:
    """The worst ||a - b|| / ||b|| over the captured tensors of two full captures."""
    worst, at = 0.0, ""
    for name, i, c in cpu.iter_calls():
        for kind in ("activation", "grad_output", "grad_input"):
            a, b = gpu[name].calls[i].tensor(kind), c.tensor(kind)
            if a is not None and b is not None and b.norm() > 0:
                err = float((a.double() - b.double()).norm() / b.double().norm())
                if err > worst:
                    worst, at = err, f"{name}[{i}].{kind}"
    return worst, at


def check_model(name: str, batch: int, repeats: int, device: str = "cuda:0", size: int = 224,
                timing_batch: int = 0) -> bool:
    """Capture ``name`` on ``device`` and on the CPU, compare, check the copies, time.

    The device-against-CPU comparison runs in float64. In float32 the two devices round
    differently, and where a ReLU's input is within rounding of zero its gradient is on on
    one device and off on the other: resnet50 at batch 8 had 34 of 802,816 elements of one
    gradient flipped so, a "max relative error" of 0.99 with both captures right (float64:
    1.7e-13). The float32 run checks what float64 cannot reach: the fused statistics
    kernels against ``tensor_stats`` of the same captured values, and the copies to the host.

    With ``device="cpu"`` the same steps compare two CPU captures: what the tests run where
    there is no GPU, so that the script's own code is exercised everywhere.
    """
    import torchvision

    from gradexplorer.capturing.capture import capture
    from gradexplorer.capturing.selection import leaf_names

    dev = torch.device(device)
    target = f"class:{TARGET_CLASS}"
    torch.manual_seed(0)
    model32 = well_conditioned(torchvision.models.get_model(name), size)
    x32 = torch.randn(batch, 3, size, size)
    ok = True

    # float64: the capture on the device equals the capture on the CPU.
    cpu_model = copy.deepcopy(model32).double()
    dev_model = copy.deepcopy(cpu_model).to(dev)
    x = x32.double()
    t0 = time.perf_counter()
    cap_cpu = capture(cpu_model, x, mode="full", input_grad=True, target=target)
    t_cpu = time.perf_counter() - t0
    cap_dev = capture(dev_model, x.to(dev), mode="full", input_grad=True, target=target)
    stats_dev = capture(dev_model, x.to(dev), mode="stats", input_grad=True, target=target)
    # The device= path: a CPU model moved to the device for the run, and moved back.
    some = leaf_names(cpu_model)[::7]
    moved_model = copy.deepcopy(cpu_model)
    moved = capture(moved_model, x, mode="stats", device=device, layers=some, target=target, input_grad=True)
    back = next(moved_model.parameters()).device.type == "cpu"
    del dev_model

    t_err, s_err, t_at, s_at = compare_captures(cap_dev, cap_cpu)
    _t, s2, _w, s2_at = compare_captures(stats_dev, cap_cpu, tensors=False)
    sub = copy.copy(cap_cpu)
    sub.layers = {n: cap_cpu.layers[n] for n in moved.layers}
    _t, s3, _w, s3_at = compare_captures(moved, sub, tensors=False)

    # float32: the device's statistics (fused kernels) against tensor_stats of the same
    # values, statistics-only against full, and the copies against synchronous ones.
    dev_model = copy.deepcopy(model32).to(dev)
    xd = x32.to(dev)
    full32 = capture(dev_model, xd, mode="full", input_grad=True, target=target)
    stats32 = capture(dev_model, xd, mode="stats", input_grad=True, target=target)
    own, own_at = own_stats_error(full32)
    _t, s4, _w, s4_at = compare_captures(stats32, full32, tensors=False)
    checks = [
        ("float64 full capture, tensors", t_err, t_at, TENSOR_TOL_64),
        ("float64 full capture, statistics", s_err, s_at, STAT_TOL),
        ("float64 statistics-only", s2, s2_at, STAT_TOL),
        (f"float64 device= ({len(some)} layers)", s3, s3_at, STAT_TOL),
    ]
    n_tensors = sum(1 for _n, _i, c in cap_cpu.iter_calls() for k in ("activation", "grad_output", "grad_input")
                    if c.tensor(k) is not None)
    print(f"{name} batch {batch}: {len(cap_cpu)} layers, {n_tensors} call tensors, target {target}; "
          f"CPU capture (float64) {t_cpu:.1f} s; float32 statistics on {dev} by {stats_path(dev)}")
    for label, err, at, tol in checks:
        good = err <= tol
        ok &= good
        print(f"  {dev} vs CPU, {label:<34} max rel error {err:.2e} (tolerance {tol:.0e}) "
              f"{'ok' if good else 'FAIL at ' + at}")
    for label, err, at in (("statistics vs tensor_stats of its tensors", own, own_at),
                           ("statistics-only vs full capture", s4, s4_at)):
        good = err <= STAT_TOL_32
        ok &= good
        print(f"  {dev} float32, {label:<40} max rel error {err:.2e} (tolerance {STAT_TOL_32:.0e}) "
              f"{'ok' if good else 'FAIL at ' + at}")
    ok &= back
    print(f"  device= run left the model on the CPU: {'ok' if back else 'FAIL'}")

    # Synchronisation: the captured tensors equal a synchronous copy of the same values
    # recomputed on the device (garbage from an unfinished non_blocking copy would differ).
    cap_dev = full32
    names = [n for n in cap_dev.layers if cap_dev[n].calls and cap_dev[n].calls[0].activation is not None]
    acts, grads = recomputed_on_gpu(dev_model, xd, names)
    worst = 0.0
    for n in names:
        worst = max(worst, rel_error(cap_dev[n].calls[0].activation, acts[n]))
    for n, layer in cap_dev.layers.items():
        for p, g in layer.param_grads.items():
            if g is not None:
                worst = max(worst, rel_error(g, grads[f"{n}.{p}" if n else p]))
    good = worst <= 1e-5
    ok &= good
    print(f"  device->host copies vs synchronous .cpu() of recomputed values: max rel error {worst:.1e} "
          f"{'ok' if good else 'FAIL (unsynchronised copy?)'}")
    l2, l2_at = relative_l2(full32, capture(model32, x32, mode="full", input_grad=True, target=target))
    print(f"  (information) float32 {dev} vs CPU: worst relative L2 error {l2:.1e} at {l2_at or '-'}")

    for b in [batch] + ([timing_batch] if timing_batch else []):
        xb = torch.randn(b, 3, size, size, device=dev)
        params = [p for p in dev_model.parameters() if p.requires_grad]

        def bare():
            out = dev_model(xb)
            torch.autograd.grad(target_scalar(out), params)

        t_bare = _median(bare, repeats, dev)
        t_stats = _median(lambda: capture(dev_model, xb, mode="stats", target=target), repeats, dev)
        t_full = _median(lambda: capture(dev_model, xb, mode="full", target=target), max(repeats // 3, 1), dev)
        t_kept = _median(lambda: capture(dev_model, xb, mode="full", target=target, keep_on_device=True),
                         max(repeats // 3, 1), dev)
        kept = capture(dev_model, xb, mode="full", target=target, keep_on_device=True)
        kept_count = sum(1 for _ in kept.tensors())
        stayed = sum(t.is_cuda for t in kept.tensors())
        kept_err, kept_stat_err, kept_at, kept_stat_at = compare_captures(
            kept.on_host(), capture(dev_model, xb, mode="full", target=target))
        kept_good = kept_err <= TENSOR_TOL and kept_stat_err <= STAT_TOL
        ok &= kept_good
        del kept
        # Batched statistics (gradexplorer.stats.batched): the gradients, the parameters' gradients and
        # the outputs the last capture saw unchanged, summarised together in a few launches.
        plain = capture(dev_model, xb, mode="stats", target=target)
        # "all": the CPU tensors too, so that this script's run on the CPU (its test) takes
        # the batched path; a GPU capture has none.
        os.environ["GRADEXPLORER_BATCHED_STATS"] = "all"
        try:
            t_batched = _median(lambda: capture(dev_model, xb, mode="stats", target=target), repeats, dev)
            t_kept_batched = _median(
                lambda: capture(dev_model, xb, mode="full", target=target, keep_on_device=True),
                max(repeats // 3, 1), dev)
            _, batched_err, _, batched_at = compare_captures(
                capture(dev_model, xb, mode="stats", target=target), plain, tensors=False)
        finally:
            del os.environ["GRADEXPLORER_BATCHED_STATS"]
        batched_good = batched_err <= STAT_TOL
        ok &= batched_good
        print(f"  overhead on {dev}, batch {b}: bare forward+backward {t_bare * 1000:.1f} ms; "
              f"statistics-only {t_stats / t_bare:.2f}x ({t_stats * 1000:.0f} ms), with batched "
              f"statistics {t_batched / t_bare:.2f}x ({t_batched * 1000:.0f} ms; against the per-tensor "
              f"kernels: max rel error {batched_err:.1e} {'ok' if batched_good else 'FAIL at ' + batched_at}); "
              f"full {t_full / t_bare:.2f}x ({t_full * 1000:.0f} ms); "
              f"full kept on the device {t_kept / t_bare:.2f}x ({t_kept * 1000:.0f} ms, {stayed} of "
              f"{kept_count} tensors stayed there; equal to the host copies: "
              f"max rel error {kept_err:.1e} {'ok' if kept_good else 'FAIL at ' + (kept_at or kept_stat_at)}), "
              f"with batched statistics {t_kept_batched / t_bare:.2f}x ({t_kept_batched * 1000:.0f} ms)")
        print("    targets on a GPU: statistics-only <= 1.5x at the small batch, <= 1.15x at the large one; "
              "full kept on the device <= 1.3x")
        ok &= batched_against_per_tensor(dev_model, xb, repeats, dev)
    return ok


def batched_against_per_tensor(model, x, repeats: int, dev: torch.device) -> bool:
    """The gradients at every leaf output of one backward, summarised one by one as capture
    does (``DeferredStats``: the fused kernels on a GPU) and all together
    (``gradexplorer.stats.batched``): the time of each, and the batched numbers against
    ``tensor_stats`` of the same tensors."""
    from gradexplorer.capturing.selection import leaf_names
    from gradexplorer.stats.batched import batched_stats
    from gradexplorer.stats.device import DeferredStats
    from gradexplorer.stats.moments import HIST_EXACT_LIMIT
    from gradexplorer.stats.tensor_stats import tensor_stats

    grads: list[torch.Tensor] = []
    leaves = set(leaf_names(model))

    def keep(module, args, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda g: grads.append(g.detach()))

    handles = [m.register_forward_hook(keep) for n, m in model.named_modules() if n in leaves]
    try:
        out = model(x)
        torch.autograd.grad(target_scalar(out), [p for p in model.parameters() if p.requires_grad])
    finally:
        for h in handles:
            h.remove()

    def one_by_one():
        deferred = DeferredStats(HIST_EXACT_LIMIT)
        for g in grads:
            deferred.summarize(g)
        deferred.resolve()

    t_each = _median(one_by_one, repeats, dev)
    t_all = _median(lambda: batched_stats(grads), repeats, dev)
    worst = max((stats_error(b, tensor_stats(g)) for g, b in zip(grads, batched_stats(grads))), default=0.0)
    good = worst <= STAT_TOL_32
    print(f"  statistics of {len(grads)} gradients on {dev}: one by one {t_each * 1000:.1f} ms, "
          f"batched {t_all * 1000:.1f} ms; batched vs tensor_stats: max relative error {worst:.1e} "
          f"{'ok' if good else 'FAIL'}")
    return good


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer timing repeats")
    ap.add_argument("--models", default="resnet50:8:64,vit_b_16:4:16",
                    help="name:batch[:timing batch],...")
    ap.add_argument("--timing-batch", type=int, default=32,
                    help="also time the GPU at this batch where --models names none (0: no second batch)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to check")
        return 0
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s), cuda:0 is "
          f"{torch.cuda.get_device_name(0)}; TF32 off, cuDNN deterministic")
    t0 = time.perf_counter()
    ok = True
    for spec in args.models.split(","):
        name, b, timing = ([*spec.split(":"), "", ""])[:3]
        ok &= check_model(name, int(b or 1), 3 if args.quick else 10,
                          timing_batch=int(timing) if timing else args.timing_batch)
    print(f"{'all checks passed' if ok else 'SOME CHECKS FAILED'} in {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
