"""``gradexplorer export RUN.gxw``: TensorBoard event files read back with TensorBoard's own
EventAccumulator (one scalar series per parameter whose values are the log's, histograms
whose counts are the log's), the same events streamed live by ``watch(tensorboard=...)``,
and every row of the log in CSV and Parquet."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import gradexplorer as gx
from gradexplorer.recording.watch_log import decode_hist, open_log
from gradexplorer_app.cli.main import main

STEPS = 4


class Twice(nn.Module):
    """A ReLU called twice per forward: its second call is a series of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.act, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.b(self.act(self.a(x)))))


def run(log, tensorboard=None) -> nn.Module:
    torch.manual_seed(0)
    model = Twice()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gx.watch(model, out=str(log), every=1, tensorboard=tensorboard) as w:
        for step in range(STEPS):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
    return model


def accumulator(folder) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def rows(log, kind: str) -> dict[tuple[int, str, int], dict]:
    con = open_log(log)
    out = {(r["step"], r["layer"], r["call"]): dict(r) for r in con.execute("SELECT * FROM stats WHERE kind = ?",
                                                                           (kind,))}
    con.close()
    return out


def test_tensorboard_reads_one_series_per_parameter_with_the_logs_values(tmp_path, capsys):
    log, tb = tmp_path / "run.gxw", tmp_path / "tb"
    model = run(log)
    assert main(["export", str(log), "--tensorboard", str(tb)]) == 0
    assert "wrote TensorBoard events" in capsys.readouterr().out
    acc = accumulator(tb)
    tags = acc.Tags()
    params = [n for n, _ in model.named_parameters()]
    assert {t for t in tags["scalars"] if t.startswith("grad_l2/")} == {f"grad_l2/{n}" for n in params}
    grads, weights = rows(log, "grad"), rows(log, "weight")
    for name in params:
        series = acc.Scalars(f"grad_l2/{name}")
        assert [e.step for e in series] == list(range(STEPS))
        # TensorBoard keeps a scalar as float32: the log's value rounded once.
        assert [e.value for e in series] == [np.float32(grads[(s, name, 0)]["l2"]) for s in range(STEPS)]
        ratios = acc.Scalars(f"update_ratio/{name}")
        assert [e.value for e in ratios] == [np.float32(weights[(s, name, 0)]["update_ratio"]) for s in range(STEPS)]
        for event in acc.Histograms(f"grad/{name}"):
            row = grads[(event.step, name, 0)]
            h = event.histogram_value
            assert h.num == row["count"] and h.min == row["min"] and h.max == row["max"]
            assert sum(h.bucket) == row["count"] and sum(h.bucket) == decode_hist(row["hist_lo"], row["hist"]).sum()
            assert list(h.bucket_limit) == sorted(h.bucket_limit) and h.bucket_limit[-1] <= row["max"]
    outputs = rows(log, "grad_output")
    assert [e.value for e in acc.Scalars("grad_output_l2/act#1")] == [
        np.float32(outputs[(s, "act", 1)]["l2"]) for s in range(STEPS)]
    assert {"activation_std/act", "activation_std/act#1", "activation_zero_fraction/a", "loss"} <= set(tags["scalars"])
    assert {"activation/head", "grad_output/act#1", "grad_norm/b", "weight/a.weight"} <= set(tags["histograms"])
    con = open_log(log)
    losses = [r[0] for r in con.execute("SELECT loss FROM steps ORDER BY step")]
    con.close()
    assert [e.value for e in acc.Scalars("loss")] == [np.float32(v) for v in losses]
    # Exporting again replaces the file rather than doubling every series.
    assert main(["export", str(log), "--tensorboard", str(tb)]) == 0
    assert len(list(tb.iterdir())) == 1
    assert len(accumulator(tb).Scalars("loss")) == STEPS


def test_watch_streams_the_same_events_while_it_runs(tmp_path):
    live, exported = tmp_path / "live", tmp_path / "exported"
    run(tmp_path / "run.gxw", tensorboard=live)
    assert main(["export", str(tmp_path / "run.gxw"), "--tensorboard", str(exported)]) == 0
    a, b = accumulator(live), accumulator(exported)
    assert a.Tags()["scalars"] and sorted(a.Tags()["scalars"]) == sorted(b.Tags()["scalars"])
    assert sorted(a.Tags()["histograms"]) == sorted(b.Tags()["histograms"])
    for tag in a.Tags()["scalars"]:
        assert [(e.step, e.value) for e in a.Scalars(tag)] == [(e.step, e.value) for e in b.Scalars(tag)]


def test_csv_and_parquet_hold_every_row(tmp_path):
    log = tmp_path / "run.gxw"
    run(log)
    csv, parquet = tmp_path / "rows.csv", tmp_path / "rows.parquet"
    assert main(["export", str(log), "--csv", str(csv), "--parquet", str(parquet)]) == 0
    con = open_log(log)
    n = con.execute("SELECT COUNT(*) FROM stats").fetchone()[0]
    some = dict(con.execute("SELECT * FROM stats WHERE kind = 'grad' AND layer = 'a.weight' AND step = 2").fetchone())
    con.close()
    from_csv, from_parquet = pd.read_csv(csv), pd.read_parquet(parquet)
    assert len(from_csv) == len(from_parquet) == n
    row = from_parquet[(from_parquet.kind == "grad") & (from_parquet.layer == "a.weight") & (from_parquet.step == 2)]
    assert row["l2"].item() == some["l2"] and row["loss"].notna().all()
    counts = np.zeros_like(decode_hist(None, None))
    hist = list(row["hist"].item())
    counts[row["hist_lo"].item(): row["hist_lo"].item() + len(hist)] = hist
    np.testing.assert_array_equal(counts, decode_hist(some["hist_lo"], some["hist"]))


def test_what_cannot_be_written_is_said(tmp_path, capsys):
    log = tmp_path / "run.gxw"
    run(log)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["export", str(log), "--tensorboard", str(a_file)]) == 1
    assert "is not a folder" in capsys.readouterr().err and a_file.read_text() == "mine"
    assert main(["export", str(log)]) == 2
    assert "--tensorboard DIR" in capsys.readouterr().err
    assert main(["export", str(log), "--csv", str(log)]) == 1  # never over the log it reads
    assert open_log(log) is not None
    assert main(["export", str(tmp_path / "none.gxw"), "--csv", str(tmp_path / "x.csv")]) == 1
    assert "No watch log" in capsys.readouterr().err
    with pytest.raises(gx.GradExplorerError, match="not a folder"):
        run(tmp_path / "again.gxw", tensorboard=a_file)
