"""The trainer callbacks and the TensorBoard export: what they cost.

    python -m benchmarks.trainer_callbacks [--steps 20] [--repeats 3] [--size 64] [--threads N] [--clock cpu|wall]

1. Lightning: ``Trainer.fit`` of resnet18 (random init, SGD, ``accumulate_grad_batches=2``,
   ``gradient_clip_val=1.0``) for ``--steps`` optimizer steps on random batches of 8, bare
   and with ``WatchCallback`` every 1 and every 10 steps, and every step with
   ``tensorboard=`` as well. The fits are interleaved (bare, then each configuration, in
   turn, ``--repeats`` times) so that a shared machine's load hits all alike; each row is the
   median fit time over the bare one's. Whole fits, Lightning's set-up included. ``--clock
   cpu`` counts the process's CPU time instead of the wall clock (steadier on a shared
   machine; with ``--threads 1`` it is the work done).
2. ``gradexplorer export RUN.gxw --tensorboard DIR`` of the every-step log of part 1:
   seconds, events, bytes, and steps per second (best of ``--repeats``).

Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _fit(folder: Path, steps: int, size: int, callback_args: dict | None, clock: str) -> float:
    import lightning.pytorch as pl
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from torchvision.models import resnet18

    from gradexplorer.integrations.lightning import WatchCallback

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # after Lightning set its own level

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = resnet18(num_classes=10)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(0)
    n = steps * 2 * 8
    x, y = torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)
    data = DataLoader(TensorDataset(x, y), batch_size=8)
    callbacks = [] if callback_args is None else [WatchCallback(**callback_args)]
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, accumulate_grad_batches=2, gradient_clip_val=1.0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks, default_root_dir=str(folder))
    now = time.process_time if clock == "cpu" else time.perf_counter
    t0 = now()
    trainer.fit(Net(), data)
    return now() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        configs = {
            "bare": None,
            "WatchCallback every 1": {"out": folder / "every1.gxw", "every": 1},
            "WatchCallback every 10": {"out": folder / "every10.gxw", "every": 10},
            "WatchCallback every 1 + tensorboard": {"out": folder / "tb.gxw", "every": 1,
                                                    "tensorboard": folder / "live"},
        }
        times: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, config in configs.items():
                times[name].append(_fit(folder, args.steps, args.size, config, args.clock))
        bare = statistics.median(times["bare"])
        print(f"Lightning fit, resnet18 {args.size}x{args.size}, {args.steps} optimizer steps of 2 micro-batches of 8 "
              f"({args.clock} clock, {torch.get_num_threads()} threads, median of {args.repeats}, interleaved):")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"  {name:<38} {median:7.2f} s   {median / bare:5.2f}x bare")

        from gradexplorer.recording.tensorboard import export_tensorboard
        from gradexplorer.recording.watch_log import open_log

        log = folder / "every1.gxw"
        con = open_log(log)
        rows = con.execute("SELECT COUNT(*) FROM stats").fetchone()[0]
        con.close()
        best = float("inf")
        for i in range(args.repeats):
            now = time.process_time if args.clock == "cpu" else time.perf_counter
            t0 = now()
            out = export_tensorboard(log, folder / f"export{i}")
            best = min(best, now() - t0)
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        events = sum(1 for _ in EventFileLoader(str(out)).Load())
        print(f"export --tensorboard of the every-step log ({args.steps} steps, {rows} rows, "
              f"{log.stat().st_size / 2**20:.1f} MiB): {best:.2f} s (best of {args.repeats}), {events} events, "
              f"{out.stat().st_size / 2**20:.1f} MiB, {args.steps / best:.1f} steps/s")


if __name__ == "__main__":
    main()
