"""Watch overhead: a training step watched by ``gradexplorer.recording.watch`` vs the same step unwatched.

    python -m benchmarks.watch_overhead [--size 224] [--batch 16] [--device cpu]
                                        [--threads 1 --clock cpu]

resnet18 (random init) training with SGD + momentum on a fixed random batch. Every row is
the total time of n training steps under one configuration over the total time of n
unwatched steps of the same model, the two interleaved step by step (one unwatched, one
under the configuration, in turn), so that a change of a shared machine's load hits both
alike. n is a multiple of N for "every N" (10, 30 and 100 steps). Configurations:

* ``watch every N`` for N = 1, 10, 100, every leaf layer and every parameter (the
  default), and ``layers="layer4.*"`` (as in the watch example of docs/watch-and-timeline.md);
* a W&B-style hook (``wandb.watch(log="all", log_freq=1)``'s work, written here: on each
  parameter's gradient a tensor hook that flattens, copies to the CPU, filters NaN/Inf,
  reads min and max with ``.item()`` and takes a 64-bin ``histc``; the same for each
  parameter at every forward);
* a TensorBoard-style ``add_histogram`` of every parameter and gradient at every step
  (written here: to NumPy, ``np.histogram`` on TensorBoard's default exponential bucket
  edges, min/max/sum/sum of squares, appended to a file).

``--threads 1 --clock cpu`` times the process's CPU time on one thread (what other jobs on a
shared machine do not inflate); the watch's cost per hooked call on a 200-layer MLP is in
``python -m benchmarks.call_overhead`` (kind ``watch``). Figures only: nothing here asserts a
time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F


def _tb_bucket_edges() -> np.ndarray:
    """TensorBoard's default histogram buckets: ±1e-12 growing by 10% to 1e20."""
    v = 1e-12
    pos = []
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    pos.append(float("inf"))
    neg = [-x for x in reversed(pos)]
    return np.array(neg + [0.0] + pos)


class TensorBoardStyle:
    """``writer.add_histogram(name, tensor, step)`` for every parameter and gradient."""

    def __init__(self, model: torch.nn.Module, path: str) -> None:
        self.model = model
        self.fh = open(path, "ab")  # noqa: SIM115 - kept open across steps, as a SummaryWriter is
        self.edges = _tb_bucket_edges()
        self.step = 0

    def _add(self, name: str, t: torch.Tensor) -> None:
        values = t.detach().cpu().numpy().astype(np.float64).reshape(-1)
        counts, _ = np.histogram(values, bins=self.edges)
        head = struct.pack("<qdddd", values.size, values.min(), values.max(), values.sum(),
                           float(np.dot(values, values)))
        self.fh.write(name.encode() + head + counts.astype("<f8").tobytes())

    def after_step(self) -> None:
        for name, p in self.model.named_parameters():
            self._add(name, p)
            if p.grad is not None:
                self._add(name + "/grad", p.grad)
        self.fh.flush()
        self.step += 1

    def close(self) -> None:
        self.fh.close()


