"""Statistics of many tensors together (core/gradexplorer/stats/batched.py) equal float64 NumPy and
``tensor_stats`` tensor by tensor: the adversarial set of tests/core/test_stats.py at once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradexplorer.stats.batched import BLOCK, batched_stats, device_batched_stats
from gradexplorer.stats.tensor_stats import tensor_stats
from tests.core.test_stats import ADVERSARIAL, CONTRACT, _randn, assert_matches_reference


def assert_within_contract_of(b: dict, a: dict, what) -> None:
    """``b``'s moments within twice the accuracy contract of ``a``'s (each path holds it
    against float64: the fused CPU pass sums float32 tensors in float32 lanes, the batched
    statistics in float64): relative for std, mean |x| and l2, times mean |x| for the mean."""
    for key in ("std", "mean_abs", "l2"):
        assert b[key] == pytest.approx(a[key], rel=2 * CONTRACT, abs=1e-300), (what, key)
    assert b["mean"] == pytest.approx(a["mean"], abs=2 * CONTRACT * a["mean_abs"]), (what, "mean")


def _all():
    names = sorted(ADVERSARIAL)
    return names, [ADVERSARIAL[n]() for n in names]


#: The CPU's batches (one compiled call per dtype) and the device path's torch operations,
#: run here on CPU tensors.
BATCHED = {"cpu": batched_stats, "device": device_batched_stats}


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(BATCHED))
@pytest.mark.parametrize("limit", [1 << 14, None])
def test_every_adversarial_tensor_at_once_equals_float64_numpy(limit, path):
    names, tensors = _all()
    got = BATCHED[path](tensors, limit)
    assert len(got) == len(tensors)
    for name, t, s in zip(names, tensors, got):
        try:
            assert_matches_reference(s, t)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.parametrize("path", sorted(BATCHED))
def test_histograms_and_ranges_are_tensor_stats_ones(path):
    names, tensors = _all()
    for name, t, s in zip(names, tensors, BATCHED[path](tensors)):
        ref = tensor_stats(t)
        assert s["hist_range"] == ref["hist_range"], name
        assert s["hist_exact"] == ref["hist_exact"], name
        assert torch.allclose(s["hist"], ref["hist"], rtol=1e-5), name


@pytest.mark.parametrize("path", sorted(BATCHED))
def test_block_edges_constants_and_all_nan_tensors_side_by_side(path):
    """Tensors that end mid-block sit next to each other: padding never leaks between them."""
    tensors = [torch.full((BLOCK + 1,), 3.25), torch.full((7,), float("nan")), _randn(1),
               1e4 + 1e-3 * _randn(3 * BLOCK - 1), torch.full((BLOCK,), -2.0).half()]
    got = BATCHED[path](tensors)
    assert got[0]["std"] == 0.0 and got[0]["mean"] == 3.25  # Chan's shifted form: exact
    assert got[1]["nan_count"] == 7 and got[1]["numel"] == 7
    for t, s in zip(tensors, got):
        assert_matches_reference(s, t)


@pytest.mark.parametrize("budget", [1 << 30, 1])
def test_a_capture_with_batched_gradient_statistics_equals_one_without(monkeypatch, budget):
    """GRADEXPLORER_BATCHED_STATS=all (=1 takes device tensors only): the gradients'
    statistics are kept and summarised together at the end of the capture, the outputs' at
    the end of forward (or whenever
    BATCH_BYTES are held: 1 byte flushes at every gradient), with the same numbers and the
    same NaN/Inf onset."""
    import torchvision

    from gradexplorer.capturing.capture import capture
    from gradexplorer.stats import device as device_stats

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    plain = capture(model, x, mode="stats")
    import gradexplorer.stats.batched as module

    calls = []
    real = module.device_batched_stats
    monkeypatch.setattr(module, "device_batched_stats", lambda ts, limit: calls.append(len(ts)) or real(ts, limit))
    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "all")
    monkeypatch.setattr(device_stats, "BATCH_BYTES", budget)
    batched = capture(model, x, mode="stats")
    # The outputs at the end of forward, the gradients at the end of backward.
    assert calls and (len(calls) == 2 if budget > 1 else max(calls) == 1)
    compared = 0
    for name, layer in plain.layers.items():
        for call, other in zip(layer.calls, batched.layers[name].calls):
            for kind in ("grad_output", "grad_input"):
                a, b = call.stats[kind], other.stats[kind]
                assert (a is None) == (b is None), (name, kind)
                if a is None:
                    continue
                compared += 1
                for key in ("numel", "nan_count", "inf_count", "min", "max", "zero_fraction", "hist_range"):
                    assert a[key] == b[key], (name, kind, key)
                assert_within_contract_of(b, a, (name, kind))
                assert torch.allclose(a["hist"], b["hist"], rtol=1e-5)
    assert compared > 50
    assert batched.nonfinite_onset == plain.nonfinite_onset


def _cases():
    import torchvision

    from tests import people_models

    def resnet18():
        torch.manual_seed(0)
        return torchvision.models.resnet18(num_classes=10).eval()

    return {
        # In-place ReLUs after BatchNorm, `out += identity`: outputs changed after their hook.
        "resnet18": (resnet18, lambda: torch.randn(2, 3, 64, 64), "top1"),
        "lstm": (people_models.lstm, lambda: torch.randint(0, 11, (3, 7)), "sum"),
        "transformer": (people_models.transformer, lambda: torch.randint(0, 11, (3, 5)), "top1"),
        "dict_output": (people_models.dict_output, lambda: torch.randn(4, 5), "top1@out"),
        "bf16": (people_models.bf16, lambda: torch.randn(2, 3, 64, 64, dtype=torch.bfloat16), "top1"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stats", "full"])
@pytest.mark.parametrize("case", sorted(_cases()))
def test_outputs_are_summarised_together_after_forward_from_copies_taken_at_call_time(monkeypatch, case, mode):
    """With batched statistics, a capture summarises the outputs together at the end of
    forward (one batch before backward's), from copies taken when each module returned, in
    the first capture of a model as in the n-th: their statistics are those of the value the
    module returned (float64 NumPy of the tensors plain autograd records), also where a later
    in-place op changed it, as are the gradients' and the parameters' ones."""
    import gradexplorer.stats.batched as module
    from gradexplorer.capturing.capture import capture
    from gradexplorer.capturing.selection import leaf_names
    from tests.core.test_stats import numpy_reference
    from tests.ground_truth import reference

    make, inputs, target = _cases()[case]
    model, x = make(), inputs()
    names = leaf_names(model)
    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "all")
    sizes = []
    real = module.device_batched_stats
    monkeypatch.setattr(module, "device_batched_stats", lambda ts, limit: sizes.append(len(ts)) or real(ts, limit))
    capture(model, x, mode=mode, target=target)
    assert len(sizes) == 2 and sizes[0] > 0, sizes  # outputs at the end of forward, then gradients
    sizes.clear()
    cap = capture(model, x, mode=mode, target=target)
    assert len(sizes) == 2 and sizes[0] > 0, sizes  # the same in a later capture
    ref = reference(model, x, names, target=target)

    checked = 0
    for name in names:
        for call, want in zip(cap[name].calls, ref["calls"][name], strict=True):
            got = call.stats["activation"]
            if want["activation"] is None:
                continue
            r = numpy_reference(want["activation"])
            assert got["numel"] == r["numel"] and got["nan_count"] == r["nan_count"], name
            # min and max exactly: an output an in-place ReLU changed later would read min 0.
            assert (got["min"], got["max"]) == (r["min"], r["max"]), name
            assert got["mean"] == pytest.approx(r["mean"], abs=CONTRACT * r["mean_abs"]), name  # the contract
            if mode == "full":
                assert torch.equal(call.activation, want["activation"]), name
            for kind in ("grad_output", "grad_input"):
                g = want[kind]
                assert (call.stats[kind] is None) == (g is None), (name, kind)
                if g is not None:
                    scale = float(g.abs().max()) or 1.0
                    assert call.stats[kind]["mean"] == pytest.approx(float(g.double().mean()), abs=1e-5 * scale)
                    assert call.stats[kind]["max"] == pytest.approx(float(g.max()), abs=1e-5 * scale)
            checked += 1
        for pname, g in ref["params"][name].items():
            if g is not None:
                scale = float(g.abs().max()) or 1.0
                assert cap[name].param_stats[pname]["l2"] == pytest.approx(float(g.double().norm()), abs=1e-5 * scale)
    assert checked >= 3


def test_an_output_changed_later_is_summarised_as_it_was_in_every_capture(monkeypatch):
    """An in-place ReLU, then a write through ``.data`` (which bumps no version counter),
    change fc's output after its module returned: its batched statistics are those of the
    value fc returned, in the first capture and in the next ones."""
    from gradexplorer.capturing.capture import capture
    from tests.core.test_capture import Flip
    from tests.core.test_capture_exactness import ClampedThroughData

    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "all")
    torch.manual_seed(0)
    for model in (Flip(), ClampedThroughData()):
        x = torch.randn(3, 4)
        if isinstance(model, Flip):
            model.inplace_next = True
        want = model.fc(x).detach()
        assert float(want.min()) < 0
        for mode in ("stats", "full", "stats"):
            cap = capture(model, x, mode=mode)
            got = cap["fc"].calls[0].stats["activation"]
            assert got["min"] == float(want.min())
            assert got["mean"] == pytest.approx(float(want.double().mean()),
                                                abs=CONTRACT * float(want.double().abs().mean()))
            if mode == "full":
                assert torch.equal(cap["fc"].calls[0].activation, want)


@pytest.mark.parametrize("mode", ["stats", "full"])
def test_on_the_cpu_small_tensors_are_summarised_together_and_the_device_batch_waits_for_all(monkeypatch, mode):
    """On the CPU a capture's small tensors (activations copied when their module returns,
    gradients, parameters' gradients) are summarised together, in one batch for all of a
    small model, with the statistics of the value each module returned, also when an
    in-place op changes it afterwards (fc's output, by ``relu_``) and in the capture that
    first sees that change. Statistics-only capture reads fc's output where it lies as
    fc returns it, instead of batching a copy (gradexplorer.stats.immediate).
    GRADEXPLORER_BATCHED_STATS=1 adds no device batch there."""
    import gradexplorer.stats.batched as module
    from gradexplorer.capturing.capture import capture
    from gradexplorer.stats import immediate
    from tests.core.test_capture import Flip
    from tests.core.test_stats import numpy_reference

    torch.manual_seed(0)
    model, x = Flip(), torch.randn(3, 4)
    device_calls, small, now = [], [], []
    monkeypatch.setattr(module, "device_batched_stats", lambda ts, limit: device_calls.append(len(ts)))
    real = module.batched_stats
    monkeypatch.setattr(module, "batched_stats",
                        lambda ts, limit, into=None, later=None: small.append(len(ts)) or real(ts, limit, into, later))
    real_add = immediate.ImmediateStats.add
    monkeypatch.setattr(immediate.ImmediateStats, "add", lambda self, t: now.append(t.shape) or real_add(self, t))
    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "1")
    for inplace in (False, True, True):
        model.inplace_next = inplace
        small.clear()
        now.clear()
        cap = capture(model, x, mode=mode)
        want = model.fc(x).detach()
        # fc's output, its gradient, weight's and bias's; the output read at once in statistics-only capture
        assert now == ([want.shape] if mode == "stats" and immediate.available() else []), now
        assert sum(small) + len(now) == 4 and len(small) <= 2, small
        got = cap["fc"].calls[0].stats["activation"]
        ref = numpy_reference(want)
        assert (got["min"], got["max"], got["numel"]) == (ref["min"], ref["max"], ref["numel"])
        assert got["min"] < 0  # before the ReLU
        assert got["mean"] == pytest.approx(ref["mean"], abs=CONTRACT * ref["mean_abs"])
        if mode == "full":
            assert torch.equal(cap["fc"].calls[0].activation, want)
    assert device_calls == []


def test_a_batch_that_fails_is_summarised_one_tensor_at_a_time(monkeypatch, caplog):
    """The batch's buffers can exhaust a GPU that forward and backward have filled: then the
    kept tensors are summarised one by one, with the same numbers, and the capture goes on."""
    import gradexplorer.stats.batched as module
    from gradexplorer.capturing.capture import capture
    from tests import people_models

    model, x = people_models.transformer(), torch.randint(0, 11, (3, 5))
    plain = capture(model, x, mode="stats")
    failed = []

    def out_of_memory(tensors, limit):
        failed.append(len(tensors))
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(module, "device_batched_stats", out_of_memory)
    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "all")
    for _ in range(2):
        got = capture(model, x, mode="stats")
    assert failed and "batched statistics failed (RuntimeError: CUDA out of memory" in caplog.text
    for name, i, call in plain.iter_calls():
        for kind, a in call.stats.items():
            b = got[name].calls[i].stats[kind]
            assert (a is None) == (b is None), (name, kind)
            if a is not None:
                assert b["mean"] == pytest.approx(a["mean"], rel=1e-12, abs=1e-15), (name, kind)
                assert (b["min"], b["max"], b["numel"]) == (a["min"], a["max"], a["numel"]), (name, kind)
    for name, layer in plain.layers.items():
        for p, a in layer.param_stats.items():
            assert got[name].param_stats[p]["l2"] == pytest.approx(a["l2"], rel=1e-12), (name, p)


def test_a_failed_batch_of_device_tensors_goes_to_the_per_tensor_kernels(monkeypatch):
    """Where the fused per-tensor kernels apply (GPU tensors), a failed batch falls back to
    them, not to the torch operations (whose float64 temporaries would need more of a full
    GPU): their rows fill the very dicts the records already hold, at ``resolve``."""
    from gradexplorer.stats import device as device_stats

    launched = []

    def fake_launch(t, limit):
        launched.append(t)
        return torch.tensor([float(len(launched))]), t.numel(), True

    def failing(tensors, limit):
        raise RuntimeError("CUDA out of memory")

    import gradexplorer.stats.batched as module

    monkeypatch.setattr(module, "device_batched_stats", failing)
    monkeypatch.setattr(device_stats, "launch", fake_launch)
    monkeypatch.setattr(device_stats, "stats_from_row", lambda values, n, exact: {"row": values, "numel": n})
    monkeypatch.setattr(device_stats.DeferredStats, "_use_fused", lambda self, t: True)
    monkeypatch.setattr(device_stats, "tensor_stats", lambda t, limit: pytest.fail("torch path taken"))
    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "all")
    summaries = device_stats.DeferredStats(1 << 14)
    a, b = torch.randn(10), torch.randn(20)
    held = [summaries.summarize_later(a), summaries.summarize_later(b)]
    assert held == [{}, {}] and not launched
    summaries.resolve()
    assert len(launched) == 2 and torch.equal(launched[0], a) and torch.equal(launched[1], b)
    assert held == [{"row": [1.0], "numel": 10}, {"row": [2.0], "numel": 20}]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return a == b and type(a) is type(b)


def test_the_statistics_of_a_batch_of_tensors_equal_each_tensors_own(monkeypatch):
    """Many CPU tensors summarised together (one compiled call per dtype) get, tensor by
    tensor, the very record ``tensor_stats`` gives each alone: every key equal, number for
    number (the same pass over the same values, whatever sits beside them in the batch).
    The adversarial set and 300 seeded tensors at the kernel's edges (float32, float16,
    bfloat16; NaN, Inf, signed zeros, outliers, means that jump), in one batch; and the
    device path's torch operations within the accuracy contract of the same records."""
    from gradexplorer.stats import cpu as cpu_stats
    from tests.core.test_stats import _random_case

    if not cpu_stats.available():
        pytest.skip("numba is not installed")
    # Alone, tensors over a million values could take the parallel pass on a machine of
    # four threads or more (other chunks, other roundings): serial, as a batch is.
    monkeypatch.setattr(cpu_stats, "_PARALLEL_MIN_THREADS", 1 << 30)
    names, tensors = _all()
    names += [f"seeded {i}" for i in range(300)]
    tensors += [_random_case(i) for i in range(300)]
    together = batched_stats(tensors)
    assert len(together) == len(tensors)
    for name, t, got in zip(names, tensors, together):
        alone = tensor_stats(t)
        assert sorted(got) == sorted(alone), name
        for key in alone:
            assert _same(got[key], alone[key]), (name, key, got[key], alone[key])
    for name, got, dev in zip(names, together, device_batched_stats(tensors)):
        for key in ("numel", "nan_count", "inf_count", "min", "max", "zero_fraction"):
            assert _same(dev[key], got[key]), (name, key)
        if got["numel"] > got["nan_count"] + got["inf_count"]:
            assert_within_contract_of(dev, got, name)


def test_small_tensors_read_as_handed_over_get_each_tensors_own_statistics():
    """``ImmediateStats`` (a small output copied when its module returns, summarised with
    the others when its buffer is full or at the flush) gives every tensor the very record
    ``tensor_stats`` gives it alone, number for number, and within the accuracy contract of
    float64 NumPy: the adversarial set's tensors that it takes (float32, float16, bfloat16
    of up to the histogram's exact limit, the three dtypes mixed in one buffer) and 300
    seeded ones at the kernel's edges, over several fillings of a small buffer. Taken at
    the moment it is added: a later change to a tensor does not reach its record. What it
    cannot read where it lies is refused (``None``)."""
    from gradexplorer.stats import immediate
    from gradexplorer.stats.moments import HIST_EXACT_LIMIT
    from tests.core.test_stats import _random_case

    if not immediate.available():
        pytest.skip("numba is not installed")
    names, tensors = _all()
    names += [f"seeded {i}" for i in range(300)]
    tensors += [_random_case(i) for i in range(300)]
    taken = [(n, t) for n, t in zip(names, tensors)
             if t.dtype in immediate.DTYPES and 0 < t.numel() <= HIST_EXACT_LIMIT and t.is_contiguous()]
    assert {t.dtype for _n, t in taken} == set(immediate.DTYPES)
    arena = 4 * HIST_EXACT_LIMIT + 4096
    assert sum(t.numel() * t.element_size() for _n, t in taken) > 3 * arena  # the buffer fills, and is reused
    now = immediate.ImmediateStats(HIST_EXACT_LIMIT, arena_bytes=arena)
    changed = torch.randn(64)
    want = tensor_stats(changed)
    records = [now.add(t) for _n, t in taken[:-3]] + [now.add(changed)] + [now.add(t) for _n, t in taken[-3:]]
    changed.mul_(-3.0)  # after it was taken: its record is of the value it had then
    assert all(r is not None for r in records)
    assert any(records) and not all(records)  # some filled when the buffer was full, the rest below
    now.fill()
    changed_record = records.pop(len(taken) - 3)
    for (name, t), got in zip(taken, records):
        alone = tensor_stats(t)
        assert sorted(got) == sorted(alone), name
        for key in alone:
            assert _same(got[key], alone[key]), (name, key, got[key], alone[key])
        if not name.startswith("seeded"):
            assert_matches_reference(got, t)
    assert changed_record["min"] == want["min"] and changed_record["mean"] == want["mean"]
    refused = {"float64": torch.randn(8, dtype=torch.float64), "int": torch.arange(8),
               "transposed": torch.randn(4, 6).t(), "negative view": torch._neg_view(torch.randn(8)),
               "a subclass": nn.Parameter(torch.randn(8)), "not in memory": torch.empty(8, device="meta"),
               "over the limit": torch.randn(HIST_EXACT_LIMIT + 1)}
    for name, t in refused.items():
        assert now.add(t) is None, name
    assert len(now) == 0  # nothing pending: the refused ones left no row


def test_small_tensors_taken_as_handed_over_fall_back_to_torch_operations(monkeypatch):
    """When the compiled call fails, the copies taken are summarised by torch operations:
    every record is ``tensor_stats``'s of the value the tensor had when it was added."""
    from gradexplorer.stats import cpu as cpu_stats, immediate
    from gradexplorer.stats.moments import torch_stats

    if not immediate.available():
        pytest.skip("numba is not installed")

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(cpu_stats, "summarize_at", broken)
    tensors = [_randn(300), _randn(64).to(torch.bfloat16), ADVERSARIAL["large_mean_tiny_std_small"](),
               _randn(5).to(torch.float16)]
    want = [torch_stats(t, None) for t in tensors]
    now = immediate.ImmediateStats(1 << 13)
    records = [now.add(t) for t in tensors]
    assert all(r is not None for r in records)
    for t in tensors:
        t.mul_(2.0)  # after they were taken
    now.fill()
    for got, expected in zip(records, want):
        assert sorted(got) == sorted(expected)
        for key in expected:
            assert _same(got[key], expected[key]), (key, got[key], expected[key])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_statistics_only_capture_reads_outputs_where_they_lie_and_agrees_with_full(dtype):
    """Statistics-only capture reads each small output where it lies as its module returns;
    full capture summarises the copy it keeps, in the batch. The two give every call's
    activation the same record, key for key, and both equal float64 NumPy on the kept copy
    within the accuracy contract."""
    from gradexplorer.capturing.capture import capture
    from gradexplorer.stats import immediate
    from tests.core.test_stats import numpy_reference

    if not immediate.available():
        pytest.skip("numba is not installed")
    torch.manual_seed(0)
    model = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(16, 16), nn.GELU())]).to(dtype)
    x = torch.randn(5, 16, dtype=dtype)
    stats, full = capture(model, x, mode="stats"), capture(model, x, mode="full")
    compared = 0
    for name in full.layers:
        for a, b in zip(stats[name].calls, full[name].calls):
            got, want = a.stats["activation"], b.stats["activation"]
            assert sorted(got) == sorted(want), name
            for key in want:
                assert _same(got[key], want[key]), (name, key, got[key], want[key])
            ref = numpy_reference(b.activation)
            assert (got["min"], got["max"]) == (ref["min"], ref["max"])
            assert got["mean"] == pytest.approx(ref["mean"], abs=CONTRACT * ref["mean_abs"])
            compared += 1
    assert compared == 12  # the twelve leaves
