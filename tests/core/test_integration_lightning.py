"""Lightning's Trainer with gradexplorer's WatchCallback: every optimizer step's logged
parameter-gradient L2 equals what the optimizer stepped with (read by global optimizer
hooks and from SGD's update, ``tests/optimizer_steps.py``), to 1e-6, under gradient
accumulation and clipping, in 32-true, bf16-mixed and 16-mixed (a CPU GradScaler), with
both import names, under DDP and FSDP2 on 2 gloo processes; validation is not recorded; a
step the GradScaler skipped is reported; what cannot be watched is refused."""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gradexplorer as gx
from gradexplorer.integrations.lightning import WatchCallback
from gradexplorer.recording.watch_log import open_log
from tests.conftest import assert_no_hooks
from tests.optimizer_steps import OptimizerSteps

ROOT = Path(__file__).resolve().parents[2]
CLIP = 0.05
BATCH = 4


def module_class(package: str) -> type:
    """A small LightningModule of ``package`` (``lightning.pytorch`` or ``pytorch_lightning``)."""
    pl = importlib.import_module(package)

    class Small(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1.0)

    return Small


def data(n: int = 32, seed: int = 1) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)),
                      batch_size=BATCH)


def fit(tmp_path: Path, package: str = "lightning.pytorch", *, steps: int = 3, **trainer_args):
    pl = importlib.import_module(package)
    model = module_class(package)()
    log = tmp_path / "run.gxw"
    callback = WatchCallback(log, every=1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=2,
                         gradient_clip_val=CLIP, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=2, val_check_interval=2,
                         num_sanity_val_steps=1, callbacks=[callback], **trainer_args)
    with OptimizerSteps(model) as truth:
        trainer.fit(model, data(), data(8, seed=2))
    return model, log, truth, trainer


def logged(log: Path, kind: str = "grad") -> dict[int, dict[str, float]]:
    con = open_log(log)
    out: dict[int, dict[str, float]] = {}
    for step, layer, l2 in con.execute("SELECT step, layer, l2 FROM stats WHERE kind = ?", (kind,)):
        out.setdefault(step, {})[layer] = l2
    con.close()
    return out


def check_steps(log: Path, truth: OptimizerSteps, steps: int) -> None:
    rows = logged(log)
    assert sorted(rows) == list(range(steps)) and len(truth.grad) == steps
    for step in range(steps):
        assert set(rows[step]) == set(truth.grad[step]) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
        for name, l2 in rows[step].items():
            assert l2 == pytest.approx(truth.grad[step][name], abs=1e-6), (step, name)
            assert l2 == pytest.approx(truth.update[step][name], abs=1e-6), (step, name)
        # The clipping was at work: the gradients stepped with have the total norm CLIP.
        assert math.hypot(*rows[step].values()) == pytest.approx(CLIP, rel=1e-5)


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_every_step_logs_the_accumulated_clipped_gradients_the_optimizer_stepped_with(tmp_path, package):
    model, log, truth, trainer = fit(tmp_path, package)
    check_steps(log, truth, 3)
    con = open_log(log)
    # Both micro-batches of a step are in its rows (4 samples each, 16 features), and no
    # validation batch (sanity check, or the checks after steps 1 and 2) is.
    counts = {r[0]: r[1] for r in con.execute("SELECT step, count FROM stats WHERE layer = 'net.0' "
                                               "AND kind = 'activation'")}
    assert counts == {0: 2 * BATCH * 16, 1: 2 * BATCH * 16, 2: 2 * BATCH * 16}
    losses = [r[0] for r in con.execute("SELECT loss FROM steps ORDER BY step")]
    assert all(0.5 < v < 3 for v in losses)  # the mean of two cross-entropies of 3 classes
    assert not con.execute("SELECT * FROM reports").fetchall()
    con.close()
    assert_no_hooks(model)
    optimizer = trainer.optimizers[0]
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    t = gx.read_timeline(log, kind="grad", stat="l2")
    assert t.steps.tolist() == [0, 1, 2]


def test_bf16_mixed(tmp_path):
    _model, log, truth, _trainer = fit(tmp_path, precision="bf16-mixed")
    check_steps(log, truth, 3)


