"""``gradexplorer inspect run.gxw [--csv FILE]``."""

from __future__ import annotations

import sqlite3

import torch
import torch.nn.functional as F
from torch import nn

from gradexplorer.recording.watch import watch
from gradexplorer_app.cli import common
from gradexplorer_app.cli.main import main


def make_log(path, nan_at: int = 3, steps: int = 5):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, out=str(path), every=1) as w:
        for i in range(steps):
            x = torch.randn(4, 6)
            if i == nan_at:
                x[0, 0] = float("nan")
            loss = F.cross_entropy(model(x), torch.tensor([0, 1, 2, 0]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)


def test_inspect_watch_log_and_csv(tmp_path, capsys):
    log = tmp_path / "run.gxw"
    make_log(log)
    code = main(["inspect", str(log), "--csv", str(tmp_path / "run.csv")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "5 watched (0 .. 4)" in out
    assert "first at step 3 in 0 (activation)" in out
    assert "GRAD L2 FIRST" in out
    lines = (tmp_path / "run.csv").read_text().splitlines()
    assert lines[0].startswith("step,layer,call,kind,rank")
    assert len(lines) > 5 * 3


def test_inspect_refuses_other_sqlite_and_bad_csv_folder(tmp_path, capsys):
    other = tmp_path / "x.gxw"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t(a)")
    con.commit()
    con.close()
    code = main(["inspect", str(other)])
    _out, err = capsys.readouterr()
    assert code == common.EXIT_USER and "not a watch log" in err and len(err.strip().splitlines()) == 1
    log = tmp_path / "run.gxw"
    make_log(log, nan_at=99, steps=2)
    code = main(["inspect", str(log), "--csv", str(tmp_path / "missing" / "a.csv")])
    _out, err = capsys.readouterr()
    assert code == common.EXIT_USER and "--csv" in err
