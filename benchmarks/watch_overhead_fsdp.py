"""Watch overhead under FSDP2 on 2 gloo ranks: a sharded training step unwatched, watched every step, every 10.

    python -m benchmarks.watch_overhead_fsdp [--steps 20] [--repeats 3] [--width 512] [--json PATH]

Starts itself under torchrun with 2 CPU processes. Each rank trains an MLP of 4 ``Linear``
layers (``--width`` wide) sharded with ``fully_shard`` on each ``Linear`` and the root, on its
own half of a fixed batch, with SGD. Per repeat, the three configurations run in turn
(unwatched, ``every=1``, ``every=10``) for ``--steps`` steps each, so that a change of the
shared machine's load hits all of them alike; rank 0 prints the median over repeats of the
seconds per step and the ratio to unwatched (``--json``: also to PATH; ``measure()`` returns
them, for ``python -m benchmarks``). Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROLE = "GX_FSDP_BENCH_RANK"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(steps: int, repeats: int, width: int, json_path: str = "") -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from gradexplorer.recording.watch import watch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())])
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, width)
    y = torch.randn(32, width)

    def one(net: nn.Module, optim: torch.optim.Optimizer, w: object) -> None:
        loss = F.mse_loss(net(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if w is not None:
            w.step(loss=loss)  # type: ignore[attr-defined]

    def run(net: nn.Module, optim: torch.optim.Optimizer, every: int | None, out: str) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        if every is None:
            for _ in range(steps):
                one(net, optim, None)
        else:
            with watch(net, out=out, every=every) as w:
                for _ in range(steps):
                    one(net, optim, w)
        dist.barrier()
        return (time.perf_counter() - t0) / steps

    times: dict[str, list[float]] = {"unwatched": [], "every 1": [], "every 10": []}
    with tempfile.TemporaryDirectory() as tmp:
        run(model, opt, None, "")  # warm-up
        for r in range(repeats):
            times["unwatched"].append(run(model, opt, None, ""))
            times["every 1"].append(run(model, opt, 1, os.path.join(tmp, f"a{r}.gxw")))
            times["every 10"].append(run(model, opt, 10, os.path.join(tmp, f"b{r}.gxw")))
    if rank == 0:
        base = statistics.median(times["unwatched"])
        print(f"FSDP2 on 2 gloo ranks, MLP 4 x Linear({width}, {width}), {steps} steps per run, "
              f"median of {repeats} interleaved repeats (shared machine)")
        figures = {}
        for name, ts in times.items():
            med = statistics.median(ts)
            figures[name] = {"ms": med * 1000, "ratio": med / base}
            print(f"  {name:10s} {med * 1000:8.2f} ms/step  x{med / base:.2f}")
        if json_path:
            with open(json_path, "w") as f:
                json.dump({"width": width, "steps": steps, "repeats": repeats, "figures": figures}, f)
    dist.barrier()
    del model, opt
    gc.collect()
    dist.destroy_process_group()


def _command(steps: int, repeats: int, width: int, json_path: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "benchmarks.watch_overhead_fsdp", "--steps", str(steps), "--repeats", str(repeats),
            "--width", str(width), *(["--json", json_path] if json_path else [])]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **{ROLE: "1"})


def measure(steps: int = 20, repeats: int = 3, width: int = 512) -> dict:
    """The figures rank 0 prints: ``{"figures": {"unwatched" | "every 1" | "every 10":
    {"ms", "ratio"}}, "width", "steps", "repeats"}``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "figures.json")
        subprocess.run(_command(steps, repeats, width, path), env=_env(), cwd=ROOT, check=True,
                       capture_output=True, timeout=3600)
        with open(path) as f:
            return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--json", default="", help="also write rank 0's figures to this file")
    args = p.parse_args()
    if os.environ.get(ROLE):
        worker(args.steps, args.repeats, args.width, args.json)
        return
    sys.exit(subprocess.call(_command(args.steps, args.repeats, args.width, args.json), env=_env()))


if __name__ == "__main__":
    main()
