"""Statistics that merge exactly: across batches, steps and ranks.

``gradexplorer.stats.tensor_stats.tensor_stats`` summarises one tensor for the window. Over a dataset or a
training run we need statistics of *many* tensors whose union is never held in memory,
and the merge of two summaries must equal the summary of the union. That rules out
min-max histogram ranges (each tensor would get its own bins) and E[x^2] - E[x]^2.

What a :class:`MergeStats` holds, and why each merges exactly:

* ``numel``, ``count`` (finite values), ``nan_count``, ``inf_count``, ``zero_count`` and
  the histogram are integer counts: they add.
* ``min`` and ``max`` (over finite values) take the min and max.
* ``sum``, ``sum_abs`` are float64 sums: they add.
* ``mean`` and ``m2`` (the sum of squared deviations from the mean) are merged by Chan,
  Golub and LeVeque's parallel formula in float64 (``gradexplorer.stats.moments.chan_merge``, the one
  merge of moments that every path uses)::

      n = na + nb, d = mb - ma, mean = ma + d * nb / n, m2 = m2a + m2b + d^2 * na * nb / n

  which stays accurate when |mean| >> std, unlike the sum of squares.
* The histogram has bins fixed in advance: **signed log2-magnitude bins, one per power of
  two** (see :data:`HIST_BINS`). Bin membership depends only on the value, so the histogram
  of a union is the sum of the histograms. The bins are, from left to right: negative
  overflow (x <= -2^64), 128 negative octaves [-2^(k+1), -2^k) for k = 63 .. -64, negative
  underflow (-2^-64 < x <= -2^-126), the zero bin (|x| < 2^-126: zero and float32
  subnormals), positive underflow, 128 positive octaves [2^k, 2^(k+1)) for k = -64 .. 63,
  and positive overflow (x >= 2^64). The bin of a float32 value is read from its sign and
  exponent bits, one integer shift and one ``bincount`` per tensor.

Per-tensor moments (``MergeStats.of_tensor``): the mean is taken in float32 and corrected
in float64 by the sum of deviations; the squared deviations from the float32 mean are
summed with float32 products (Sterbenz: values near the mean subtract exactly). Tensors
whose magnitudes would overflow or underflow float32 squares, and float64 tensors, take a
float64 path. The relative error of a float32 tensor's mean and std is a few float32
roundings; the merge adds none beyond float64 rounding.

:class:`GradientMoments` keeps each parameter gradient's element-wise mean and variance
across batches (Welford / Chan per element, float64) for the gradient signal-to-noise
ratio: SNR = ||E[g]||^2 / sum(Var[g]).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import torch

# The compiled paths, looked up when called (tests turn them off to check the torch path).
from gradexplorer.stats import merge_cpu
from gradexplorer.stats.moments import chan_merge
from gradexplorer.stats.record import TensorStats

#: Octaves [2^k, 2^(k+1)) for k in [MAG_LOW, MAG_HIGH) have a bin of their own.
MAG_LOW = -64
MAG_HIGH = 64
_OCTAVES = MAG_HIGH - MAG_LOW
#: Magnitude bins per sign: underflow, the octaves, overflow.
_PER_SIGN = _OCTAVES + 2
#: Number of histogram bins: both signs and the zero bin.
HIST_BINS = 2 * _PER_SIGN + 1
ZERO_BIN = _PER_SIGN
#: Below this magnitude a value falls in the zero bin (float32's smallest normal number).
ZERO_LIMIT = 2.0 ** -126

#: ``MergeStats.of_tensors`` summarises tensors of at most this many values together.
TOGETHER_VALUES = 1 << 15
#: ... and at most this many bytes of them in one compiled call (its result tables, and the
#: dense copies of strided views among them, stay bounded).
TOGETHER_BYTES = 16 << 20

#: Summary keys, as in ``gradexplorer.stats.tensor_stats.tensor_stats`` where they share a name.
SUMMARY_KEYS = ("numel", "count", "min", "max", "mean", "std", "mean_abs", "l2", "sum",
                "zero_fraction", "nan_count", "inf_count")


class MergeSummary(TypedDict):
    """``MergeStats.summary``: its scalar statistics (``SUMMARY_KEYS``), under the names
    ``TensorStats`` uses where they share one; ``count`` is the finite values, ``sum``
    their sum."""

    numel: int
    count: int
    min: float
    max: float
    mean: float
    std: float
    mean_abs: float
    l2: float
    sum: float
    zero_fraction: float
    nan_count: int
    inf_count: int


class MergeStatsFields(TypedDict):
    """``MergeStats.to_dict``: every field of a ``MergeStats``, in plain types (files,
    ``all_gather_object``); ``hist`` the int64 counts of the log2 bins, an array (a tensor
    in a dataset capture's record, ``DatasetTensorStats.merged``)."""

    numel: int
    count: int
    nan_count: int
    inf_count: int
    zero_count: int
    min: float
    max: float
    sum: float
    sum_abs: float
    mean: float
    m2: float
    hist: np.ndarray | torch.Tensor


class DatasetTensorStats(TensorStats, total=False):
    """The statistics record of a dataset capture (``gradexplorer.recording.dataset_capture``):
    ``TensorStats``'s keys (``overflow`` aside) from the ``MergeStats`` of every batch.

    Keys
    ----
    hist_kind : str
        ``"log2"``: ``hist`` counts the signed log2 bins of this module (their edges in the
        capture's ``meta["dataset"]["hist_edges"]``), not equal-width bins over
        ``hist_range``.
    merged : MergeStatsFields
        The exact merge itself (its histogram an int64 tensor).
    """

    hist_kind: str
    merged: MergeStatsFields


class GradientSummary(TypedDict):
    """``GradientMoments.summary``: the gradient's signal-to-noise ratio and its parts."""

    batches: int
    mean_norm: float
    var_sum: float
    snr: float


class GradientMomentsFields(TypedDict):
    """``GradientMoments.to_dict``: the batches and the element-wise moments (CPU)."""

    batches: int
    mean: torch.Tensor | None
    m2: torch.Tensor | None


def _fold_map() -> torch.Tensor:
    """Index of the merged bin for each of the 512 (sign, biased float32 exponent) pairs;
    -1 drops the pair (exponent 255: Inf and NaN, counted apart)."""
    out = torch.full((512,), -1, dtype=torch.long)
    for key in range(512):
        # key = (bits >> 23) + 256. For x >= 0 (sign bit 0) that is 256 + e; for x < 0 the
        # arithmetic shift sign-extends to e - 256, so the key is e (e: biased exponent).
        negative = key < 256
        e = key if negative else key - 256
        if e == 255:
            continue
        out[key] = _bin_of_exponent(e - 127, negative)
    return out


def _bin_of_exponent(k: int, negative: bool) -> int:
    """The bin of a finite value with |x| in [2^k, 2^(k+1)) (k = -127 for |x| < 2^-126)."""
    if k < -126:
        return ZERO_BIN
    j = 0 if k < MAG_LOW else (_PER_SIGN - 1 if k >= MAG_HIGH else k - MAG_LOW + 1)
    return ZERO_BIN - 1 - j if negative else ZERO_BIN + 1 + j


_FOLD = _fold_map()
_LITTLE_ENDIAN = sys.byteorder == "little"


def hist_edges() -> np.ndarray:
    """Edges of the :data:`HIST_BINS` bins (``HIST_BINS + 1`` values, ±inf at the ends).

    The zero bin spans [-2^-126, 2^-126]; the underflow bins reach from there to ±2^-64.
    """
    pos = [ZERO_LIMIT] + [2.0 ** k for k in range(MAG_LOW, MAG_HIGH + 1)] + [math.inf]
    neg = [-v for v in reversed(pos)]
    return np.array(neg + pos, dtype=np.float64)


def hist_bin_centers() -> np.ndarray:
    """A representative value of each bin, for plotting (geometric centre of an octave)."""
    edges = hist_edges()
    lo, hi = edges[:-1], edges[1:]
    with np.errstate(invalid="ignore", over="ignore"):
        centers = np.sign(lo + hi) * np.sqrt(np.abs(lo * hi))
    centers[0], centers[-1] = -(2.0 ** MAG_HIGH) * 1.5, (2.0 ** MAG_HIGH) * 1.5
    centers[ZERO_BIN] = 0.0
    return centers


@torch.no_grad()
def log2_histogram(x: torch.Tensor) -> torch.Tensor:
    """Counts of ``x``'s finite values in the fixed signed log2 bins (int64, CPU).

    Parameters
    ----------
    x : torch.Tensor
        Real floating-point tensor on any device; NaN and Inf are not counted.
    """
    # Contiguous: the int16 view below needs unit stride (a strided view such as t[::2]
    # stays strided through reshape).
    x = x.detach().reshape(-1).contiguous()
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # exact: every half value is a float32 value
    if x.dtype == torch.float32:
        # numba, when there: faster on the CPU (docs/benchmarks.md)
        fast = merge_cpu.fold_counts(x, _FOLD, HIST_BINS) if x.device.type == "cpu" else None
        if fast is not None:
            return fast
        # Sign and exponent live in the high 16 bits: shifting an int16 view of them reads
        # and writes half as much memory as shifting the whole int32.
        hi = x.view(torch.int16)[1::2] if _LITTLE_ENDIAN else x.view(torch.int16)[0::2]
        keys = (hi >> 7) + 256
        raw = torch.bincount(keys, minlength=512).cpu()
        hist = torch.zeros(HIST_BINS, dtype=torch.long)
        keep = _FOLD >= 0
        hist.index_add_(0, _FOLD[keep], raw[keep])
        return hist
    # float64: frexp gives |x| = m * 2^e with m in [0.5, 1), so |x| in [2^(e-1), 2^e).
    x = x[torch.isfinite(x)]
    mant, exp = torch.frexp(x)
    k = exp.long() - 1
    j = torch.where(k < MAG_LOW, 0, torch.where(k >= MAG_HIGH, _PER_SIGN - 1, k - MAG_LOW + 1))
    idx = torch.where(mant < 0, ZERO_BIN - 1 - j, ZERO_BIN + 1 + j)
    idx = torch.where(x.abs() < ZERO_LIMIT, ZERO_BIN, idx)
    return torch.bincount(idx, minlength=HIST_BINS).cpu()


def _real(t: torch.Tensor) -> torch.Tensor:
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    if not x.is_floating_point():
        x = x.double()
    elif x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x.reshape(-1)


@dataclass
class MergeStats:
    """Mergeable statistics of a set of values (see the module docstring).

    Build one with :meth:`of_tensor`, combine with :meth:`merge` or ``a + b``, read with
    :meth:`summary`. Empty statistics (``MergeStats()``) are the merge identity.
    """

    numel: int = 0
    count: int = 0
    nan_count: int = 0
    inf_count: int = 0
    zero_count: int = 0
    min: float = math.inf
    max: float = -math.inf
    sum: float = 0.0
    sum_abs: float = 0.0
    mean: float = 0.0
    m2: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(HIST_BINS, dtype=np.int64))

    # -- building -----------------------------------------------------------------
    @classmethod
    @torch.no_grad()
    def of_tensor(cls, t: torch.Tensor) -> MergeStats:
        """Statistics of every element of ``t`` (complex by magnitude, integers as float64).

        The work stays on ``t``'s device; one small transfer brings the results back.
        """
        x = _real(t)
        n = x.numel()
        if n == 0:
            return cls()
        fast = cls._of_float32_cpu(x)
        if fast is not None:
            return fast
        lo, hi = torch.aminmax(x)
        lo_f, hi_f = torch.stack([lo, hi]).tolist()
        hist_t = log2_histogram(x)
        nan_count = inf_count = 0
        if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
            nan_mask = torch.isnan(x)
            inf_mask = torch.isinf(x)
            nan_count, inf_count = int(nan_mask.sum()), int(inf_mask.sum())
            x = x[~(nan_mask | inf_mask)]
            if x.numel() == 0:
                return cls(numel=n, nan_count=nan_count, inf_count=inf_count)
            lo_f, hi_f = torch.stack(list(torch.aminmax(x))).tolist()
        m = x.numel()
        big = max(abs(lo_f), abs(hi_f))
        if x.dtype == torch.float32 and 1e-15 < big < 1e15:
            # Float32 path: magnitudes whose squares and sums stay normal float32 numbers.
            mean32 = x.sum() / m
            d = x - mean32
            s1, s2, s_abs, total = torch.stack(
                [d.sum(), torch.dot(d, d) if d.device.type == "cpu" else d.square().sum(),
                 x.abs().sum(), mean32]
            ).double().tolist()
            mean = total + s1 / m  # total holds the float32 mean here
            m2 = max(s2 - s1 * s1 / m, 0.0)
            total = mean * m
        else:
            x64 = x.double()
            var, mean_t = torch.var_mean(x64, correction=0)
            s_abs_t = x64.abs().sum()
            mean, var_f, s_abs = torch.stack([mean_t, var, s_abs_t]).tolist()
            m2 = var_f * m
            total = mean * m
        zeros = int(hist_t[ZERO_BIN])
        return cls(numel=n, count=m, nan_count=nan_count, inf_count=inf_count, zero_count=zeros,
                   min=lo_f, max=hi_f, sum=total, sum_abs=s_abs, mean=mean, m2=m2,
                   hist=hist_t.numpy().astype(np.int64))

    @classmethod
    def _of_float32_cpu(cls, x: torch.Tensor) -> MergeStats | None:
        """The compiled path (``gradexplorer.stats.merge_cpu``) for float32 CPU tensors, or None."""
        got = merge_cpu.moments_and_counts(x, _FOLD, HIST_BINS)
        if got is None:
            return None
        return cls._of_row(x.numel(), *got)

    @classmethod
    def _of_row(cls, n: int, row: list[float], counts: np.ndarray) -> MergeStats:
        """The statistics of ``n`` values from ``merge_cpu``'s row and bin counts."""
        count, mean, m2, s_abs, lo, hi, _nz, nans, infs = row
        m = int(count)
        if m == 0:
            return cls(numel=n, nan_count=int(nans), inf_count=int(infs))
        return cls(numel=n, count=m, nan_count=int(nans), inf_count=int(infs), zero_count=int(counts[ZERO_BIN]),
                   min=lo, max=hi, sum=mean * m, sum_abs=s_abs, mean=mean, m2=max(m2, 0.0), hist=counts)

    @classmethod
    @torch.no_grad()
    def of_tensors(cls, tensors: list[torch.Tensor]) -> list[MergeStats]:
        """``of_tensor`` of each of ``tensors``, equal to it number for number: the small
        float32 CPU tensors (``TOGETHER_VALUES``) together in one compiled call (the same
        pass over the same values), the others one by one. Made for the many small tensors of a watched step, whose
        cost alone is the call, not the values.
        """
        out: list[MergeStats | None] = [None] * len(tensors)
        # The small ones: read where they lie by one compiled call for TOGETHER_BYTES of them at
        # most (merge_cpu.moments_and_counts_many); a large tensor takes its own pass.
        together = [i for i, t in enumerate(tensors)
                    if t.dtype == torch.float32 and t.is_cpu and 0 < t.numel() <= TOGETHER_VALUES]
        limit = TOGETHER_BYTES // 4
        start = 0
        while start < len(together):
            end, values = start, 0
            while end < len(together) and (end == start or values + tensors[together[end]].numel() <= limit):
                values += tensors[together[end]].numel()
                end += 1
            chunk = together[start:end]
            start = end
            got = merge_cpu.moments_and_counts_many([tensors[i] for i in chunk], _FOLD, HIST_BINS)
            if got is None:
                break
            rows, counts = got
            for j, i in enumerate(chunk):
                out[i] = cls._of_row(tensors[i].numel(), rows[j], counts[j])
        return [s if s is not None else cls.of_tensor(t) for s, t in zip(out, tensors)]

    @classmethod
    def of_values(cls, values: Iterable[float]) -> MergeStats:
        """Statistics of a few Python or NumPy numbers (per-sample norms, losses)."""
        return cls.of_tensor(torch.as_tensor(np.asarray(list(values), dtype=np.float64)))

    # -- merging --------------------------------------------------------------------
    def merge(self, other: MergeStats) -> MergeStats:
        """The statistics of the union of both sets of values (neither is modified)."""
        na, nb = self.count, other.count
        n, mean, m2 = chan_merge(na, self.mean, self.m2, nb, other.mean, other.m2)
        if na == 0 or nb == 0:
            src = other if na == 0 else self
            s, s_abs = src.sum, src.sum_abs
            lo, hi = src.min, src.max
        else:
            s, s_abs = self.sum + other.sum, self.sum_abs + other.sum_abs
            lo, hi = min(self.min, other.min), max(self.max, other.max)
        return MergeStats(
            numel=self.numel + other.numel, count=n, nan_count=self.nan_count + other.nan_count,
            inf_count=self.inf_count + other.inf_count, zero_count=self.zero_count + other.zero_count,
            min=lo, max=hi, sum=s, sum_abs=s_abs, mean=mean, m2=m2, hist=self.hist + other.hist,
        )

    __add__ = merge

    @staticmethod
    def merge_all(parts: Iterable[MergeStats]) -> MergeStats:
        """Merge any number of statistics (empty input: empty statistics)."""
        out = MergeStats()
        for p in parts:
            out = out.merge(p)
        return out

    # -- reading ----------------------------------------------------------------------
    @property
    def var(self) -> float:
        """Sample variance (n - 1 in the denominator, as ``torch.std``)."""
        return self.m2 / (self.count - 1) if self.count > 1 else (0.0 if self.count else math.nan)

    @property
    def std(self) -> float:
        return math.sqrt(self.var) if self.count else math.nan

    def summary(self) -> MergeSummary:
        """Scalar statistics under the names ``gradexplorer.stats.tensor_stats`` uses (``count`` = finite values;
        ``zero_fraction`` counts the zero bin, |x| < 2^-126, among all elements)."""
        m = self.count
        nan = math.nan
        return {
            "numel": self.numel,
            "count": m,
            "min": self.min if m else nan,
            "max": self.max if m else nan,
            "mean": self.mean if m else nan,
            "std": self.std,
            "mean_abs": self.sum_abs / m if m else nan,
            # No finite value at all (every element NaN/Inf): no norm, rather than a norm of 0.
            "l2": math.sqrt(max(self.m2 + m * self.mean * self.mean, 0.0)) if m else (nan if self.numel else 0.0),
            "sum": self.sum,
            "zero_fraction": self.zero_count / self.numel if self.numel else 0.0,
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
        }

    def to_dict(self) -> MergeStatsFields:
        """Plain types (and one int64 array) for files and ``all_gather_object``."""
        return {
            "numel": self.numel, "count": self.count, "nan_count": self.nan_count,
            "inf_count": self.inf_count, "zero_count": self.zero_count, "min": self.min,
            "max": self.max, "sum": self.sum, "sum_abs": self.sum_abs, "mean": self.mean,
            "m2": self.m2, "hist": np.asarray(self.hist, dtype=np.int64).copy(),
        }

    @classmethod
    def from_dict(cls, d: MergeStatsFields | dict[str, Any]) -> MergeStats:
        """Inverse of :meth:`to_dict` (also of what a file or a collective gave back of it)."""
        values = dict(d)
        values["hist"] = np.asarray(values["hist"], dtype=np.int64)
        return cls(**values)