def test_16_mixed_with_a_grad_scaler_logs_unscaled_gradients(tmp_path):
    """Lightning refuses precision="16-mixed" on the CPU (it switches to bf16); its
    MixedPrecision plugin with torch's CPU GradScaler runs the same path as on a GPU:
    scaled backward, unscale_, on_before_optimizer_step, clipping, scaler.step."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    _model, log, truth, _trainer = fit(tmp_path, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    check_steps(log, truth, 3)
    plain = tmp_path / "plain"
    plain.mkdir()
    _model, plain_log, _truth, _trainer = fit(plain)
    # Output gradients are divided by the scale too (a scaled one would be 4096 times larger).
    ratio = logged(log, "grad_output")[0]["net.2"] / logged(plain_log, "grad_output")[0]["net.2"]
    assert 0.9 < ratio < 1.1


def test_manual_optimization(tmp_path):
    """The LightningModule steps its optimizer itself (clipping by hand): each batch with a
    step is a watched step, with the gradients the step used."""
    import lightning.pytorch as pl

    class Manual(module_class("lightning.pytorch")):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
            opt.step()
            return loss

    model = Manual()
    log = tmp_path / "manual.gxw"
    trainer = pl.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=[WatchCallback(log, every=1)])
    with OptimizerSteps(model) as truth:
        trainer.fit(model, data())
    check_steps(log, truth, 3)


def test_a_step_the_grad_scaler_skipped_is_reported(tmp_path):
    """A scale of 2^40 overflows fp16 in backward: the GradScaler skips step 0's
    optimizer.step() and divides its scale by 2^30, with which the next steps fit."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40, backoff_factor=2.0 ** -30)
    _model, log, truth, _trainer = fit(tmp_path, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    con = open_log(log)
    reports = con.execute("SELECT step, layer, message FROM reports").fetchall()
    nonfinite = con.execute("SELECT SUM(nan_count + inf_count) FROM stats WHERE step = 0 AND kind = 'grad'").fetchone()
    con.close()
    assert [(step, layer) for step, layer, _message in reports] == [(0, "(optimizer)")]
    assert "GradScaler" in reports[0][2] and nonfinite[0] > 0
    assert len(truth.grad) == 2  # steps 1 and 2 stepped
    rows = logged(log)
    for step in (1, 2):
        for name, l2 in rows[step].items():
            assert l2 == pytest.approx(truth.grad[step - 1][name], abs=1e-6)


def test_deepspeed_and_fsdp1_are_refused_in_words():
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

    callback = WatchCallback("never.gxw")
    for strategy, words in ((DeepSpeedStrategy, "DeepSpeed keeps the gradients"), (FSDPStrategy, "FSDP1")):
        trainer = SimpleNamespace(strategy=object.__new__(strategy))
        with pytest.raises(gx.GradExplorerError, match=words) as info:
            callback.setup(trainer, None, "fit")
        assert "ModelParallelStrategy" in info.value.fix
    assert not Path("never.gxw").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_gloo_processes_ddp_and_fsdp2(tmp_path, mode):
    """DDPStrategy, and ModelParallelStrategy with each Linear sharded by fully_shard (every
    rank holds half of each parameter): rank 0 logs the whole gradients, as one process would."""
    log = tmp_path / "ddp.gxw"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tests.core.lightning_ddp_worker", str(log), str(tmp_path), mode],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    truths = [json.loads((tmp_path / f"truth{rank}.json").read_text()) for rank in (0, 1)]
    for mine, other in zip(truths[0]["grad"], truths[1]["grad"]):  # the same on both ranks
        assert mine == pytest.approx(other, abs=1e-7)
    rows = logged(log)
    assert sorted(rows) == [0, 1, 2]
    for step in range(3):
        for name, l2 in rows[step].items():
            assert l2 == pytest.approx(truths[0]["grad"][step][name], abs=1e-6)
            assert l2 == pytest.approx(truths[0]["update"][step][name], abs=1e-6)
        assert math.hypot(*rows[step].values()) == pytest.approx(CLIP, rel=1e-5)
    con = open_log(log)
    # Merged over the ranks: each rank's 2 micro-batches of 4 samples.
    counts = [r[0] for r in con.execute("SELECT count FROM stats WHERE layer = 'net.0' AND kind = 'activation' "
                                         "AND rank = -1 ORDER BY step")]
    con.close()
    assert counts == [2 * 2 * BATCH * 16] * 3
