"""Statistics over a whole dataset: every batch captured, merged exactly, bounded memory.

``gradexplorer capture --input FOLDER --batch-size N --stats-only --out FILE.pt`` runs
:func:`capture_dataset` over the folder's images, ``N`` at a time. Each batch gets one
forward and one ``torch.autograd.grad`` (the user's ``.grad`` is untouched), with
``gradexplorer.recording.layer_recorder`` hooks on the selected modules; its statistics are merged into
running totals (``gradexplorer.stats.merge``: exact counts and histograms, Chan's mean and std),
so memory does not grow with the dataset, except for the per-batch series
(:data:`SERIES_FIELDS`, a few numbers per layer and batch).

Under ``torchrun`` each rank takes the batches whose index ``b`` has ``b % world ==
rank``; :func:`gather_to_rank0` merges the ranks' totals with a collective (gloo on the
CPU, NCCL on GPUs) and rank 0 writes the file. The batches are the same as one process
would make, so the merged statistics equal the single-process ones up to the order of
float64 additions, and the series are identical.

The front ends run it through ``gradexplorer.pipeline.dataset_job.DatasetJob`` (the options of
a ``CaptureJob``, the memory estimate against the budget, the capture's metadata).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gradexplorer.base.devices import resolve_device
from gradexplorer.base.errors import CaptureCancelled, CaptureError, GradExplorerError
from gradexplorer.base.forward_errors import forward_fix
from gradexplorer.batches import load_batch
from gradexplorer.batches.images import expand_image_paths
from gradexplorer.capturing.capture import CancelFlag
from gradexplorer.capturing.data import CallRecord, CallStats, Capture, LayerRecord, param_name
from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.selection import LayerSpec, resolve_layers
from gradexplorer.capturing.sharded_params import refuse_sharded_params
from gradexplorer.capturing.targets import parse_target, target_scalar
from gradexplorer.hooks.installed import model_state_preserved
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.recording.collective_failure import collective_failed
from gradexplorer.recording.layer_recorder import LayerRecorder, RowKey
from gradexplorer.recording.sharded import original_class
from gradexplorer.stats.merge import (
    DatasetTensorStats,
    GradientMoments,
    GradientSummary,
    MergeStats,
    MomentSums,
    hist_edges,
)

#: Per batch and row, the numbers kept in the series (float64).
SERIES_FIELDS = ("mean", "std", "l2", "max_abs", "nonfinite")

DatasetProgress = Callable[[int, int, int], None]  # (batches done, total batches, samples done)


def _row_name(key: RowKey) -> str:
    layer, call, kind = key
    return f"{layer}#{call}:{kind}"


def _series_values(s: MergeStats) -> list[float]:
    summ = s.summary()
    max_abs = max(abs(summ["min"]), abs(summ["max"])) if s.count else math.nan
    return [summ["mean"], summ["std"], summ["l2"], max_abs, float(s.nan_count + s.inf_count)]


class DatasetStats:
    """Running totals of a dataset capture (one rank's, or merged).

    Attributes
    ----------
    rows : dict
        ``(layer, call, kind) -> MergeStats``; kinds as in the watch log (``activation``,
        ``grad_output``, ``grad_norm``, and ``grad`` per parameter, ``layer`` being the
        parameter's qualified name, call 0).
    moments : dict
        Parameter name -> ``GradientMoments`` across batches (gradient signal-to-noise).
    moment_sums : dict
        Parameter name -> ``MomentSums``: the same moments, summed over the elements of a
        part of the parameter (a sharded capture keeps each parameter's moments on the
        rank that holds its part, ``gradexplorer.recording.sharded_dataset``); the parts of
        the ranks add up.
    series : dict
        Batch index -> ``(samples, {row name: [mean, std, l2, max_abs, nonfinite]})``.
    samples, batches : int
    """

    def __init__(self) -> None:
        self.rows: dict[RowKey, MergeStats] = {}
        self.moments: dict[str, GradientMoments] = {}
        self.moment_sums: dict[str, MomentSums] = {}
        self.series: dict[int, tuple[int, dict[str, list[float]]]] = {}
        self.samples = 0
        self.batches = 0

    def add_batch(self, index: int, samples: int, rows: dict[RowKey, MergeStats],
                  param_grads: dict[str, torch.Tensor], snr: bool = True) -> None:
        """Merge one batch's statistics (and its parameter gradients) into the totals."""
        batch_rows = dict(rows)
        for pname, g in param_grads.items():
            batch_rows[(pname, 0, "grad")] = MergeStats.of_tensor(g)
            if snr:
                self.moments.setdefault(pname, GradientMoments()).add(g)
        for key, s in batch_rows.items():
            self.rows[key] = self.rows[key].merge(s) if key in self.rows else s
        self.series[index] = (samples, {_row_name(k): _series_values(v) for k, v in batch_rows.items()})
        self.samples += samples
        self.batches += 1

    def merge(self, other: DatasetStats) -> DatasetStats:
        """Totals over both (their batch indices must not overlap; their ``moment_sums``
        are over the same batches and disjoint elements)."""
        out = DatasetStats()
        # Self's keys first, then other's new ones; a key on one side only keeps its value.
        out.rows = dict(self.rows)
        for key, b in other.rows.items():
            a = out.rows.get(key)
            out.rows[key] = b if a is None else a.merge(b)
        out.moments = dict(self.moments)
        for name, b_m in other.moments.items():
            a_m = out.moments.get(name)
            out.moments[name] = b_m if a_m is None else a_m.merge(b_m)
        out.moment_sums = dict(self.moment_sums)
        for name, b_s in other.moment_sums.items():
            a_s = out.moment_sums.get(name)
            out.moment_sums[name] = b_s if a_s is None else a_s.add_part(b_s)
        out.series = {**self.series, **other.series}
        out.samples = self.samples + other.samples
        out.batches = self.batches + other.batches
        return out

    def to_dict(self) -> dict:
        """Plain types and CPU tensors (for ``gather_object`` and files)."""
        return {
            "rows": [[list(k), v.to_dict()] for k, v in self.rows.items()],
            "moments": {k: v.to_dict() for k, v in self.moments.items()},
            "moment_sums": {k: [v.batches, v.mean_sq, v.m2_sum] for k, v in self.moment_sums.items()},
            "series": {int(i): [n, vals] for i, (n, vals) in self.series.items()},
            "samples": self.samples, "batches": self.batches,
        }

    @classmethod
    def from_dict(cls, d: dict) -> DatasetStats:
        """Inverse of :meth:`to_dict`."""
        out = cls()
        out.rows = {(k[0], int(k[1]), k[2]): MergeStats.from_dict(v) for k, v in d["rows"]}
        out.moments = {k: GradientMoments.from_dict(v) for k, v in d["moments"].items()}
        out.moment_sums = {k: MomentSums(int(v[0]), float(v[1]), float(v[2]))
                           for k, v in d.get("moment_sums", {}).items()}
        out.series = {int(i): (int(v[0]), dict(v[1])) for i, v in d["series"].items()}
        out.samples, out.batches = int(d["samples"]), int(d["batches"])
        return out

    def snr(self) -> dict[str, GradientSummary]:
        """Parameter name -> ``GradientMoments.summary()`` (batches, mean_norm, var_sum, snr)."""
        out = {k: v.summary() for k, v in self.moments.items()}
        out.update({k: v.summary() for k, v in self.moment_sums.items()})
        return out


def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    out: dict[str, nn.Parameter] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out[name] = p
    return out


def recorded_params(model: nn.Module, layers: LayerSpec, selected: Sequence[str]) -> dict[str, nn.Parameter]:
    """The trainable parameters whose gradients a dataset capture records: those of the
    ``selected`` modules (and their children), every one when ``layers`` is ``None``."""
    params = _trainable(model)
    if layers is not None:
        chosen = {n for n in params if any(not layer or n.startswith(layer + ".") for layer in selected)}
        params = {n: p for n, p in params.items() if n in chosen}
    return params


def run_forward(model: nn.Module, x: torch.Tensor | ModelInputs, primary: torch.Tensor, index: int) -> Any:
    """The model's forward on batch ``index`` with gradients on (``primary`` is the input
    differentiated; ``x`` all the inputs).

    Raises
    ------
    CaptureError
        The forward failed: the batch, the error and advice (``gradexplorer.base.forward_errors``).
    """
    try:
        with torch.enable_grad():
            return x.call(model, primary) if isinstance(x, ModelInputs) else model(primary)
    except (GradExplorerError, CaptureCancelled):
        raise
    except Exception as exc:
        raise CaptureError(
            f"The model's forward failed on batch {index}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            forward_fix(exc)) from exc


def capture_dataset(
    model: nn.Module,
    batches: Iterable[tuple[int, torch.Tensor | ModelInputs, torch.Tensor | None]],
    *,
    layers: LayerSpec = None,
    target: str = "top1",
    device: str | torch.device | None = None,
    snr: bool = True,
    total_batches: int | None = None,
    progress: DatasetProgress | None = None,
    cancel: CancelFlag | None = None,
) -> DatasetStats:
    """Capture statistics over many batches and merge them.

    Parameters
    ----------
    model : nn.Module
        Run in eval mode; left as it was (modes, device, ``.grad``, no hooks).
    batches : iterable of (index, inputs, labels or None)
        The batches, each with its index in the whole dataset (for the series and for
        sharding).
    layers : None, str, iterable of str, or callable
        Modules to record (``gradexplorer.capturing.selection``); their parameters' gradients are recorded,
        all trainable parameters when ``None``.
    target : str
        The scalar to differentiate (``gradexplorer.capturing.targets``).
    device : str or torch.device, optional
        Where to run; ``None`` where the model is.
    snr : bool
        Keep each parameter gradient's element-wise mean and variance across batches
        (twice the parameters in float64 memory).
    total_batches : int, optional
        For progress.
    progress : callable, optional
        ``progress(batches_done, total_batches, samples_done)`` after each batch.
    cancel : object with ``is_set()``, optional
        Checked between batches and at every hooked call: ``CaptureCancelled``.

    Returns
    -------
    DatasetStats

    Raises
    ------
    GradExplorerError
        Bad layers or target, a model whose parameters are split over ranks (a sharded
        model: ``gradexplorer.recording.sharded_dataset``); ``CaptureError`` when forward or
        backward fails.
    """
    refuse_sharded_params(
        model, "a dataset capture",
        "run gradexplorer.recording.sharded_dataset.capture_dataset_sharded on every rank instead, or "
        "torchrun ... gradexplorer capture --batch-size N --stats-only --shard fsdp, which shards the model itself.")
    tgt = parse_target(target)
    selected = resolve_layers(model, layers)
    params = recorded_params(model, layers, selected)
    run_device = None
    if device is not None:
        run_device = resolve_device(device) if isinstance(device, str) else torch.device(device)
    stats = DatasetStats()
    # The recorder's gradients are those of this capture's own backward only, not of one
    # that the model's forward runs itself (a force field's forces).
    own_backward = [False]
    recorder = LayerRecorder(model, selected, cancel=cancel, when=lambda: own_backward[0])
    done = 0
    with model_state_preserved(model, False, run_device):
        dev = run_device or next((p.device for p in model.parameters()), torch.device("cpu"))
        all_params = _trainable(model)
        for index, inputs, labels in batches:
            if cancel is not None and cancel.is_set():
                raise CaptureCancelled()
            x = inputs.to(dev)
            # Several inputs (a .pt of a tuple or dict) run together; the first is the one
            # differentiated when the model has no trainable parameters.
            primary = x.primary if isinstance(x, ModelInputs) else x
            if not all_params and primary.is_floating_point():
                primary = primary.detach().requires_grad_(True)
            recorder.install()
            try:
                output = run_forward(model, x, primary, index)
                scalar = target_scalar(output, tgt, labels)
                wrt: list[torch.Tensor] = list(all_params.values()) or [primary]
                own_backward[0] = True
                grads = torch.autograd.grad(scalar, wrt, allow_unused=True)
            finally:
                own_backward[0] = False
                recorder.remove()
            grad_of = dict(zip(all_params, grads)) if all_params else {}
            param_grads = {n: grad_of[n].detach() for n in params if grad_of.get(n) is not None}
            stats.add_batch(index, len(inputs), recorder.rows, param_grads, snr=snr)
            recorder.rows = {}
            del output, scalar, grads, grad_of, param_grads
            done += 1
            if progress is not None:
                progress(done, total_batches or 0, stats.samples)
    return stats


# -- batches ---------------------------------------------------------------------------------


def shard(indices: Sequence[int], rank: int, world: int) -> list[int]:
    """The batch indices rank ``rank`` of ``world`` takes: every ``world``-th from ``rank``."""
    return [i for i in indices if i % world == rank]


def dataset_files(inputs: Sequence[str], max_samples: int | None = None) -> list[Path]:
    """The image files of folders and files, in a stable order, at most ``max_samples``.

    Raises
    ------
    GradExplorerError
        A path is missing or a folder holds no image (``gradexplorer.batches``'s messages).
    """
    files = expand_image_paths(list(inputs))
    return files[:max_samples] if max_samples is not None else files


def iter_image_batches(files: Sequence[Path], batch_size: int, loaded: LoadedModel, indices: Iterable[int]
                       ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """Load and yield batches ``indices`` of ``files`` (``batch_size`` files each), one at a
    time: only one batch of images is in memory."""
    for b in indices:
        chunk = [str(p) for p in files[b * batch_size:(b + 1) * batch_size]]
        batch = load_batch(chunk, loaded)
        yield b, batch.tensor, batch.labels


def iter_tensor_batches(tensor: torch.Tensor | ModelInputs, labels: torch.Tensor | None, batch_size: int,
                        indices: Iterable[int]
                        ) -> Iterator[tuple[int, torch.Tensor | ModelInputs, torch.Tensor | None]]:
    """Batches ``indices`` of a tensor already in memory (a ``.pt`` input; every input of a
    tuple or dict file)."""
    for b in indices:
        sl = slice(b * batch_size, (b + 1) * batch_size)
        yield b, tensor[sl], None if labels is None else labels[sl]


def batch_count(samples: int, batch_size: int) -> int:
    """Number of batches of ``batch_size`` (the last one may be smaller)."""
    return (samples + batch_size - 1) // batch_size


class DatasetSource:
    """The samples of a dataset capture: image files, or one ``.pt`` tensor file, in batches.

    Attributes
    ----------
    sources : list of str
        What the user gave (``--input``, the folder chosen in the window).
    samples : int
        Samples used (at most ``max_samples``).
    batch_size, total : int
        Samples per batch, and the number of batches.
    dtype : str or None
        The dtype of the batches' (first) input, as a capture's ``meta["dtype"]``
        (``"float32"``, or the model's dtype that pictures are cast to); known once a
        batch has been read.
    """

    def __init__(self, sources: Sequence[str], loaded: LoadedModel, batch_size: int,
                 max_samples: int | None = None) -> None:
        if batch_size < 1:
            raise GradExplorerError(f"the batch size {batch_size} is not a positive number;",
                                    "give the number of samples per batch, e.g. 32.")
        if max_samples is not None and max_samples < 1:
            raise GradExplorerError(f"the maximum of {max_samples} samples is not a positive number;",
                                    "give how many samples to use at most, or leave it out for all.")
        self.sources = [str(s) for s in sources]
        self.dtype: str | None = None
        self.loaded = loaded
        self.batch_size = batch_size
        self._tensor: torch.Tensor | ModelInputs | None = None
        self._labels: torch.Tensor | None = None
        self._files: list[Path] = []
        one = self.sources[0] if len(self.sources) == 1 else ""
        if one.lower().endswith((".pt", ".pth")) and Path(one).is_file():
            # load_batch, as for one capture: every input of a tuple or dict file (not only
            # the first), named inputs checked, float inputs in the model's dtype.
            tb = load_batch([one], loaded)
            n = len(tb) if max_samples is None else min(len(tb), max_samples)
            self._tensor = tb.model_input[:n]
            self._labels = tb.labels[:n] if tb.labels is not None else None
        else:
            self._files = dataset_files(self.sources, max_samples)
            n = len(self._files)
        self.samples = n
        self.total = batch_count(n, batch_size)

    def batches(self, indices: Iterable[int]) -> Iterator[tuple[int, torch.Tensor | ModelInputs, torch.Tensor | None]]:
        """Batches ``indices`` (see :func:`shard`), loaded one at a time."""
        if self._tensor is not None:
            loaded = iter_tensor_batches(self._tensor, self._labels, self.batch_size, indices)
        else:
            loaded = iter_image_batches(self._files, self.batch_size, self.loaded, indices)
        for item in loaded:
            if self.dtype is None:
                primary = item[1].primary if isinstance(item[1], ModelInputs) else item[1]
                self.dtype = str(primary.dtype).replace("torch.", "")
            yield item

    def batch(self, index: int) -> tuple[torch.Tensor | ModelInputs, torch.Tensor | None]:
        """Batch ``index`` alone: its inputs and labels (or None)."""
        _index, inputs, labels = next(iter(self.batches([index])))
        return inputs, labels

    def describe(self) -> str:
        """``"7 samples from imgs/ in batches of 3"`` (the capture's ``meta["batch"]``)."""
        return f"{self.samples} samples from {', '.join(self.sources)} in batches of {self.batch_size}"


# -- torch.distributed ------------------------------------------------------------------------


def gather_to_rank0(stats: DatasetStats) -> DatasetStats | None:
    """Merge every rank's totals on rank 0 (a collective: every rank must call it).

    Returns the merged totals on rank 0, ``None`` on the others.

    Raises
    ------
    GradExplorerError
        The gather failed (a rank that died or stopped), in one line with the process
        group's timeout.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list | None = [None] * world if rank == 0 else None
    try:
        dist.gather_object(stats.to_dict(), gathered, dst=0)
    except (RuntimeError, OSError) as exc:  # DistBackendError and gloo's peer errors
        raise collective_failed(f"Rank {rank} could not gather the ranks' totals on rank 0", exc,
                                "Nothing was saved.") from exc
    if rank != 0:
        return None
    assert gathered is not None
    merged = DatasetStats()
    for part in gathered:
        merged = merged.merge(DatasetStats.from_dict(part))
    return merged


# -- the capture file -----------------------------------------------------------------------


def _stats_entry(s: MergeStats) -> DatasetTensorStats:
    """A statistics record with ``gradexplorer.stats.tensor_stats.tensor_stats``'s keys, plus the exact merge.

    ``hist`` holds the signed log2 bins' counts (``hist_kind`` says so; ``hist_edges`` in
    the file's ``meta["dataset"]``), ``merged`` the ``MergeStats`` fields.
    """
    summ = s.summary()
    merged = s.to_dict()
    merged["hist"] = torch.from_numpy(np.asarray(merged["hist"]).copy())
    return {
        "numel": summ["numel"], "min": summ["min"], "max": summ["max"], "mean": summ["mean"],
        "std": summ["std"], "mean_abs": summ["mean_abs"], "l2": summ["l2"],
        "zero_fraction": summ["zero_fraction"], "nan_count": summ["nan_count"], "inf_count": summ["inf_count"],
        "hist": torch.from_numpy(s.hist.astype(np.float32)), "hist_range": (summ["min"], summ["max"]),
        "hist_exact": True, "hist_kind": "log2", "merged": merged,
    }


def to_capture(stats: DatasetStats, model: nn.Module, layers: Sequence[str], meta: dict) -> Capture:
    """A statistics-only ``Capture`` of the merged totals (``gradexplorer.files.capture_file`` saves it).

    Per layer and call, ``stats`` holds the merged activation and output-gradient
    statistics and ``grad_norm`` (per-sample norms); ``param_stats`` the parameter
    gradients'. ``meta["dataset"]`` holds samples, batches, the gradient SNR per parameter,
    the histogram edges and the per-batch series.
    """
    calls_of: dict[str, int] = {}
    for layer, call, kind in stats.rows:
        if kind != "grad":
            calls_of[layer] = max(calls_of.get(layer, 0), call + 1)
    out_layers: dict[str, LayerRecord] = {}
    for name in layers:
        module = model.get_submodule(name)
        rec = LayerRecord(original_class(module).__name__)  # not FSDP2's FSDP<class>
        for call in range(calls_of.get(name, 0)):
            entry: CallStats = {
                kind: (_stats_entry(stats.rows[(name, call, kind)]) if (name, call, kind) in stats.rows else None)
                for kind in ("activation", "grad_output", "grad_norm")}
            entry["grad_input"] = None
            rec.calls.append(CallRecord(stats=entry))
        for pname, _p in module.named_parameters(recurse=False):
            s = stats.rows.get((param_name(name, pname), 0, "grad"))
            rec.param_stats[pname] = _stats_entry(s) if s is not None else None
            rec.param_grads[pname] = None
        out_layers[name] = rec
    indices = sorted(stats.series)
    names = sorted({n for i in indices for n in stats.series[i][1]})
    series = {
        "batch": indices,
        "samples": [stats.series[i][0] for i in indices],
        "fields": list(SERIES_FIELDS),
        "rows": {n: torch.tensor([stats.series[i][1].get(n, [math.nan] * len(SERIES_FIELDS)) for i in indices],
                                 dtype=torch.float64) for n in names},
    }
    full_meta = dict(meta)
    full_meta.update({
        "mode": "stats",
        "not_called": [n for n in layers if calls_of.get(n, 0) == 0],
        "dataset": {
            "samples": stats.samples, "batches": stats.batches,
            "hist_kind": "signed log2 magnitude, one bin per power of two (gradexplorer.stats.merge)",
            "hist_edges": torch.from_numpy(hist_edges()),
            "snr": stats.snr(),
            "series": series,
        },
    })
    return Capture(full_meta, None, None, None, out_layers)


def eta_text(done: int, total: int, started: float, now: float | None = None) -> str:
    """``"12/40 batches, ETA 1m05s"`` from the rate so far."""
    now = time.monotonic() if now is None else now
    if done <= 0 or total <= 0:
        return f"{done}/{total or '?'} batches"
    left = (now - started) / done * (total - done)
    minutes, seconds = divmod(int(round(left)), 60)
    eta = f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
    return f"{done}/{total} batches, ETA {eta}"
