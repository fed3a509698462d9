"""Statistics written into their records on first read (``gradexplorer.stats.pending``,
``Capture.layers``): the records a reader sees are those of the tensors the capture saw,
against float64 NumPy and ``torch.autograd.grad`` on the same graph, whenever and from
wherever they are first read."""

from __future__ import annotations

import copy
import math
import pickle
import threading

import pytest
import torch
from torch import nn

from gradexplorer.capturing.capture import capture
from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.pending import PendingRecords
from tests.core.test_stats import ADVERSARIAL, assert_matches_reference

pytestmark = pytest.mark.skipif(not cpu_stats.available(), reason="needs the compiled CPU statistics (numba)")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()


def _truth(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Activations, their gradients and the weights' gradients, from plain hooks and
    ``torch.autograd.grad`` on the same graph (the capture's default target: the top-1 logit)."""
    outs: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda m, a, o, n=n: outs.__setitem__(n, o))
               for n, m in model.named_children()]
    try:
        y = model(x)
    finally:
        for h in handles:
            h.remove()
    names = list(outs)
    weights = [model.get_submodule(n).weight for n in ("0", "2")]
    grads = torch.autograd.grad(y.max(dim=1).values.sum(), [outs[n] for n in names] + weights)
    truth = {f"{n}.activation": outs[n].detach() for n in names}
    truth.update({f"{n}.grad_output": g for n, g in zip(names, grads)})
    truth.update({"0.weight": grads[-2], "2.weight": grads[-1]})
    return truth


def _assert_records_are_of(cap, truth: dict[str, torch.Tensor]) -> None:
    for key, t in truth.items():
        name, kind = key.split(".")
        stats = cap[name].param_stats[kind] if kind == "weight" else cap[name].calls[0].stats[kind]
        assert_matches_reference(stats, t)
        assert int(stats["hist"].sum()) == t.numel()


@pytest.mark.parametrize("mode", ["stats", "full"])
def test_a_capture_writes_its_records_when_first_read(mode):
    model, x = _mlp(), torch.randn(5, 8)
    truth = _truth(model, x)
    cap = capture(model, x, mode=mode)
    unread = cap.__dict__["_layers"]["0"].calls[0].stats["activation"]
    assert unread == {} and "_pending" in cap.__dict__  # computed, not yet written
    _assert_records_are_of(cap, truth)
    assert "_pending" not in cap.__dict__
    assert cap.__dict__["_layers"]["0"].calls[0].stats["activation"] is unread  # the record handed out, filled


def test_records_read_after_later_captures_are_still_their_own():
    # The later captures reuse the buffers the first one's values were copied into: what
    # waits is the first one's computed rows, not its tensors.
    model = _mlp()
    x1, x2 = torch.randn(5, 8), torch.randn(5, 8) * 100
    truth = _truth(model, x1)
    first = capture(model, x1, mode="stats")
    second = capture(model, x2, mode="stats")
    capture(model, -x2, mode="stats").layers  # noqa: B018 - (read: written)
    _assert_records_are_of(first, truth)
    _assert_records_are_of(second, _truth(model, x2))


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_a_copy_of_an_unread_capture_has_every_record(how):
    model, x = _mlp(), torch.randn(5, 8)
    truth = _truth(model, x)
    cap = capture(model, x, mode="stats")
    assert "_pending" in cap.__dict__
    other = {"pickle": lambda c: pickle.loads(pickle.dumps(c)), "deepcopy": copy.deepcopy, "copy": copy.copy}[how](cap)
    assert "_pending" not in other.__dict__
    _assert_records_are_of(other, truth)
    _assert_records_are_of(cap, truth)


def test_threads_reading_a_capture_first_all_see_written_records():
    model, x = _mlp(), torch.randn(5, 8)
    truth = _truth(model, x)
    for _ in range(20):
        cap = capture(model, x, mode="stats")
        start = threading.Barrier(4)
        seen: list[set] = []

        def read(cap=cap, start=start, seen=seen) -> None:
            start.wait()
            seen.append(set(cap.layers["2"].calls[0].stats["grad_output"]))

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(seen) == 4 and all({"mean", "std", "hist", "nan_count"} <= keys for keys in seen)
    _assert_records_are_of(cap, truth)


def test_a_capture_with_nan_writes_its_records_for_the_onset():
    class Divide(nn.Module):
        def forward(self, x):
            return x / (x - x)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Divide(), nn.Linear(4, 2)).eval()
    x = torch.rand(3, 4) + 0.5
    cap = capture(model, x, mode="stats", target="sum")
    assert "_pending" not in cap.__dict__  # written inside: the onset read the counts
    assert cap.nonfinite_onset["forward"]["layer"] == "1"
    h = model[0](x).detach()
    assert_matches_reference(cap["0"].calls[0].stats["activation"], h)
    assert cap["1"].calls[0].stats["activation"]["nan_count"] == int(torch.isnan(h / (h - h)).sum())


def test_records_written_later_equal_records_written_at_once():
    made = {n: ADVERSARIAL[n]() for n in sorted(ADVERSARIAL)}
    # (what the capture's batches hold: float32 and half tensors; float64 ones are written at once)
    names = [n for n, t in made.items() if t.dtype in (torch.float32, torch.float16, torch.bfloat16) and t.numel()]
    tensors = [made[n] for n in names]
    assert len({t.dtype for t in tensors}) > 1
    at_once = cpu_stats.summarize_many(tensors, None)
    later, into = PendingRecords(), [{} for _ in tensors]
    got = cpu_stats.summarize_many(tensors, None, into, later)
    assert all(g is r for g, r in zip(got, into)) and all(r == {} for r in into) and len(later) >= 1
    assert later.nonfinite == any(not bool(torch.isfinite(t).all()) for t in tensors)
    later.fill()
    assert len(later) == 0
    for name, a, b, t in zip(names, at_once, into, tensors):
        assert set(a) == set(b), name
        for key in a:
            if key == "hist":
                assert torch.equal(a[key], b[key]), name
            elif isinstance(a[key], float) and math.isnan(a[key]):
                assert math.isnan(b[key]), (name, key)
            else:
                assert a[key] == b[key], (name, key)
        assert_matches_reference(b, t)


def test_a_batch_that_holds_no_nan_nor_inf_says_so():
    later = PendingRecords()
    cpu_stats.summarize_many([torch.randn(10), torch.randn(7)], None, [{}, {}], later)
    assert not later.nonfinite
    cpu_stats.summarize_many([torch.tensor([1.0, math.inf])], None, [{}], later)
    assert later.nonfinite
