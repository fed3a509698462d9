"""Compare two captures layer by layer and call by call: where do two runs diverge?

Two captures of the same model (two checkpoints, two precisions, two devices, train
against eval mode, two inputs...) are matched by qualified layer name and call index,
optionally through a name mapping for renamed modules. For every match and every
tensor kind (the activation, the gradient at the layer's output, the gradient at its
input) the comparison reports:

* with both tensors at hand (full captures): the relative L2 difference
  ``||b - a|| / ||a||``, the cosine similarity, the largest absolute difference, the
  ratio of norms ``||b|| / ||a||``, and how many elements lie outside the tolerance;
* always (statistics-only captures too): the difference ``b - a`` of every scalar
  statistic, the ratio of L2 norms, the relative norm difference
  ``| ||b|| - ||a|| | / ||a||`` (a lower bound of the relative L2 difference, by the
  triangle inequality) and the total-variation distance between the two histograms.

A is the reference: relative figures divide by A's values, and the tolerance is
NumPy's ``isclose`` with A as the desired value, element by element:
``|b - a| <= atol + rtol * |a|``. NaN facing NaN and an infinity facing the same
infinity count as equal; any other non-finite mismatch is outside the tolerance.
Statistics-only pairs apply the same rule to their scalar statistics (min, max, mean,
std, mean |x|, L2, zero fraction) and require equal element and NaN/Inf counts.

"Forward order" is the captured layers in the order of their first call, each layer's
calls in order (or ``meta["call_order"]``, a list of ``[name, call]``, when the capture
records it); "backward order" is its reverse, the order in which gradients arrive.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from gradexplorer.analysis.gradient_flow import flow_series
from gradexplorer.analysis.heatmaps import heatmap
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import atomic_write_text
from gradexplorer.capturing.data import CallRecord, Capture, layer_label, param_name
from gradexplorer.stats.merge import DatasetTensorStats
from gradexplorer.stats.record import ScalarKey, TensorStats

#: Per-call tensors compared, in the order the tables list them.
KINDS = ("activation", "grad_output", "grad_input")
#: Human names of the kinds.
KIND_LABELS = {"activation": "activation", "grad_output": "gradient", "grad_input": "input gradient"}
#: Scalar statistics whose difference is reported (``gradexplorer.stats.tensor_stats``).
STAT_KEYS: tuple[ScalarKey, ...] = ("min", "max", "mean", "std", "mean_abs", "l2", "zero_fraction", "nan_count",
                                    "inf_count")
#: Statistics held to the tolerance in a statistics-only comparison.
TOLERANCE_KEYS: tuple[ScalarKey, ...] = ("min", "max", "mean", "std", "mean_abs", "l2", "zero_fraction")
#: Counts that must be equal.
COUNT_KEYS: tuple[ScalarKey, ...] = ("numel", "nan_count", "inf_count")

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
#: The default tolerance when either capture holds half-precision tensors (autocast): the
#: rounding of one bf16 or fp16 operation alone is far above 1e-5 (``torch.testing``'s
#: defaults for these types).
HALF_TOLERANCES = {"bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}


class CompareError(GradExplorerError):
    """Two captures cannot be compared (no layer in common, bad mapping or tolerance)."""


@dataclass(frozen=True)
class Tolerance:
    """``|b - a| <= atol + rtol * |a|``, element by element (NumPy's ``isclose``)."""

    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise CompareError(f"The tolerance {name}={v!r} is not a finite number >= 0.",
                                   f"Give {name} as a number such as 1e-5 or 0.")

    def allows(self, a: float, b: float) -> bool:
        """Whether scalar ``b`` is within tolerance of reference ``a`` (NaN == NaN)."""
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(b - a) <= self.atol + self.rtol * abs(a)


@dataclass
class TensorDiff:
    """Element-wise comparison of two tensors of one shape (float64 arithmetic).

    Attributes
    ----------
    rel_l2 : float
        ``||b - a|| / ||a||`` over the positions where both are finite; 0 when both are
        zero, inf when only A is zero or the non-finite values disagree.
    cosine : float
        Cosine similarity; 1 when both are zero, 0 when only one is, NaN when the
        non-finite values disagree.
    max_abs : float
        Largest ``|b - a|`` (inf when the non-finite values disagree).
    norm_ratio : float
        ``||b|| / ||a||`` (1 when both are zero, inf when only A is).
    norm_a, norm_b : float
        The two L2 norms (finite positions).
    outside : int
        Elements outside the tolerance, non-finite mismatches included.
    numel : int
    """

    rel_l2: float
    cosine: float
    max_abs: float
    norm_ratio: float
    norm_a: float
    norm_b: float
    outside: int
    numel: int

    @property
    def within(self) -> bool:
        return self.outside == 0


@dataclass
class StatsDiff:
    """Comparison of two statistics records (``gradexplorer.stats.tensor_stats.tensor_stats``).

    Attributes
    ----------
    differences : dict
        ``b - a`` for every key of ``STAT_KEYS``.
    norm_ratio : float
        ``l2_b / l2_a`` (1 when both are zero, inf when only A is).
    rel_norm_diff : float
        ``|l2_b - l2_a| / l2_a``: a lower bound of ``TensorDiff.rel_l2``.
    hist_distance : float
        Total-variation distance between the two histograms seen as piecewise-uniform
        densities: 0 for the same distribution, 1 for disjoint ones.
    within : bool
        Every statistic of ``TOLERANCE_KEYS`` within tolerance and the counts equal.
    """

    differences: dict[str, float]
    norm_ratio: float
    rel_norm_diff: float
    hist_distance: float
    within: bool


@dataclass
class KindDiff:
    """One tensor kind of one matched call: by tensors when both have them, else by statistics."""

    kind: str
    stats: StatsDiff | None
    tensor: TensorDiff | None = None
    #: Why it could not be compared ("no gradient in B"), "" when it was.
    note: str = ""

    @property
    def by(self) -> str:
        """``"tensor"``, ``"stats"`` or ``"none"``."""
        return "tensor" if self.tensor is not None else ("stats" if self.stats is not None else "none")

    @property
    def within(self) -> bool:
        if self.note:
            return False
        if self.tensor is not None:
            return self.tensor.within
        return self.stats is not None and self.stats.within

    @property
    def divergence(self) -> float:
        """The relative L2 difference, or its statistics lower bound; inf when not comparable."""
        if self.note:
            return math.inf
        if self.tensor is not None:
            return self.tensor.rel_l2
        return self.stats.rel_norm_diff if self.stats is not None else math.nan


@dataclass
class CallDiff:
    """One matched (layer, call) pair."""

    layer: str
    layer_b: str
    call: int
    type: str
    shape_a: tuple
    shape_b: tuple
    kinds: dict[str, KindDiff] = field(default_factory=dict)
    #: Set when the pair cannot be compared at all (different shapes).
    note: str = ""

    @property
    def label(self) -> str:
        a, b = layer_label(self.layer), layer_label(self.layer_b)
        return a if self.layer == self.layer_b else f"{a} -> {b}"

    @property
    def within(self) -> bool:
        return not self.note and all(k.within for k in self.kinds.values())

    def diverges(self, kind: str) -> bool:
        """Whether this kind is outside the tolerance (False when neither capture has it)."""
        if self.note:
            return True
        k = self.kinds.get(kind)
        return k is not None and not k.within

    @property
    def divergence(self) -> float:
        """The largest divergence over the kinds (what tables sort by)."""
        if self.note:
            return math.inf
        values = [k.divergence for k in self.kinds.values() if not math.isnan(k.divergence)]
        return max(values) if values else 0.0


@dataclass
class ParamDiff:
    """The gradient of one parameter of a matched layer."""

    layer: str
    param: str
    diff: KindDiff

    @property
    def within(self) -> bool:
        return self.diff.within

    @property
    def full_name(self) -> str:
        """The parameter's name as ``model.named_parameters()`` gives it."""
        return param_name(self.layer, self.param)


@dataclass
class Comparison:
    """The result of ``compare``: every matched call, parameter, and what did not match.

    Attributes
    ----------
    label_a, label_b : str
        How the two captures are named in reports (file names, "float32", "bf16"...).
    meta_a, meta_b : dict
        The captures' metadata.
    tolerance : Tolerance
    calls : list of CallDiff
        Matched calls in forward order.
    params : list of ParamDiff
        Matched parameter gradients, in layer order.
    only_a, only_b : list of str
        Layers (``name``) or calls (``name#i``) or parameters (``name:param``) present in one
        capture only, named as people read them (``gradexplorer.capturing.data.layer_label``:
        the root module is ``(model)``).
    not_called_a, not_called_b : list of str
        The matched layers that never ran during that capture's forward (their calls, if the
        other capture has any, are in the other's ``only`` list): a module whose weights its
        parent uses directly, not one without gradient.
    input, output : TensorDiff or None
        The two batches and the two model outputs, when both have them with one shape.
    """

    label_a: str
    label_b: str
    meta_a: dict
    meta_b: dict
    tolerance: Tolerance
    calls: list[CallDiff]
    params: list[ParamDiff]
    only_a: list[str]
    only_b: list[str]
    input: TensorDiff | None = None
    not_called_a: list[str] = field(default_factory=list)
    not_called_b: list[str] = field(default_factory=list)
    output: TensorDiff | None = None
    input_note: str = ""
    output_note: str = ""

    @property
    def within(self) -> bool:
        """Every matched tensor within tolerance, the outputs too, and nothing unmatched."""
        return (all(c.within for c in self.calls) and all(p.within for p in self.params)
                and not self.only_a and not self.only_b and not self.output_note
                and (self.output is None or self.output.within))

    @property
    def by_statistics(self) -> bool:
        """Whether any matched tensor was compared by its statistics only."""
        return any(k.by == "stats" for c in self.calls for k in c.kinds.values())

    def first_divergent(self, kind: str = "activation") -> CallDiff | None:
        """The first call whose ``kind`` diverges: in forward order for the activation,
        in backward order (reverse) for gradients."""
        order = self.calls if kind == "activation" else list(reversed(self.calls))
        return next((c for c in order if c.diverges(kind)), None)

    @property
    def first_divergent_activation(self) -> CallDiff | None:
        return self.first_divergent("activation")

    @property
    def first_divergent_gradient(self) -> CallDiff | None:
        return self.first_divergent("grad_output")

    def by_divergence(self) -> list[CallDiff]:
        """The calls sorted by divergence, largest first, with the first divergent
        activation on top (then the first divergent gradient)."""
        firsts = [c for c in (self.first_divergent_activation, self.first_divergent_gradient) if c is not None]
        rest = sorted((c for c in self.calls if all(c is not f for f in firsts)),
                      key=lambda c: (-_sortable(c.divergence), self.calls.index(c)))
        out: list[CallDiff] = []
        for c in firsts + rest:
            if all(c is not o for o in out):
                out.append(c)
        return out

    def rows(self) -> list[dict]:
        """One flat dict per (call, kind), per parameter and per unmatched entry (for CSV)."""
        rows = []
        for c in self.calls:
            for kd in c.kinds.values() if not c.note else [KindDiff("-", None, note=c.note)]:
                rows.append(_row(c.label, c.call, c.type, kd, c.shape_a, c.shape_b))
        for p in self.params:
            rows.append(_row(layer_label(p.layer), "", "param", p.diff, (), ()))
        for side, names in (("A", self.only_a), ("B", self.only_b)):
            for n in names:
                rows.append({**_row(n, "", "", KindDiff("-", None), (), ()), "note": f"only in {side}",
                             "within": False})
        return rows


def _sortable(x: float) -> float:
    return -1.0 if math.isnan(x) else x


CSV_COLUMNS = ("layer", "call", "type", "kind", "by", "shape_a", "shape_b", "within", "rel_l2", "cosine",
               "max_abs", "norm_ratio", "outside", "numel", "rel_norm_diff", "hist_distance",
               *(f"d_{k}" for k in STAT_KEYS), "note")


def _row(layer: str, call: int | str, type_: str, kd: KindDiff, shape_a: tuple, shape_b: tuple) -> dict:
    t, s = kd.tensor, kd.stats
    row: dict = {
        "layer": layer, "call": call, "type": type_, "kind": kd.kind, "by": kd.by,
        "shape_a": "x".join(map(str, shape_a)), "shape_b": "x".join(map(str, shape_b)),
        "within": kd.within, "note": kd.note,
    }
    for k in ("rel_l2", "cosine", "max_abs", "norm_ratio", "outside", "numel"):
        row[k] = getattr(t, k) if t is not None else ""
    if t is None and s is not None:
        row["norm_ratio"] = s.norm_ratio
    row["rel_norm_diff"] = s.rel_norm_diff if s is not None else ""
    row["hist_distance"] = s.hist_distance if s is not None else ""
    for k in STAT_KEYS:
        row[f"d_{k}"] = s.differences.get(k, "") if s is not None else ""
    return row


# ---------------------------------------------------------------------------
# Tensors and statistics
# ---------------------------------------------------------------------------


def _ratio(b: float, a: float) -> float:
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


@torch.no_grad()
def tensor_diff(a: torch.Tensor, b: torch.Tensor, tolerance: Tolerance = Tolerance()) -> TensorDiff:
    """Compare two tensors of the same shape element by element, in float64.

    Parameters
    ----------
    a, b : torch.Tensor
        The reference and the other; any dtype (complex tensors by magnitude), any device.
    tolerance : Tolerance

    Returns
    -------
    TensorDiff

    Raises
    ------
    CompareError
        When the shapes differ.
    """
    if tuple(a.shape) != tuple(b.shape):
        raise CompareError(f"Cannot compare a tensor of shape {tuple(a.shape)} with one of {tuple(b.shape)}.",
                           "Compare tensors of the same layer and call.")
    x = _float64(a)
    y = _float64(b)
    n = x.numel()
    finite = torch.isfinite(x) & torch.isfinite(y)
    if bool(finite.all()):
        bad_nonfinite = 0
    else:
        same = (x == y) | (torch.isnan(x) & torch.isnan(y))
        bad_nonfinite = int((~finite & ~same).sum())
        x, y = x[finite], y[finite]
    d = y - x
    diff_l2 = float(torch.linalg.vector_norm(d)) if d.numel() else 0.0
    aa = float(torch.dot(x, x)) if x.numel() else 0.0
    bb = float(torch.dot(y, y)) if y.numel() else 0.0
    ab = float(torch.dot(x, y)) if x.numel() else 0.0
    norm_a, norm_b = math.sqrt(aa), math.sqrt(bb)
    max_abs = float(d.abs().max()) if d.numel() else 0.0
    outside = int((d.abs() > tolerance.atol + tolerance.rtol * x.abs()).sum()) + bad_nonfinite
    if aa == 0 or bb == 0:
        cosine = 1.0 if aa == bb else 0.0
    else:
        # sqrt(aa * bb) rather than norm_a * norm_b: for a == b it is exactly aa (IEEE
        # sqrt of a square), so a tensor compared with itself has a cosine of exactly 1.
        cosine = max(-1.0, min(1.0, ab / math.sqrt(aa * bb))) if math.isfinite(aa * bb) \
            else max(-1.0, min(1.0, ab / norm_a / norm_b))
    rel = diff_l2 / norm_a if norm_a > 0 else (0.0 if diff_l2 == 0 else math.inf)
    if bad_nonfinite:
        rel, max_abs, cosine = math.inf, math.inf, math.nan
    return TensorDiff(rel, cosine, max_abs, _ratio(norm_b, norm_a), norm_a, norm_b, outside, n)


def _float64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = t.abs()
    return t.to("cpu", torch.float64).reshape(-1)


def _hist_counts(stats: DatasetTensorStats) -> np.ndarray:
    # The exact int64 counts of a dataset capture's merge when there are, else ``hist``.
    merged = stats.get("merged")
    raw = merged.get("hist", stats["hist"]) if merged else stats["hist"]
    return np.asarray(raw.detach().cpu().numpy() if isinstance(raw, torch.Tensor) else raw, dtype=np.float64)


def _hist_cdf(stats: TensorStats) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(stats["hist"].detach().cpu().numpy() if isinstance(stats["hist"], torch.Tensor)
                        else stats["hist"], dtype=np.float64)
    lo, hi = (float(v) for v in stats["hist_range"])
    edges = np.linspace(lo, hi, counts.size + 1)
    total = counts.sum()
    cdf = np.concatenate([[0.0], np.cumsum(counts)]) / (total if total > 0 else 1.0)
    return edges, cdf


def histogram_distance(a: TensorStats, b: TensorStats) -> float:
    """Total-variation distance between the histograms of two statistics records.

    Each histogram is read as a piecewise-uniform density over its range; on the union
    of both sets of bin edges both densities are uniform on every interval, so the
    distance (half the L1 distance of the bin masses there) is exact for that reading.

    Returns
    -------
    float
        In [0, 1]; NaN when either histogram is empty (no finite value).
    """
    log2 = (a.get("hist_kind") == "log2", b.get("hist_kind") == "log2")
    if all(log2):
        # The same fixed bins on both sides (gradexplorer.stats.merge): the distance of the masses.
        # hist_kind "log2": both are a dataset capture's records.
        pa, pb = _hist_counts(cast(DatasetTensorStats, a)), _hist_counts(cast(DatasetTensorStats, b))
        if pa.sum() == 0 or pb.sum() == 0:
            return math.nan
        return float(0.5 * np.abs(pa / pa.sum() - pb / pb.sum()).sum())
    if any(log2):
        return math.nan  # log2 bins against equal-width ones: no common reading
    ea, ca = _hist_cdf(a)
    eb, cb = _hist_cdf(b)
    if ca[-1] == 0 or cb[-1] == 0:
        return math.nan
    edges = np.union1d(ea, eb)
    fa = np.interp(edges, ea, ca, left=0.0, right=1.0)
    fb = np.interp(edges, eb, cb, left=0.0, right=1.0)
    return float(0.5 * np.abs(np.diff(fa) - np.diff(fb)).sum())


def stats_diff(a: TensorStats, b: TensorStats, tolerance: Tolerance = Tolerance()) -> StatsDiff:
    """Compare two statistics records (``gradexplorer.stats.tensor_stats.tensor_stats``).

    Parameters
    ----------
    a, b : TensorStats
        The reference's and the other's statistics.
    tolerance : Tolerance

    Returns
    -------
    StatsDiff
    """
    diffs: dict[str, float] = {}
    for k in STAT_KEYS:
        va, vb = float(a[k]), float(b[k])
        diffs[k] = 0.0 if (va == vb or (math.isnan(va) and math.isnan(vb))) else vb - va
    la, lb = float(a["l2"]), float(b["l2"])
    within = (all(tolerance.allows(float(a[k]), float(b[k])) for k in TOLERANCE_KEYS)
              and all(int(a[k]) == int(b[k]) for k in COUNT_KEYS))
    if la == lb or (math.isnan(la) and math.isnan(lb)):
        rel = 0.0
    else:
        rel = abs(lb - la) / la if la > 0 else math.inf
    return StatsDiff(diffs, _ratio(lb, la), rel, histogram_distance(a, b), within)


def _kind_diff(kind: str, ta: torch.Tensor | None, tb: torch.Tensor | None, sa: TensorStats | None,
               sb: TensorStats | None, tolerance: Tolerance, label_a: str, label_b: str,
               why: str | None = None) -> KindDiff | None:
    if sa is None and sb is None and ta is None and tb is None:
        return None
    what = KIND_LABELS.get(kind, kind)
    if sa is None or sb is None:
        missing = label_a if sa is None else label_b
        return KindDiff(kind, None, note=f"no {what} in {missing}" + (f": {why}" if why else ""))
    stats = stats_diff(sa, sb, tolerance)
    tensor = None
    if ta is not None and tb is not None:
        if tuple(ta.shape) != tuple(tb.shape):
            return KindDiff(kind, stats, note=f"{what} shapes differ: {_shape(ta.shape)} against {_shape(tb.shape)}")
        tensor = tensor_diff(ta, tb, tolerance)
    return KindDiff(kind, stats, tensor)


def _shape(shape: Sequence[int]) -> str:
    return "x".join(str(int(s)) for s in shape) or "scalar"


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------


def map_name(name: str, mapping: Mapping[str, str] | None) -> str:
    """A's layer name as B calls it.

    ``mapping`` entries are exact names (``{"fc": "head"}``), or prefixes when the key
    ends with a dot: ``{"backbone.": "encoder."}`` renames a whole subtree, and
    ``{"module.": ""}`` strips the prefix ``DataParallel`` adds. Exact entries win over
    prefixes, longer prefixes over shorter ones.
    """
    if not mapping:
        return name
    if name in mapping:
        return mapping[name]
    best = ""
    for old in mapping:
        if old.endswith(".") and name.startswith(old) and len(old) > len(best):
            best = old
    return mapping[best] + name[len(best):] if best else name


def check_mapping(mapping: Mapping[str, str] | None) -> dict[str, str]:
    """Validate a name mapping (see ``map_name``).

    Raises
    ------
    CompareError
        For an empty name, or a prefix mapped to a plain name or the other way round
        (a prefix may map to "", which strips it).
    """
    out: dict[str, str] = {}
    for old, new in (mapping or {}).items():
        if not isinstance(old, str) or not isinstance(new, str) or not old or not (new or old.endswith(".")):
            raise CompareError(f"The name mapping {old!r}={new!r} is incomplete.",
                               "Write it as A_NAME=B_NAME, e.g. fc=head or backbone.=encoder.")
        if new and old.endswith(".") != new.endswith("."):
            raise CompareError(f"The name mapping {old}={new} mixes a prefix and a name.",
                               "End both sides with a dot to rename a subtree (backbone.=encoder.), or neither.")
        out[old] = new
    return out


def forward_order(capture: Capture) -> list[tuple[str, int]]:
    """Every (layer, call index) of a capture in forward order (module docstring)."""
    order = capture.meta.get("call_order") if isinstance(capture.meta, dict) else None
    if order:
        seen = [(str(n), int(i)) for n, i in order if n in capture and int(i) < len(capture[n].calls)]
        rest = [(n, i) for n, i, _ in capture.iter_calls() if (n, i) not in set(seen)]
        return seen + rest
    return [(n, i) for n, i, _ in capture.iter_calls()]


def _summary(cap: Capture, limit: int = 4) -> str:
    names = cap.layer_order
    more = f", ... ({len(names)} layers)" if len(names) > limit else ""
    model = cap.meta.get("model") or cap.meta.get("model_name") or "?"
    return f"{model}: {', '.join(names[:limit])}{more}" if names else f"{model}: no layer"


def _call_kind(call: CallRecord, kind: str) -> tuple[torch.Tensor | None, TensorStats | None]:
    return call.tensor(kind), call.stats.get(kind)


def _data_of(cap: Capture) -> str:
    dataset = cap.meta.get("dataset")
    if dataset:
        return f"a dataset capture over {dataset.get('samples')} samples (statistics merged over its batches)"
    n = next((int(c.shape[0]) for _, _, c in cap.iter_calls() if c.shape), None)
    return f"one batch{f' of {n} samples' if n is not None else ''}"


def check_same_data(a: Capture, b: Capture, label_a: str = "A", label_b: str = "B") -> None:
    """Refuse to compare a dataset capture (``gradexplorer.recording.dataset_capture``) with anything but a
    dataset capture over as many samples, in batches of the same sizes.

    Norms, sums and histogram counts grow with the number of values: a dataset's merged
    statistics against one batch's, or against another number of samples, would differ
    whatever the gradients; parameter gradients are per-batch sums, so they also depend
    on the batch size. Two dataset captures over the same samples and batch sizes compare
    as statistics-only captures do (their log2 histograms bin by bin).

    Raises
    ------
    CompareError
    """
    da, db = a.meta.get("dataset"), b.meta.get("dataset")
    if not da and not db:
        return
    fix = ("compare two dataset captures made over the same samples (gradexplorer capture --batch-size on the "
           "same folder, with the same --max-samples), or two single-batch captures.")
    if not da or not db:
        raise CompareError(
            f"{label_a} is {_data_of(a)} and {label_b} is {_data_of(b)}: their statistics cover different "
            "data, so norms and histograms cannot be compared;", fix)
    if int(da.get("samples", -1)) != int(db.get("samples", -2)):
        raise CompareError(
            f"{label_a} is a dataset capture over {da.get('samples')} samples and {label_b} over "
            f"{db.get('samples')}: norms and histogram counts grow with the samples, so they cannot be compared;",
            fix)
    sizes_a = list((da.get("series") or {}).get("samples", []))
    sizes_b = list((db.get("series") or {}).get("samples", []))
    if sizes_a != sizes_b:
        raise CompareError(
            f"{label_a} and {label_b} cut the samples into different batches ({_batches(sizes_a)} against "
            f"{_batches(sizes_b)}): their parameter gradients are per-batch sums, so they cannot be compared;",
            "capture both with the same --batch-size (Run over folder: the same batch size).")


def _batches(sizes: list) -> str:
    return f"{len(sizes)} batches of {sizes[0]}" if sizes else "no batches"


def default_tolerance(a: Capture, b: Capture) -> tuple[float, float]:
    """``(rtol, atol)`` suited to the captures' dtypes: NumPy's 1e-5 and 1e-8 for float32
    and wider, ``HALF_TOLERANCES`` when either side recorded bf16 (the looser) or fp16
    activations, as autocast does; a bf16 run then is not "diverged" by rounding alone.
    """
    dtypes = {str(call.dtype).replace("torch.", "") for cap in (a, b) for name in cap.layer_order
              for call in cap[name].calls}
    for kind in ("bfloat16", "float16"):
        if kind in dtypes:
            return HALF_TOLERANCES[kind]
    return DEFAULT_RTOL, DEFAULT_ATOL


def compare(
    a: Capture,
    b: Capture,
    *,
    tolerance: Tolerance | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    mapping: Mapping[str, str] | None = None,
    label_a: str = "A",
    label_b: str = "B",
) -> Comparison:
    """Compare capture ``b`` with the reference ``a``, layer by layer and call by call.

    Parameters
    ----------
    a, b : Capture
        Full or statistics-only, in any combination (a pair where one side lacks the
        tensors is compared by statistics).
    tolerance : Tolerance, optional
        Or ``rtol`` / ``atol`` (defaults ``1e-5`` and ``1e-8``, as in NumPy, for float32
        captures; looser for bf16 and fp16 ones: ``default_tolerance``).
    mapping : mapping of str to str, optional
        A's layer names to B's (see ``map_name``) for renamed modules.
    label_a, label_b : str
        Names of the two captures in notes ("no gradient in B").

    Returns
    -------
    Comparison

    Raises
    ------
    CompareError
        When the captures have no layer in common (different models, or a mapping that
        does not fit), or for a bad tolerance or mapping.
    """
    if tolerance is None:
        d_rtol, d_atol = default_tolerance(a, b)
        tolerance = Tolerance(d_rtol if rtol is None else rtol, d_atol if atol is None else atol)
    check_same_data(a, b, label_a, label_b)
    mapping = check_mapping(mapping)
    matched = [(n, map_name(n, mapping)) for n in a.layer_order]
    matched = [(n, m) for n, m in matched if m in b]
    if not matched:
        raise CompareError(
            f"The two captures have no layer in common ({label_a} is {_summary(a)}; "
            f"{label_b} is {_summary(b)}).",
            "Compare captures of the same model, or map renamed layers (A_NAME=B_NAME).",
        )
    to_b = dict(matched)
    matched_b = set(to_b.values())
    only_a = [layer_label(n) for n in a.layer_order if n not in to_b]
    only_b = [layer_label(n) for n in b.layer_order if n not in matched_b]

    calls: list[CallDiff] = []
    for name, i in forward_order(a):
        if name not in to_b:
            continue
        bname = to_b[name]
        rec_a, rec_b = a[name], b[bname]
        if i >= len(rec_b.calls):
            only_a.append(f"{layer_label(name)}#{i}")
            continue
        ca, cb = rec_a.calls[i], rec_b.calls[i]
        cd = CallDiff(name, bname, i, rec_a.type, tuple(ca.shape), tuple(cb.shape))
        if rec_a.type != rec_b.type:
            cd.note = f"types differ: {rec_a.type} against {rec_b.type}"
        elif ca.shape and cb.shape and tuple(ca.shape) != tuple(cb.shape):
            cd.note = f"shapes differ: {_shape(ca.shape)} against {_shape(cb.shape)}"
        else:
            for kind in KINDS:
                ta, sa = _call_kind(ca, kind)
                tb, sb = _call_kind(cb, kind)
                kd = _kind_diff(kind, ta, tb, sa, sb, tolerance, label_a, label_b,
                                ca.absent.get(kind) if sa is None else cb.absent.get(kind))
                if kd is not None:
                    cd.kinds[kind] = kd
        calls.append(cd)
    for name, bname in matched:
        extra = len(b[bname].calls) - len(a[name].calls)
        only_b.extend(f"{layer_label(bname)}#{j}"
                      for j in range(len(a[name].calls), len(a[name].calls) + max(extra, 0)))

    params: list[ParamDiff] = []
    for name, bname in matched:
        ra, rb = a[name], b[bname]
        for p in ra.param_stats:
            if p not in rb.param_stats:
                only_a.append(f"{layer_label(name)}:{p}")
                continue
            kd = _kind_diff("param:" + p, ra.param_grads.get(p), rb.param_grads.get(p), ra.param_stats[p],
                            rb.param_stats[p], tolerance, label_a, label_b,
                            ra.param_absent.get(p) if ra.param_stats[p] is None else rb.param_absent.get(p))
            if kd is not None:
                params.append(ParamDiff(name, p, kd))
        only_b.extend(f"{layer_label(bname)}:{p}" for p in rb.param_stats if p not in ra.param_stats)

    result = Comparison(label_a, label_b, dict(a.meta), dict(b.meta), tolerance, calls, params, only_a, only_b)
    result.not_called_a = [n for n, _ in matched if not a[n].called]
    result.not_called_b = [m for _, m in matched if not b[m].called]
    result.input, result.input_note = _whole(a.input, b.input, tolerance, "batches")
    result.output, result.output_note = _whole(a.output, b.output, tolerance, "outputs")
    return result


def _whole(ta: torch.Tensor | None, tb: torch.Tensor | None, tol: Tolerance,
           what: str) -> tuple[TensorDiff | None, str]:
    if ta is None or tb is None:
        return None, ""
    if tuple(ta.shape) != tuple(tb.shape):
        return None, f"the {what} have different shapes ({_shape(ta.shape)} against {_shape(tb.shape)})"
    return tensor_diff(ta, tb, tol), ""


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------


def _csv_value(v: object) -> object:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return repr(v)
    return v


def csv_text(result: Comparison) -> str:
    """The comparison as CSV: one row per call and tensor kind, per parameter gradient,
    and per unmatched layer (``CSV_COLUMNS``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for row in result.rows():
        w.writerow([_csv_value(row.get(c, "")) for c in CSV_COLUMNS])
    return buf.getvalue()


def save_csv(result: Comparison, path: str | os.PathLike) -> Path:
    """Write ``csv_text(result)`` to ``path`` atomically (``gradexplorer.base.file_write``).

    Raises
    ------
    FileWriteError
        The folder is missing or read-only, the path is a folder or socket, the disk is
        full...; an existing file is left as it was.
    """
    return atomic_write_text(path, csv_text(result))


def iter_divergent(result: Comparison, kinds: Iterable[str] = KINDS) -> Iterator[tuple[CallDiff, str]]:
    """Every (call, kind) outside the tolerance, in forward order."""
    for c in result.calls:
        for k in kinds:
            if c.diverges(k):
                yield c, k


# ---------------------------------------------------------------------------
# What the compare view draws
# ---------------------------------------------------------------------------


@dataclass
class HeatmapTriple:
    """A, B and A - B pictures of one sample's tensor, on one symmetric colour scale.

    Attributes
    ----------
    a, b, diff : gradexplorer.analysis.heatmaps.Heatmap
        The same display for both (the top-k grid shows A's channels in both and in the
        difference, so the tiles line up); ``diff`` pictures the element-wise ``a - b``.
    levels : (float, float)
        ``(-m, m)`` with ``m`` the largest finite magnitude of the three pictures.
    """

    a: object
    b: object
    diff: object
    levels: tuple[float, float]


def heatmap_triple(a_sample: torch.Tensor, b_sample: torch.Tensor, display: str = "channel", *,
                   channel: int = 0, k: int = 16, reduce: str = "mean", rank_by: torch.Tensor | None = None,
                   time_index: int | None = None, columns: int | None = None) -> HeatmapTriple:
    """Pictures of two samples of one layer's tensor and of their difference.

    Parameters
    ----------
    a_sample, b_sample : torch.Tensor
        One sample each (no batch dimension), of one shape.
    display, channel, k, reduce, time_index, columns
        As ``gradexplorer.analysis.heatmaps.heatmap``.
    rank_by : torch.Tensor, optional
        Ranks the top-k channels (default: A's tensor); B and the difference show the
        same channels.

    Returns
    -------
    HeatmapTriple

    Raises
    ------
    CompareError
        When the shapes differ; ``GradExplorerError`` as ``heatmap`` does.
    """
    if tuple(a_sample.shape) != tuple(b_sample.shape):
        raise CompareError(f"A's tensor has shape {_shape(a_sample.shape)} and B's {_shape(b_sample.shape)}.",
                           "Pick a layer whose shapes agree.")
    a32, b32 = a_sample.detach().float(), b_sample.detach().float()
    # float64 difference: a float32 a - b of nearly equal values would lose the digits
    # that are the point of the picture.
    d = (a_sample.detach().double() - b_sample.detach().double()).float()
    rank = rank_by if rank_by is not None else a32
    kw: dict[str, Any] = {"channel": channel, "k": k, "reduce": reduce, "rank_by": rank, "time_index": time_index,
                          "columns": columns}
    ha = heatmap(a32, display, **kw)
    hb = heatmap(b32, display, **kw)
    hd = heatmap(d, display, **kw)
    m = 0.0
    for h in (ha, hb, hd):
        arr = h.array[np.isfinite(h.array)]
        if arr.size:
            m = max(m, float(np.abs(arr).max()))
    return HeatmapTriple(ha, hb, hd, (-m, m) if m > 0 else (-1.0, 1.0))


@dataclass
class FlowComparison:
    """Gradient flow of both captures on A's layers, and their ratio B / A.

    ``names`` are A's matched layers in forward order; ``b`` holds B's value of the
    mapped layer; ``ratio`` is NaN where either value is missing or A's is zero.
    """

    names: list[str]
    a: list[float]
    b: list[float]
    ratio: list[float]


def flow_comparison(a: Capture, b: Capture, metric: str = "l2", kind: str = "grad_output",
                    mapping: Mapping[str, str] | None = None) -> FlowComparison:
    """``gradexplorer.analysis.gradient_flow.flow_series`` of both captures, matched by name.

    Parameters
    ----------
    a, b : Capture
    metric, kind : str
        As ``flow_series``.
    mapping : mapping, optional
        A's names to B's (``map_name``).

    Returns
    -------
    FlowComparison
    """
    mapping = check_mapping(mapping)
    names_a, va = flow_series(a, metric, kind)
    names_b, vb = flow_series(b, metric, kind)
    of_b = dict(zip(names_b, vb))
    names, xs, ys, ratio = [], [], [], []
    for n, x in zip(names_a, va):
        m = map_name(n, mapping)
        if m not in of_b:
            continue
        y = of_b[m]
        names.append(n)
        xs.append(x)
        ys.append(y)
        ratio.append(y / x if math.isfinite(x) and math.isfinite(y) and x != 0 else math.nan)
    return FlowComparison(names, xs, ys, ratio)