class GradientMoments:
    """Element-wise mean and variance of one parameter's gradient across batches.

    Each :meth:`add` is one batch's gradient. Kept in float64 on the gradient's device
    (twice the parameter's size in memory, whatever the number of batches).
    """

    def __init__(self) -> None:
        self.batches = 0
        self.mean: torch.Tensor | None = None
        self.m2: torch.Tensor | None = None

    @torch.no_grad()
    def add(self, grad: torch.Tensor) -> None:
        """Account for one batch's gradient (Welford's update, element-wise)."""
        g = grad.detach().double()
        self.batches += 1
        if self.mean is None:
            self.mean = g.clone()
            self.m2 = torch.zeros_like(g)
            return
        assert self.m2 is not None
        delta = g - self.mean
        self.mean += delta / self.batches
        self.m2 += delta * (g - self.mean)

    def merge(self, other: GradientMoments) -> GradientMoments:
        """Moments over both sets of batches (Chan's formula, element-wise)."""
        out = GradientMoments()
        if other.batches == 0 or self.batches == 0:
            src = self if other.batches == 0 else other
            out.batches = src.batches
            out.mean = None if src.mean is None else src.mean.clone()
            out.m2 = None if src.m2 is None else src.m2.clone()
            return out
        assert self.mean is not None and other.mean is not None
        assert self.m2 is not None and other.m2 is not None
        out.batches, out.mean, out.m2 = chan_merge(
            self.batches, self.mean, self.m2,
            other.batches, other.mean.to(self.mean.device), other.m2.to(self.m2.device))
        return out

    def summary(self) -> GradientSummary:
        """``batches``, ``mean_norm`` (||E[g]||), ``var_sum`` (sum of element variances,
        n - 1 denominator) and ``snr`` = ||E[g]||^2 / sum Var[g] (inf when the gradient
        never varies but is not zero, nan with fewer than two batches)."""
        if self.mean is None or self.m2 is None or self.batches < 2:
            norm = float(self.mean.norm()) if self.mean is not None else math.nan
            return {"batches": self.batches, "mean_norm": norm, "var_sum": math.nan, "snr": math.nan}
        return self.sums().summary()

    def sums(self) -> MomentSums:
        """The element sums the summary is made of; those of disjoint parts of one
        gradient (its shards) add up to the whole's (:class:`MomentSums`)."""
        if self.mean is None or self.m2 is None:
            return MomentSums(self.batches, 0.0, 0.0)
        return MomentSums(self.batches, float(self.mean.square().sum()), float(self.m2.sum()))

    def to_dict(self) -> GradientMomentsFields:
        """Plain types and CPU tensors, for files and collectives."""
        return {"batches": self.batches,
                "mean": None if self.mean is None else self.mean.cpu(),
                "m2": None if self.m2 is None else self.m2.cpu()}

    @classmethod
    def from_dict(cls, d: GradientMomentsFields | dict[str, Any]) -> GradientMoments:
        """Inverse of :meth:`to_dict`."""
        out = cls()
        out.batches, out.mean, out.m2 = int(d["batches"]), d["mean"], d["m2"]
        return out


