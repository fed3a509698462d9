"""``gradexplorer capture --batch-size``: a folder of images, merged statistics, torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradexplorer.files.capture_file import load_capture
from gradexplorer_app.cli import common
from gradexplorer_app.cli.main import main
from tests.picture_folders import write_pictures

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    return write_pictures(tmp_path_factory.mktemp("images"), 7, seed=0, note="notes.txt")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def entries(path: Path) -> dict:
    cap = load_capture(path)
    out = {}
    for name, rec in cap.layers.items():
        for i, call in enumerate(rec.calls):
            for kind, s in call.stats.items():
                if s is not None:
                    out[(name, i, kind)] = s["merged"]
        for pname, s in rec.param_stats.items():
            if s is not None:
                out[(name, pname, "param")] = s["merged"]
    return {"entries": out, "meta": cap.meta}


def test_folder_capture(tmp_path, capsys, image_folder):
    out = tmp_path / "ds.pt"
    code, stdout, err = run(capsys, "capture", "--model", "demo:shapes", "--input", image_folder,
                            "--batch-size", "3", "--stats-only", "--out", out)
    assert code == 0, err
    assert "7 samples in 3 batches" in stdout
    assert "batches" in err  # progress
    got = entries(out)
    ds = got["meta"]["dataset"]
    assert ds["samples"] == 7 and ds["series"]["samples"] == [3, 3, 1]
    assert got["meta"]["mode"] == "stats"
    act = got["entries"][("features.0.conv", 0, "activation")]
    assert act["numel"] % 7 == 0 and act["hist"].sum() == act["count"] == act["numel"]

    code, stdout, err = run(capsys, "capture", "--model", "demo:shapes", "--input", image_folder,
                            "--batch-size", "2", "--max-samples", "3", "--stats-only", "--out", tmp_path / "few.pt")
    assert code == 0, err
    assert load_capture(tmp_path / "few.pt").meta["dataset"]["samples"] == 3

    # inspect names the dtype the batches had (it printed "dtype None")
    assert got["meta"]["dtype"] == "float32"
    code, stdout, err = run(capsys, "inspect", out)
    assert code == 0, err
    assert "dtype float32" in stdout


def test_tensor_file_dataset_records_the_model_dtype(tmp_path, capsys):
    # a bfloat16 model: the float32 tensors of the file are cast to its dtype
    factory = tmp_path / "bf16_model.py"
    factory.write_text("import torch\nfrom torch import nn\n\n\ndef build():\n"
                       "    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).to(torch.bfloat16)\n")
    data = tmp_path / "x.pt"
    import torch

    torch.save(torch.randn(10, 6), data)
    out = tmp_path / "bf16.pt"
    code, stdout, err = run(capsys, "capture", "--model", f"{factory}:build", "--trust", "--input", data,
                            "--batch-size", "4", "--stats-only", "--out", out)
    assert code == 0, err
    cap = load_capture(out)
    assert cap.meta["dtype"] == "bfloat16"
    assert cap.meta["dataset"]["samples"] == 10


@pytest.mark.parametrize("argv, needle", [
    (["--batch-size", "3"], "add --stats-only"),
    (["--batch-size", "0", "--stats-only"], "positive"),
    (["--batch-size", "2", "--max-samples", "0", "--stats-only"], "positive"),
])
def test_bad_arguments(tmp_path, capsys, image_folder, argv, needle):
    code, _out, err = run(capsys, "capture", "--model", "demo:shapes", "--input", image_folder, *argv,
                          "--out", tmp_path / "x.pt")
    assert code == common.EXIT_USER
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.slow
def test_torchrun_two_processes_equal_one(tmp_path, image_folder):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    common = ["--model", "demo:shapes", "--input", str(image_folder), "--batch-size", "2", "--stats-only", "-q"]
    single = subprocess.run([sys.executable, "-m", "gradexplorer", "capture", *common,
                             "--out", str(tmp_path / "one.pt")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr
    dist = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "gradexplorer", "capture", *common, "--out", str(tmp_path / "two.pt")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert dist.returncode == 0, dist.stderr[-3000:]
    one, two = entries(tmp_path / "one.pt"), entries(tmp_path / "two.pt")
    assert two["meta"]["world_size"] == 2
    assert one["entries"].keys() == two["entries"].keys() and one["entries"]
    for key, a in one["entries"].items():
        b = two["entries"][key]
        for field in ("numel", "count", "nan_count", "inf_count", "zero_count", "min", "max"):
            assert a[field] == b[field], (key, field)
        assert (a["hist"] == b["hist"]).all(), key
        assert b["mean"] == pytest.approx(a["mean"], rel=1e-12, abs=1e-15), key
        assert b["m2"] == pytest.approx(a["m2"], rel=1e-10, abs=1e-20), key
    s1, s2 = one["meta"]["dataset"]["series"], two["meta"]["dataset"]["series"]
    assert s1["batch"] == s2["batch"] == [0, 1, 2, 3]
    for name, values in s1["rows"].items():
        assert (values == s2["rows"][name]).all() or np.allclose(values.numpy(), s2["rows"][name].numpy(),
                                                                 rtol=1e-12, equal_nan=True), name
    snr1, snr2 = one["meta"]["dataset"]["snr"], two["meta"]["dataset"]["snr"]
    for name, v in snr1.items():
        assert snr2[name]["snr"] == pytest.approx(v["snr"], rel=1e-9), name


SHARDED_MODEL = f"{ROOT / 'tests' / 'core' / 'sharded_dataset_worker.py'}:make_model"


def assert_same_capture(one: dict, two: dict) -> None:
    """Two dataset captures of the same batches: every count, extreme and histogram bin
    equal, moments up to float64 summation order, the same series and gradient SNR."""
    assert one["entries"].keys() == two["entries"].keys() and one["entries"]
    for key, a in one["entries"].items():
        b = two["entries"][key]
        for field in ("numel", "count", "nan_count", "inf_count", "zero_count", "min", "max"):
            assert a[field] == b[field], (key, field)
        assert (a["hist"] == b["hist"]).all(), key
        assert b["mean"] == pytest.approx(a["mean"], rel=1e-12, abs=1e-15), key
        assert b["m2"] == pytest.approx(a["m2"], rel=1e-10, abs=1e-20), key
    s1, s2 = one["meta"]["dataset"]["series"], two["meta"]["dataset"]["series"]
    assert s1["batch"] == s2["batch"] and s1["samples"] == s2["samples"]
    for name, values in s1["rows"].items():
        assert np.allclose(values.numpy(), s2["rows"][name].numpy(), rtol=1e-12, atol=0, equal_nan=True), name
    snr1, snr2 = one["meta"]["dataset"]["snr"], two["meta"]["dataset"]["snr"]
    assert snr1.keys() == snr2.keys()
    for name, v in snr1.items():
        assert snr2[name]["batches"] == v["batches"]
        assert snr2[name]["snr"] == pytest.approx(v["snr"], rel=1e-9), name


@pytest.mark.slow
def test_torchrun_sharded_with_fsdp_equals_one_process(tmp_path):
    """``--shard fsdp`` on 2 gloo ranks: the model's parameters split over the ranks
    (each holds under two thirds of them), 5 batches over 2 ranks (the last round pads
    one), and the file equals the single process's dataset capture."""
    import torch

    torch.save(torch.randn(13, 7, generator=torch.Generator().manual_seed(3)), tmp_path / "x.pt")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    common = ["--model", SHARDED_MODEL, "--trust", "--input", str(tmp_path / "x.pt"), "--batch-size", "3",
              "--stats-only"]
    single = subprocess.run([sys.executable, "-m", "gradexplorer", "capture", *common, "-q",
                             "--out", str(tmp_path / "one.pt")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr
    dist = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "gradexplorer", "capture", *common, "--shard", "fsdp",
                           "--shard-blocks", "blocks.*", "head", "--out", str(tmp_path / "two.pt")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert dist.returncode == 0, dist.stderr[-3000:]
    assert "sharded over 2 processes in 4 blocks and the root" in dist.stderr  # the estimate line
    assert "parameters sharded over 2 ranks" in dist.stderr
    assert "sharded   FSDP2 over 2 processes" in dist.stdout
    one, two = entries(tmp_path / "one.pt"), entries(tmp_path / "two.pt")
    shard = two["meta"]["shard"]
    assert shard["blocks"] == ["blocks.0", "blocks.1", "blocks.2", "head"] and shard["world_size"] == 2
    # measured on each rank from its local shards: padded rows, well under the whole
    assert len(shard["rank_param_bytes"]) == 2
    assert all(0 < held < 0.6 * shard["param_bytes"] for held in shard["rank_param_bytes"])
    assert shard["param_bytes"] == one_param_bytes()
    assert two["meta"]["world_size"] == 2
    assert_same_capture(one, two)
    # the layers' types are the user's, not FSDP2's wrappers (FSDPLinear)
    cap = load_capture(tmp_path / "two.pt")
    assert cap.layers["head"].type == "Linear" and cap.layers["blocks.0.fc"].type == "Linear"


def one_param_bytes() -> int:
    from tests.core.sharded_dataset_worker import make_model

    return sum(p.numel() * p.element_size() for p in make_model().parameters())


@pytest.mark.parametrize("argv, needle", [
    (["--shard", "fsdp", "--batch-size", "3", "--stats-only"], "was not started by torchrun"),
    (["--shard", "fsdp", "--stats-only"], "add --batch-size N and --stats-only"),
    (["--shard", "fsdp", "--batch-size", "3"], "(--batch-size, --shard) keeps statistics only"),
    (["--shard-blocks", "blocks.*", "--batch-size", "3", "--stats-only"], "add --shard fsdp"),
])
def test_shard_refusals(tmp_path, capsys, monkeypatch, argv, needle):
    import torch

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    torch.save(torch.randn(4, 7), tmp_path / "x.pt")
    code, _out, err = run(capsys, "capture", "--model", SHARDED_MODEL, "--trust", "--input", tmp_path / "x.pt",
                          *argv, "--out", tmp_path / "s.pt")
    assert code == common.EXIT_USER, err
    assert needle in err and "Traceback" not in err, err
    assert not (tmp_path / "s.pt").exists()
