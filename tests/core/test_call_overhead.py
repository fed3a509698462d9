"""``benchmarks/call_overhead.py``'s figures over several runs: each run's ratio is taken to
its own hook pair, the median is over runs, and a run whose hook pair is not positive gives
no ratio (rather than a negative or infinite one)."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks import call_overhead as co


def _run(model: str, pair: float, stats: float, params: float, pair_min: float = 1.0) -> dict:
    return {"model": model, "calls": 200, "bare_s": 0.01,
            "per_call_us": {"hook_pair": pair, "stats": stats, "param_stats": params},
            "per_call_us_min": {"hook_pair": pair_min, "stats": stats, "param_stats": params}}


def test_each_ratio_is_to_the_hook_pair_of_its_own_run():
    r = co.ratio_to_pair(_run("mlp:4", 10.0, 31.0, 6.0))
    assert r == {"hook_pair": 1.0, "stats": 3.1, "param_stats": 0.6, co.LESS_PARAMS: 2.5}
    assert co.ratio_to_pair(_run("mlp:4", 10.0, 31.0, 6.0, pair_min=5.0), "per_call_us_min")["stats"] == 6.2
    assert co.ratio_to_pair(_run("resnet50:1", -3.0, 500.0, 40.0)) == {}
    assert co.ratio_to_pair(_run("resnet50:1", 0.0, 500.0, 40.0)) == {}


def test_the_median_over_runs_is_of_the_runs_ratios_not_of_the_pooled_times():
    pairs, stats = [10.0, 14.0, 12.0], [32.0, 39.2, 30.0]
    runs = [[_run("mlp:4", p, s, 6.0), _run("resnet50:1", p - 12.0, 500.0 + p, 40.0)]
            for p, s in zip(pairs, stats)]
    summary = co.over_runs(runs)
    assert [m["model"] for m in summary] == ["mlp:4", "resnet50:1"]
    mlp = summary[0]["kinds"]
    assert mlp["stats"]["ratios"] == pytest.approx([3.2, 2.8, 2.5])
    assert mlp["stats"]["median"] == pytest.approx(2.8)
    # The ratio of the median times would be 32.0 / 12.0 = 2.67: not what is reported.
    assert mlp["stats"]["median"] != pytest.approx(statistics.median(stats) / statistics.median(pairs))
    assert mlp["stats"]["median_us"] == 32.0
    assert mlp["hook_pair"]["us"] == pairs
    assert mlp[co.LESS_PARAMS]["us"] == pytest.approx([26.0, 33.2, 24.0])
    assert mlp[co.LESS_PARAMS]["median"] == pytest.approx(statistics.median([2.6, 33.2 / 14.0, 2.0]))
    # resnet50: hook pairs of -2, 2 and 0 us: one run has a positive one.
    resnet = summary[1]["kinds"]
    assert resnet["stats"]["ratios"] == pytest.approx([514.0 / 2.0])
    runs_without = [[_run("resnet50:1", -1.0, 500.0, 40.0)] for _ in range(2)]
    assert co.over_runs(runs_without)[0]["kinds"]["stats"]["median"] is None


def test_the_summary_prints_every_kind(capsys):
    runs = [[_run("mlp:4", p, s, 6.0)] for p, s in ((10.0, 30.0), (12.0, 40.0))]
    co._print_over_runs(co.over_runs(runs))
    out = capsys.readouterr().out
    assert "mlp:4, 2 runs" in out
    assert "median  3.17x   runs 3.00, 3.33  (target <= 3x)" in out
    assert "us per call in the runs: 10.0, 12.0" in out
    co._print_over_runs(co.over_runs([[_run("resnet50:1", -1.0, 500.0, 40.0)]]))
    assert "no run's hook pair" in capsys.readouterr().out


def test_runs_refuses_what_it_cannot_compute(capsys):
    with pytest.raises(SystemExit):
        co.main(["--runs", "2", "--kinds", "stats"])
    assert "--runs needs the hook_pair kind" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        co.main(["--runs", "0"])
    assert "--runs must be at least 1" in capsys.readouterr().err


def test_a_child_run_ends_with_its_figures_as_json(monkeypatch, capsys):
    def measure(spec, repeats, kinds, clock="cpu"):
        return _run(spec, 10.0, 30.0, 6.0)

    monkeypatch.setattr(co, "measure", measure)
    rows = co.main(["--models", "mlp:4", "--kinds", "hook_pair,stats,param_stats", "--json"])
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert json.loads(last) == rows == [_run("mlp:4", 10.0, 30.0, 6.0)]


def test_several_runs_read_each_childs_figures(monkeypatch, capsys):
    calls = []

    class Done:
        def __init__(self, pair: float) -> None:
            self.returncode, self.stderr = 0, ""
            self.stdout = "table\n" + json.dumps([_run("mlp:4", pair, 30.0, 6.0)]) + "\n"

    def run(cmd, **kwargs):
        calls.append(cmd)
        return Done(10.0 + len(calls))

    monkeypatch.setattr(co.subprocess, "run", run)
    rows = co.main(["--models", "mlp:4", "--kinds", "hook_pair,stats,param_stats", "--runs", "3", "--repeats", "7"])
    assert len(calls) == 3 and all("--json" in c and "--runs" not in c for c in calls)
    assert calls[0][calls[0].index("--repeats") + 1] == "7"
    assert [r["per_call_us"]["hook_pair"] for r in rows] == [11.0, 12.0, 13.0]
    out = capsys.readouterr().out
    assert out.count("=== run ") == 3 and "table" in out
    assert f"median {30.0 / 12.0:5.2f}x" in out

    def failing(cmd, **kwargs):
        done = Done(1.0)
        done.returncode, done.stdout, done.stderr = 1, "", "boom\n"
        return done

    monkeypatch.setattr(co.subprocess, "run", failing)
    with pytest.raises(SystemExit, match="run 1 failed"):
        co.main(["--models", "mlp:4", "--kinds", "hook_pair,stats", "--runs", "2"])
