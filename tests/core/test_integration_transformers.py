"""The Hugging Face Trainer with gradexplorer's WatchCallback: every optimizer step's logged
parameter-gradient L2 equals what the optimizer stepped with (global optimizer hooks and
SGD's own update, ``tests/optimizer_steps.py``), to 1e-6, under gradient accumulation and
``max_grad_norm``, in fp32, bf16 and fp16 with a GradScaler, and under DDP on 2 gloo
processes; evaluation during training is not recorded; the loss is the Trainer's; DeepSpeed
and FSDP1 are refused in words."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import Trainer, TrainingArguments

import gradexplorer as gx
from gradexplorer.integrations.transformers import WatchCallback
from gradexplorer.recording.watch_log import open_log
from tests import hf_tiny
from tests.conftest import assert_no_hooks
from tests.optimizer_steps import OptimizerSteps

ROOT = Path(__file__).resolve().parents[2]
BATCH = 4
TOKENS = 8


class Sentences(torch.utils.data.Dataset):
    def __init__(self, n: int = 32, seed: int = 0) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(self.seed * 1000 + i)
        return {"input_ids": torch.randint(4, 17, (TOKENS,), generator=g),
                "attention_mask": torch.ones(TOKENS, dtype=torch.long), "labels": torch.tensor(i % 3)}


class ScaledTrainer(Trainer):
    """accelerate turns fp16 off on the CPU (no GradScaler there); this Trainer gives its
    accelerator torch's CPU GradScaler and fp16 autocast, as it has on a GPU, so that the
    optimizer is wrapped with the scaler and steps through ``scaler.step``."""

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        self.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
        self.accelerator.native_amp = True


def train(tmp_path: Path, *, clip: float = 0.05, trainer_class: type = Trainer, evaluate: bool = False,
          log: Path | None = None, **args) -> tuple:
    model = hf_tiny.bert()
    log = log or tmp_path / "run.gxw"
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, gradient_accumulation_steps=2,
        max_grad_norm=clip, max_steps=3, learning_rate=1.0, optim="sgd", lr_scheduler_type="constant",
        weight_decay=0.0, report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        dataloader_num_workers=0, eval_strategy="steps" if evaluate else "no", eval_steps=1,
        per_device_eval_batch_size=BATCH, **args)
    trainer = trainer_class(model=model, args=arguments, train_dataset=Sentences(),
                            eval_dataset=Sentences(8, seed=1) if evaluate else None,
                            callbacks=[WatchCallback(log, every=1)])
    with OptimizerSteps(model) as truth:
        result = trainer.train()
    optimizer = trainer.optimizer.optimizer  # inside accelerate's wrapper
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    return model, log, truth, result


def check_steps(log: Path, truth: OptimizerSteps, clip: float | None) -> None:
    con = open_log(log)
    rows: dict[int, dict[str, float]] = {}
    for step, layer, l2 in con.execute("SELECT step, layer, l2 FROM stats WHERE kind = 'grad'"):
        rows.setdefault(step, {})[layer] = l2
    con.close()
    assert sorted(rows) == [0, 1, 2] and len(truth.grad) == 3
    for step in range(3):
        assert set(rows[step]) == set(truth.grad[step]) and len(rows[step]) > 30
        for name, l2 in rows[step].items():
            assert l2 == pytest.approx(truth.grad[step][name], abs=1e-6), (step, name)
            assert l2 == pytest.approx(truth.update[step][name], abs=1e-6), (step, name)
        if clip is not None:  # the clipping was at work: the total norm is max_grad_norm
            assert math.hypot(*rows[step].values()) == pytest.approx(clip, rel=1e-5)


@pytest.mark.slow
def test_every_step_logs_the_accumulated_clipped_gradients_the_optimizer_stepped_with(tmp_path):
    model, log, truth, result = train(tmp_path, evaluate=True)
    check_steps(log, truth, 0.05)
    con = open_log(log)
    # Both micro-batches of a step (4 sentences of 8 tokens, 32 features), no evaluation batch.
    counts = [r[0] for r in con.execute("SELECT count FROM stats WHERE layer = 'bert.pooler.dense' "
                                         "AND kind = 'activation' ORDER BY step")]
    assert counts == [2 * BATCH * 32] * 3
    embeddings = [r[0] for r in con.execute("SELECT count FROM stats WHERE layer = 'bert.embeddings.word_embeddings'"
                                             " AND kind = 'activation' ORDER BY step")]
    assert embeddings == [2 * BATCH * TOKENS * 32] * 3
    losses = [r[0] for r in con.execute("SELECT loss FROM steps ORDER BY step")]
    con.close()
    # The Trainer's own training loss is the mean of its steps' losses.
    assert sum(losses) / len(losses) == pytest.approx(result.training_loss, rel=1e-5)
    assert_no_hooks(model)
    assert gx.read_timeline(log, kind="grad_output").steps.tolist() == [0, 1, 2]


@pytest.mark.slow
def test_bf16(tmp_path):
    _model, log, truth, _result = train(tmp_path, bf16=True)
    check_steps(log, truth, 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("clip", [0.05, 0.0])
def test_fp16_with_a_grad_scaler_logs_unscaled_gradients(tmp_path, clip):
    """Backward runs on the loss times the scale (4096); accelerate unscales before
    clipping, and transformers 5 also without clipping (max_grad_norm=0), to log the norm."""
    _model, log, truth, _result = train(tmp_path, clip=clip, trainer_class=ScaledTrainer, fp16=True)
    check_steps(log, truth, clip or None)


@pytest.mark.slow
def test_ddp_with_two_gloo_processes(tmp_path):
    log = tmp_path / "ddp.gxw"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tests.core.transformers_ddp_worker", str(log), str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    truths = [json.loads((tmp_path / f"truth{rank}.json").read_text()) for rank in (0, 1)]
    for mine, other in zip(truths[0]["grad"], truths[1]["grad"]):  # DDP's all-reduced gradients
        assert mine == pytest.approx(other, abs=1e-7)
    check_steps(log, SimpleNamespace(**truths[0]), 0.05)
    con = open_log(log)
    counts = [r[0] for r in con.execute("SELECT count FROM stats WHERE layer = 'bert.pooler.dense' "
                                         "AND kind = 'activation' AND rank = -1 ORDER BY step")]
    con.close()
    assert counts == [2 * 2 * BATCH * 32] * 3  # both ranks' two micro-batches, merged


def test_deepspeed_and_fsdp1_are_refused_in_words():
    callback = WatchCallback("never.gxw")
    for args, words in ((SimpleNamespace(deepspeed="ds_config.json"), "DeepSpeed keeps the gradients"),
                        (SimpleNamespace(fsdp=True, fsdp_config={"version": 1}), "FSDP1")):
        with pytest.raises(gx.GradExplorerError, match=words) as info:
            callback.on_init_end(args, None, None)
        assert "FSDP2" in info.value.fix
    callback.on_init_end(SimpleNamespace(deepspeed=None, fsdp=True, fsdp_config={"version": 2}), None, None)
    assert not Path("never.gxw").exists()
