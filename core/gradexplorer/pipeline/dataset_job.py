"""One capture over a whole dataset for every front end: a :class:`CaptureJob`'s model, layers,
target and device over the batches of a folder of images or a ``.pt`` tensor file.

:class:`DatasetJob` runs the steps the command line (``gradexplorer capture --batch-size N``,
``gradexplorer_app.cli.capture_over_dataset``) and the window (Run ▸ Run over folder…,
``gradexplorer_app.window.dataset_run``) share, each at most once::

    dataset = DatasetJob(job, batch_size=16, max_samples=None)
    dataset.source()      # the samples, in batches (gradexplorer.recording.dataset_capture.DatasetSource)
    dataset.estimate()    # one sample through the model: the memory, against the budget
    stats = dataset.capture()          # the batches, merged (statistics only)
    cap = dataset.to_capture(stats)    # the capture and its metadata
    # or all of it in one process: cap, stats = dataset.run()

The memory check is the one both front ends get: refused with :class:`DatasetOverBudget`
unless ``options.force``, in the words of the caller (``words``: the command line's flags by
default, the window's controls from the window). What only torchrun has (the ranks' shares
of the batches, the model sharded with FSDP2, the merge on rank 0) stays in the command line,
which passes its shard plan to :meth:`DatasetJob.estimate` and its batches to
:meth:`DatasetJob.capture`.

Progress is the job's ``progress(STAGE_BATCHES, batches_done, total_batches)`` unless the
caller passes its own; the job's cancel flag stops the run between two module calls; the
job's lock (when it has one) is held while hooks are on the model. The steps run the model:
call them from a worker thread, never a GUI thread.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import format_bytes
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.memory_estimate import MemoryEstimate, Shortfall, budget_shortfall
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.job import CaptureJob, OverBudget, probe_model
from gradexplorer.pipeline.options import CaptureOptions
from gradexplorer.recording.dataset_capture import (
    DatasetProgress,
    DatasetSource,
    DatasetStats,
    capture_dataset,
    recorded_params,
    to_capture,
)
from gradexplorer.recording.dataset_memory import estimate_dataset_memory
from gradexplorer.recording.shard_blocks import ShardPlan

__all__ = [
    "STAGE_BATCHES",
    "BudgetWords",
    "DatasetJob",
    "DatasetOverBudget",
    "command_line_words",
    "dataset_meta",
]

#: The progress stage of the batches of a dataset capture.
STAGE_BATCHES = "batches"

#: ``words(estimate, shortfall, plan) -> (problem, fix)``: how a front end says that a dataset
#: capture is over the memory budget, naming its own controls.
BudgetWords = Callable[[MemoryEstimate, Shortfall, "ShardPlan | None"], tuple[str, str]]


def command_line_words(estimate: MemoryEstimate, short: Shortfall, plan: ShardPlan | None) -> tuple[str, str]:
    """The command line's refusal of a dataset capture over the budget: its flags
    (``--batch-size``, ``--layers``, ``--memory-budget``, ``--force``, ``--shard fsdp``)."""
    where = "of memory" if short.device.type == "cpu" else f"on {short.device}"
    source_of = "set by --memory-budget" if short.set_by_user else "half of the free memory"
    fix = ("shard the model over more processes, " if plan is not None else
           "shard the model with --shard fsdp under torchrun, " if short.device.type != "cpu" else "")
    problem = (f"this capture needs about {format_bytes(short.need)} {where} per process ({estimate.describe()}) "
               f"but the budget is {format_bytes(short.budget)} ({source_of});")
    return problem, (f"{fix}use a smaller --batch-size or fewer --layers, a --memory-budget above "
                     f"{format_bytes(short.need)}, or --force to run anyway.")


class DatasetOverBudget(OverBudget):
    """A dataset capture estimated to need more memory than the budget allows.

    Attributes
    ----------
    estimate : MemoryEstimate
    shortfall : Shortfall
        Where it does not fit, what it needs there and the budget.
    plan : ShardPlan or None
        The shard plan the estimate is for (``--shard fsdp``).
    """

    def __init__(self, problem: str, fix: str, estimate: MemoryEstimate, shortfall: Shortfall,
                 plan: ShardPlan | None = None) -> None:
        super().__init__(problem, fix, estimate, f"{problem} {fix}")
        self.shortfall = shortfall
        self.plan = plan


def dataset_meta(loaded: LoadedModel, options: CaptureOptions, source: DatasetSource, layers: Sequence[str],
                 device: torch.device, world: int = 1, seconds: float | None = None) -> dict:
    """The version 2 capture metadata (``gradexplorer.files.meta``) as far as a dataset has it.

    Parameters
    ----------
    loaded : LoadedModel
    options : CaptureOptions
        The capture's options (target, architecture).
    source : DatasetSource
    layers : list of str
        The selected modules, in order.
    device : torch.device
    world : int
        Processes that took part (torchrun).
    seconds : float, optional
        How long the capture took.
    """
    return {
        "model": loaded.spec, "model_name": loaded.name, "weights": loaded.weights, "arch": options.arch,
        "categories": list(loaded.categories) if loaded.categories else None, "task": loaded.task,
        "batch": source.describe(), "batch_source": ", ".join(source.sources), "sample_names": None,
        "preprocessing": None, "labels": None, "input_grad": False, "autocast": None,
        "target": str(options.target), "device": str(device), "dtype": source.dtype, "train": False,
        "world_size": world,
        "torch_version": str(torch.__version__),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "layer_order": list(layers), "call_order": None, "timing": None,
        "seconds": round(seconds, 4) if seconds is not None else None,
    }


class DatasetJob:
    """The steps of a dataset capture over a :class:`CaptureJob` (see the module docstring).

    The job's ``options.batch`` names the folder (or ``.pt`` file); its layers, target,
    device, memory budget and force are used; the capture keeps statistics only whatever
    ``options.mode`` says.

    Parameters
    ----------
    job : CaptureJob
        Its model (loaded or to load), options, progress, cancel flag and lock.
    batch_size : int
        Samples per batch.
    max_samples : int, optional
        Use at most this many samples (all when ``None``).
    device : torch.device, optional
        Where the batches run, instead of the job's device (a rank's own GPU under torchrun).
    words : BudgetWords
        How the refusal over the budget is said (default: :func:`command_line_words`).

    Attributes
    ----------
    memory : MemoryEstimate or None
        After :meth:`estimate`.
    shortfall : Shortfall or None
        After :meth:`estimate`, when over the budget.
    """

    def __init__(self, job: CaptureJob, batch_size: int, max_samples: int | None = None, *,
                 device: torch.device | None = None, words: BudgetWords = command_line_words) -> None:
        self.job = job
        self.batch_size = batch_size
        self.max_samples = max_samples
        self.words = words
        self.memory: MemoryEstimate | None = None
        self.shortfall: Shortfall | None = None
        self._device = device
        self._source: DatasetSource | None = None

    @property
    def device(self) -> torch.device:
        """Where the batches run: the one given, else the job's (``options.device`` resolved)."""
        return self._device if self._device is not None else self.job.resolve_device()

    def selected_layers(self) -> list[str]:
        """The modules the options select, in order (every leaf when none)."""
        return self.job.selected_layers()

    def source(self) -> DatasetSource:
        """The samples, in batches (made once; image files are read batch by batch later).

        Raises
        ------
        GradExplorerError
            The options name no folder or file, a bad batch size or maximum, no samples (an
            empty folder, a missing path), a tensor file the model does not take.
        """
        if self._source is None:
            loaded = self.job.load_model()
            batch = self.job.options.batch
            if not batch.inputs:
                raise GradExplorerError("a capture over a dataset needs a folder of images or a .pt tensor file;",
                                        "choose a folder (Run ▸ Run over folder…) or give --input FOLDER.")
            self.job.check_cancel()
            self._source = DatasetSource(batch.sources(), loaded, self.batch_size, self.max_samples)
        return self._source

    def estimate(self, plan: ShardPlan | None = None) -> MemoryEstimate:
        """One sample through the whole model (before any sharding): the memory the capture
        holds and needs while it runs (``gradexplorer.recording.dataset_memory``), checked
        against the budget (``options.memory_budget``, else half the free memory).

        Parameters
        ----------
        plan : ShardPlan, optional
            The model sharded over the ranks (``--shard fsdp``): the estimate per rank.

        Returns
        -------
        MemoryEstimate
            Also kept in ``memory``.

        Raises
        ------
        DatasetOverBudget
            Over the budget and ``options.force`` is false, in :attr:`words`.
        GradExplorerError
            The probe failed (the model does not take the batches), or its forward alone is over
            the budget (``ProbeOverBudget``).
        """
        job, options = self.job, self.job.options
        loaded = job.load_model()
        selected = self.selected_layers()
        source = self.source()
        first, _labels = source.batch(0)
        prepared = probe_model(loaded, first, job.lock, memory_budget=options.memory_budget, force=options.force)
        if prepared.probe_error is not None:
            raise prepared.probe_error
        params = recorded_params(loaded.module, options.layer_spec(), selected)
        estimate = estimate_dataset_memory(prepared.tree, selected, first, loaded.module, params,
                                           batches=source.total, plan=plan, device=self.device)
        self.memory = estimate
        self.shortfall = budget_shortfall(estimate, self.device, budget=options.memory_budget)
        job.check_cancel()
        if self.shortfall is not None and not options.force:
            problem, fix = self.words(estimate, self.shortfall, plan)
            raise DatasetOverBudget(problem, fix, estimate, self.shortfall, plan)
        return estimate

    def capture(self, indices: Sequence[int] | None = None, progress: DatasetProgress | None = None
                ) -> DatasetStats:
        """Capture batches ``indices`` (all by default) with the model replicated in this
        process, merged into running totals (``gradexplorer.recording.dataset_capture.capture_dataset``).

        Parameters
        ----------
        indices : sequence of int, optional
            This process's share of the batches (``gradexplorer.recording.dataset_capture.shard``).
        progress : callable, optional
            ``progress(batches_done, total_batches, samples_done)``; by default the job's
            ``progress(STAGE_BATCHES, done, total)``.

        Raises
        ------
        GradExplorerError
            An unreadable image, inputs the model does not take, a bad target or layers;
            ``CaptureError`` when forward or backward fails; ``CaptureCancelled``.
        """
        job = self.job
        loaded = job.load_model()
        source = self.source()
        mine = list(range(source.total)) if indices is None else list(indices)
        if progress is None:
            report = job.progress

            def progress(done: int, total: int, _samples: int) -> None:
                if report is not None:
                    report(STAGE_BATCHES, done, total)

            progress(0, len(mine), 0)
        with job.lock if job.lock is not None else nullcontext():
            return capture_dataset(loaded.module, source.batches(mine), layers=job.options.layer_spec(),
                                   target=job.options.target, device=self.device, total_batches=len(mine),
                                   progress=progress, cancel=job.cancel)

    def to_capture(self, stats: DatasetStats, *, world: int = 1, seconds: float | None = None,
                   shard: dict | None = None) -> Capture:
        """The statistics-only capture of merged totals, with its metadata (:func:`dataset_meta`).

        Parameters
        ----------
        stats : DatasetStats
            The totals (merged over the ranks under torchrun).
        world : int
            Processes that took part.
        seconds : float, optional
            How long the capture took.
        shard : dict, optional
            The capture's ``meta["shard"]`` when the model was sharded.
        """
        loaded = self.job.load_model()
        selected = self.selected_layers()
        meta = dataset_meta(loaded, self.job.options, self.source(), selected, self.device, world, seconds)
        if shard is not None:
            meta["shard"] = shard
        return to_capture(stats, loaded.module, selected, meta)

    def run(self) -> tuple[Capture, DatasetStats]:
        """Every step in one process: device, model, layers, target, samples, estimate, batches.

        Returns
        -------
        (Capture, DatasetStats)
            The statistics-only capture and the merged totals.

        Raises
        ------
        GradExplorerError
            From any step (:class:`DatasetOverBudget` unless ``options.force``).
        """
        start = time.perf_counter()
        self.job.resolve_device()  # a device that is not there fails before anything is loaded
        self.job.load_model()
        self.selected_layers()
        self.job.check_target()
        self.source()
        self.estimate()
        stats = self.capture()
        return self.to_capture(stats, seconds=time.perf_counter() - start), stats