class WandbStyle:
    """What ``wandb.watch(model, log="all", log_freq=1)`` does per step (wandb_torch.py)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.logged: list = []
        self.handles = [p.register_hook(lambda g, _n=n: self._log(_n, g))
                        for n, p in model.named_parameters() if p.requires_grad]
        self.handles.append(model.register_forward_hook(self._params))

    def _log(self, name: str, tensor: torch.Tensor) -> None:
        flat = tensor.detach().reshape(-1).float().cpu().clone()
        if flat.isnan().any():
            flat = flat[~flat.isnan()]
        if flat.isinf().any():
            flat = flat[~flat.isinf()]
        if flat.numel() == 0:
            return
        tmin, tmax = flat.min().item(), flat.max().item()
        hist = flat.histc(bins=64, min=tmin, max=tmax)
        self.logged.append((name, hist.tolist(), tmin, tmax))

    def _params(self, module, inputs, output) -> None:
        for name, p in self.model.named_parameters():
            self._log("parameters/" + name, p)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def resnet18_training(size: int, batch: int, device: str = "cpu") -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    """The benchmarks' training: resnet18 (seeded), SGD with momentum, one fixed batch; returns
    the model and a function that runs one step and returns its loss."""
    import torchvision

    torch.manual_seed(0)
    dev = torch.device(device)
    model = torchvision.models.resnet18().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step() -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return model, step


def measure(size: int = 224, batch: int = 16, device: str = "cpu", quick: bool = False,
            clock: str = "wall") -> list[dict]:
    """Ratios of each configuration to the unwatched step (see the module docstring).
    ``clock="cpu"``: the process's CPU time instead of the wall clock."""
    from gradexplorer.recording.watch import watch

    dev = torch.device(device)
    model, step = resnet18_training(size, batch, device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    folder = tempfile.mkdtemp(prefix="gx-watch-bench-")
    for _ in range(2):  # warm-up
        step()
    results: list[dict] = []

    timer = time.process_time if clock == "cpu" else time.perf_counter

    def timed(fn) -> float:
        sync()
        start = timer()
        fn()
        sync()
        return timer() - start

    def run_interleaved(label: str, n: int, make) -> dict:
        """n unwatched steps interleaved with n steps under the configuration: a step of
        each in turn, so that a change of the machine's load hits both alike."""
        before, after, close = make()
        bare_t, conf_t = [], []
        try:
            for _ in range(n):
                bare_t.append(timed(step))

                def configured():
                    before()
                    loss = step()
                    after(loss)

                conf_t.append(timed(configured))
        finally:
            close()
        r = {"config": label, "steps": n, "ratio": sum(conf_t) / sum(bare_t),
             "bare_ms": statistics.median(bare_t) * 1000, "ms": sum(conf_t) / n * 1000,
             "watched_ms": max(conf_t) * 1000}
        results.append(r)
        print(f"  {label}: {r['ratio']:.3f}x (mean {r['ms']:.0f} ms per step, unwatched median "
              f"{r['bare_ms']:.0f} ms, slowest {r['watched_ms']:.0f} ms; {n} steps of each)", flush=True)
        return r

    def nothing(*_args) -> None:
        return None

    def watched(every: int, layers):
        def make():
            w = watch(model, out=os.path.join(folder, f"w{every}_{layers}.gxw"), every=every, layers=layers)
            w.__enter__()
            return nothing, (lambda loss: w.step(loss=loss)), w.close
        return make

    for every, layers, n in ((1, None, 10), (10, None, 30), (100, None, 100), (1, "layer4.*", 10),
                             (10, "layer4.*", 30)):
        if quick and every == 100:
            continue
        run_interleaved(f"watch every {every}, {'all layers' if layers is None else layers}", n,
                        watched(every, layers))

    def wandb_make():
        holder: dict = {}

        def before() -> None:
            holder["w"] = WandbStyle(model)

        def after(_loss) -> None:
            holder.pop("w").close()

        return before, after, nothing

    run_interleaved("W&B-style hooks (log='all', every step)", 10, wandb_make)

    def tb_make():
        tb = TensorBoardStyle(model, os.path.join(folder, "tb.bin"))
        return nothing, (lambda loss: tb.after_step()), tb.close

    run_interleaved("TensorBoard-style add_histogram (every step)", 10, tb_make)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch and numba threads (default: torch's default)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the process's CPU time (meaningful with --threads 1 while other jobs run)")
    args = p.parse_args()
    if args.threads:
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # read when numba starts its threads
        torch.set_num_threads(args.threads)
    print(f"resnet18 batch {args.batch} at {args.size} px on {args.device}, torch threads {torch.get_num_threads()}, "
          f"{args.clock} clock")
    measure(args.size, args.batch, args.device, clock=args.clock)


if __name__ == "__main__":
    main()