@dataclass(frozen=True)
class MomentSums:
    """A gradient's moments across batches summed over its elements: what
    :meth:`GradientMoments.summary` needs, and all a rank holding one part of the
    elements (a shard of a parameter) has to send.

    Attributes
    ----------
    batches : int
        Batches accounted for (the same for every part of one gradient).
    mean_sq : float
        Sum over the elements of the squared mean, ||E[g]||^2.
    m2_sum : float
        Sum over the elements of the squared deviations from their mean.
    """

    batches: int
    mean_sq: float
    m2_sum: float

    def add_part(self, other: MomentSums) -> MomentSums:
        """The sums over the elements of both parts (disjoint parts of one gradient, over
        the same batches).

        Raises
        ------
        ValueError
            The parts were accounted over different numbers of batches.
        """
        if other.batches != self.batches:
            raise ValueError(f"parts of one gradient over {self.batches} and {other.batches} batches")
        return MomentSums(self.batches, self.mean_sq + other.mean_sq, self.m2_sum + other.m2_sum)

    def summary(self) -> GradientSummary:
        """As :meth:`GradientMoments.summary`."""
        if self.batches < 2:
            return {"batches": self.batches, "mean_norm": math.sqrt(self.mean_sq), "var_sum": math.nan,
                    "snr": math.nan}
        var_sum = self.m2_sum / (self.batches - 1)
        if var_sum > 0:
            snr = self.mean_sq / var_sum
        else:
            snr = math.inf if self.mean_sq > 0 else math.nan
        return {"batches": self.batches, "mean_norm": math.sqrt(self.mean_sq), "var_sum": var_sum, "snr": snr}


