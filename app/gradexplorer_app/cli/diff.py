"""``gradexplorer diff A.pt B.pt``: where two captures diverge, and a regression check.

Exit status follows diff(1), so that a CI job can tell "the numbers moved" from "the
check itself is broken": 0 when every matched tensor is within the tolerance, 1 when one
is not (or a layer is present in one capture only), 2 for usage errors and for captures
that cannot be read or compared. Headless: no Qt is imported.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.cli.common import UI, UsageError, add_common
from gradexplorer_app.cli.format import fmt_num, fmt_shape, table

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.

if TYPE_CHECKING:
    from gradexplorer.comparison.compare import CallDiff, Comparison, KindDiff, TensorDiff
    from gradexplorer_app.cli.common import SubParsers

EXIT_SAME = 0
EXIT_DIVERGED = 1
EXIT_TROUBLE = 2


def register(sub: SubParsers) -> None:
    """Add the ``diff`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "diff", help="compare two capture files layer by layer (exit 1 when they diverge)",
        description="Compare capture B with the reference A, layer by layer and call by call: relative "
                    "L2 difference, cosine similarity and largest difference of activations and gradients "
                    "(statistics for statistics-only captures), and the first layers that diverge. Exit "
                    "status: 0 within tolerance, 1 outside it, 2 when the files cannot be compared.",
    )
    p.add_argument("a", metavar="A.pt", help="the reference capture")
    p.add_argument("b", metavar="B.pt", help="the capture to check against it")
    p.add_argument("--rtol", type=_non_negative, default=None, metavar="R",
                   help="relative tolerance (default 1e-5; 1.6e-2 when a capture holds bf16, 1e-3 fp16): "
                        "|b - a| <= atol + rtol * |a| element by element")
    p.add_argument("--atol", type=_non_negative, default=None, metavar="A", help="absolute tolerance (default 1e-8)")
    p.add_argument("--map", action="append", default=[], metavar="A_NAME=B_NAME",
                   help="match renamed layers; end both with a dot for a subtree (backbone.=encoder.), "
                        "'module.=' strips a prefix; repeatable")
    p.add_argument("--sort", choices=("forward", "divergence"), default="forward",
                   help="table order: forward (default) or largest divergence first")
    p.add_argument("--csv", metavar="FILE", help="also write every figure to this CSV file")
    add_common(p)
    p.set_defaults(func=cmd_diff)


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be a finite number >= 0")
    return v


def _mapping(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--map '{item}' has no '='; write it as A_NAME=B_NAME (e.g. fc=head).")
        old, new = item.split("=", 1)
        out[old.strip()] = new.strip()
    return out


def _labels(a: Path, b: Path) -> tuple[str, str]:
    if a.name != b.name:
        return a.name, b.name
    return str(a), str(b)


def cmd_diff(args: argparse.Namespace, ui: UI) -> int:
    """Run ``gradexplorer diff``; returns the exit status."""
    mapping = _mapping(args.map)
    try:
        return _diff(args, ui, mapping)
    except UsageError:
        raise
    except GradExplorerError as exc:
        # Exit 2, not the CLI's usual 1: 1 means "the captures diverge" here.
        raise UsageError(f"{exc.problem} {exc.fix}".strip()) from None


def _diff(args: argparse.Namespace, ui: UI, mapping: dict[str, str]) -> int:
    from gradexplorer.comparison.compare import Tolerance, compare, default_tolerance, save_csv
    from gradexplorer.files.capture_file import load_capture

    path_a, path_b = Path(args.a).expanduser(), Path(args.b).expanduser()
    csv_path = _check_csv(args.csv, (path_a, path_b)) if args.csv else None
    ui.bar.update("reading A")
    cap_a = load_capture(path_a)
    ui.bar.update("reading B")
    cap_b = load_capture(path_b)
    ui.bar.update("comparing")
    label_a, label_b = _labels(path_a, path_b)
    d_rtol, d_atol = default_tolerance(cap_a, cap_b)  # looser for bf16/fp16 captures
    tol = Tolerance(d_rtol if args.rtol is None else args.rtol, d_atol if args.atol is None else args.atol)
    result = compare(cap_a, cap_b, tolerance=tol, mapping=mapping, label_a="A", label_b="B")
    ui.bar.clear()
    print(render(result, label_a, label_b, sort=args.sort))
    if csv_path is not None:
        written = save_csv(result, csv_path)
        ui.note(f"wrote     {written}")
    return EXIT_SAME if result.within else EXIT_DIVERGED


def _check_csv(text: str, inputs: tuple[Path, ...]) -> Path:
    from gradexplorer.base.file_write import check_output_path

    # A folder, a socket, a missing folder or one of the captures themselves: refused
    # before anything is read.
    return check_output_path(text, inputs)


# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------


def _describe(meta: dict[str, Any]) -> str:
    weights = meta.get("weights") or "random init"
    parts = [f"{meta.get('model', '?')} ({weights})", f"target {meta.get('target', '?')}",
             f"device {meta.get('device', '?')}", f"dtype {meta.get('dtype', '?')}"]
    if meta.get("autocast"):
        parts.append(f"autocast {meta['autocast']}")
    parts.append(f"mode {meta.get('mode', '?')}{' train' if meta.get('train') else ''}")
    return "  ".join(parts)


def _random_init(meta: dict[str, Any]) -> bool:
    # Demo models are built with fixed seeds; any other model without weights is random.
    model = str(meta.get("model") or "")
    return not meta.get("weights") and not model.startswith("demo:") and not model.endswith((".pt", ".pth", ".pt2"))


def _whole(diff: TensorDiff | None, note: str) -> str:
    if note:
        return note
    if diff is None:
        return "-"
    if diff.max_abs == 0:
        return "identical"
    return (f"rel L2 {fmt_num(diff.rel_l2)}  cosine {_cos(diff.cosine)}  max |B-A| {fmt_num(diff.max_abs)}  "
            f"{diff.outside} of {diff.numel} outside")


def _cos(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if x == 1.0:
        return "1"
    # Cosines that matter are 0.9999...: show how far from 1, not "1".
    return f"1-{1 - x:.2e}" if x > 0.999 else f"{x:.4f}"


def _status(c: CallDiff) -> str:
    from gradexplorer.comparison.compare import KIND_LABELS

    if c.note:
        return c.note
    bad = [KIND_LABELS[k].replace("input gradient", "grad in").replace("gradient", "grad").replace(
        "activation", "act") for k, kd in c.kinds.items() if not kd.within]
    notes = [kd.note for kd in c.kinds.values() if kd.note]
    if not bad:
        return "ok"
    return "DIVERGES: " + ", ".join(bad) + (f" ({'; '.join(notes)})" if notes else "")


def _tensor_cells(kd: KindDiff | None) -> list[str]:
    if kd is None:
        return ["-", "-", "-"]
    if kd.tensor is None:
        return ["-" if kd.note else "?", "-", "-"]
    t = kd.tensor
    return [fmt_num(t.rel_l2), _cos(t.cosine), fmt_num(t.max_abs)]


def _stats_cells(kd: KindDiff | None) -> list[str]:
    if kd is None or kd.stats is None:
        return ["-", "-", "-"]
    s = kd.stats
    return [fmt_num(s.rel_norm_diff), fmt_num(s.differences["mean"]), fmt_num(s.differences["std"])]


def _norm_ratio(kd: KindDiff | None) -> str:
    if kd is None:
        return "-"
    if kd.tensor is not None:
        return fmt_num(kd.tensor.norm_ratio)
    return fmt_num(kd.stats.norm_ratio) if kd.stats is not None else "-"


def render(result: Comparison, label_a: str = "A", label_b: str = "B", sort: str = "forward") -> str:
    """The text ``gradexplorer diff`` prints: header, table, first divergent calls, verdict."""
    from gradexplorer.capturing.data import layer_label

    tol = result.tolerance
    n_layers = len({c.layer for c in result.calls})
    by = "statistics (a capture holds statistics only)" if result.by_statistics else "tensors"
    lines = [
        f"A          {label_a}  {_describe(result.meta_a)}",
        f"B          {label_b}  {_describe(result.meta_b)}",
        (f"tolerance  rtol {fmt_num(tol.rtol)}  atol {fmt_num(tol.atol)}  (|B-A| <= atol + rtol*|A|, "
         f"{'per statistic' if result.by_statistics else 'element by element'})"),
        (f"matched    {len(result.calls)} calls of {n_layers} layers, {len(result.params)} parameter gradients, "
         f"by {by}"),
        f"input      {_whole(result.input, result.input_note)}",
        f"output     {_whole(result.output, result.output_note)}",
    ]
    if _random_init(result.meta_a) and _random_init(result.meta_b):
        lines.append("note       both captures have random weights (no --weights): captures made by two runs "
                     "have different weights, and differ everywhere")
    lines.append("")
    stats_mode = result.by_statistics
    if stats_mode:
        headers = ["LAYER", "CALL", "TYPE", "SHAPE", "ACT |dL2|/L2", "ACT dMEAN", "ACT dSTD",
                   "GRAD |dL2|/L2", "GRAD dMEAN", "GRAD dSTD", "GRAD B/A", "STATUS"]
        cells = _stats_cells
    else:
        headers = ["LAYER", "CALL", "TYPE", "SHAPE", "ACT REL L2", "ACT COS", "ACT MAX|d|",
                   "GRAD REL L2", "GRAD COS", "GRAD MAX|d|", "GRAD B/A", "STATUS"]
        cells = _tensor_cells
    calls = result.by_divergence() if sort == "divergence" else result.calls
    rows = []
    for c in calls:
        act, grad = c.kinds.get("activation"), c.kinds.get("grad_output")
        rows.append([c.label, str(c.call), c.type, fmt_shape(c.shape_a), *cells(act), *cells(grad),
                     _norm_ratio(grad), _status(c)])
    lines.append(table(headers, rows, "lrll" + "r" * 7 + "l"))
    bad_params = [p for p in result.params if not p.within]
    if bad_params:
        shown = ", ".join(p.full_name for p in bad_params[:6])
        lines.append(f"\nparameter gradients outside the tolerance: {len(bad_params)} ({shown}"
                     f"{', ...' if len(bad_params) > 6 else ''})")
    for side, names in (("A", result.only_a), ("B", result.only_b)):
        if names:
            shown = ", ".join(names[:8]) + (f", ... ({len(names)})" if len(names) > 8 else "")
            lines.append(f"only in {side}: {shown}")
    for side, names in (("A", result.not_called_a), ("B", result.not_called_b)):
        if names:
            # Never ran in that forward (a parent used their weights): no calls to compare,
            # which is not a missing gradient.
            shown = ", ".join(layer_label(n) for n in names[:8]) + (f", ... ({len(names)})" if len(names) > 8 else "")
            lines.append(f"not called in {side}: {shown}")
    lines.append("")
    lines.append(_first_line("first divergent activation (forward order)", result.first_divergent_activation,
                             "activation"))
    lines.append(_first_line("first divergent gradient (backward order)", result.first_divergent_gradient,
                             "grad_output"))
    n_bad = sum(1 for c in result.calls if not c.within)
    if result.within:
        verdict = "result     within tolerance"
    else:
        reasons = []
        if n_bad:
            reasons.append(f"{n_bad} of {len(result.calls)} calls outside the tolerance")
        if bad_params:
            reasons.append(f"{len(bad_params)} parameter gradients")
        if result.output is not None and not result.output.within:
            reasons.append("the outputs")
        if result.output_note:
            reasons.append(result.output_note)
        if result.only_a or result.only_b:
            reasons.append(f"{len(result.only_a) + len(result.only_b)} unmatched")
        verdict = "result     DIVERGED: " + "; ".join(reasons)
    lines.append(verdict)
    return "\n".join(lines)


def _first_line(title: str, c: CallDiff | None, kind: str) -> str:
    if c is None:
        return f"{title}: none"
    kd = c.kinds.get(kind)
    if c.note or kd is None:
        detail = c.note or "missing"
    elif kd.note:
        detail = kd.note
    elif kd.tensor is not None:
        t = kd.tensor
        detail = (f"rel L2 {fmt_num(t.rel_l2)}, max |B-A| {fmt_num(t.max_abs)}, "
                  f"{t.outside} of {t.numel} elements outside")
    else:
        stats = kd.stats
        assert stats is not None  # a kind without a note has tensors or statistics
        d = stats.differences
        detail = (f"|dL2|/L2 {fmt_num(stats.rel_norm_diff)}, mean {fmt_num(d['mean'])}, "
                  f"std {fmt_num(d['std'])} (by statistics)")
    return f"{title}: {c.label} call {c.call} ({c.type}): {detail}"