@torch.no_grad()
def per_sample_norms_many(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """``per_sample_norms`` of each of ``grads``, equal to it value for value: the float32
    CPU ones whose samples have the same number of values in one compiled call over their
    rows stacked (each row summed as alone), the others one by one. Made for the small
    gradients of a watched step, whose cost alone is the call."""
    out: list[torch.Tensor | None] = [None] * len(grads)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(grads):
        if g.dtype == torch.float32 and g.is_cpu and g.dim() >= 1 and g.numel() > 0:
            groups.setdefault(g.numel() // g.shape[0], []).append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        rows = [grads[i].detach().reshape(grads[i].shape[0], -1) for i in members]
        norms = merge_cpu.row_norms(torch.cat(rows))
        if norms is None:
            break
        for i, part in zip(members, norms.split([r.shape[0] for r in rows])):
            out[i] = part
    return [n if n is not None else per_sample_norms(g) for n, g in zip(out, grads)]


@torch.no_grad()
def per_sample_norms(grad: torch.Tensor) -> torch.Tensor:
    """L2 norm of each sample's slice of a batch-first tensor (one value per row of dim 0).

    Computed in float32 at least, so that half-precision squares do not overflow (on the
    CPU, accumulated in float64 and rounded to float32 once).
    """
    g = grad.detach()
    if g.dim() == 0:
        return g.reshape(1).float().abs()
    if g.dtype in (torch.float16, torch.bfloat16) or not g.is_floating_point():
        g = g.float()
    fast = merge_cpu.row_norms(g) if g.device.type == "cpu" else None  # numba: torch's row norms are slow on the CPU
    return fast if fast is not None else torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1)
