"""``gradexplorer inspect``: the metadata and per-layer statistics of a capture file; a
watch log (.gxw) is summarised by ``gradexplorer_app.cli.inspect_log``.

The engine is imported inside the command, for start-up time (``gradexplorer --help``
loads no torch).
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import counted
from gradexplorer_app.cli.common import EXIT_OK, UI, add_common, onset_lines
from gradexplorer_app.cli.format import fmt_num, fmt_shape, human_size, table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gradexplorer.capturing.data import LayerRecord
    from gradexplorer_app.cli.common import SubParsers


def register(sub: SubParsers) -> None:
    """Add the ``inspect`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("inspect", help="summarise a capture file or a watch log",
                       description="Show the metadata and per-layer statistics of a capture file, or "
                                   "summarise a watch log (.gxw): steps, NaN/Inf onset, vanishing or "
                                   "exploding layers.")
    p.add_argument("file", metavar="FILE.pt|RUN.gxw")
    p.add_argument("--layer", metavar="NAME", help="details of one layer (a name or glob pattern)")
    p.add_argument("--csv", metavar="FILE", help="watch logs: also export every row to this CSV file; a capture of "
                   "a sequence: each token's saliency (sample, position, token, saliency)")
    add_common(p)
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace, ui: UI) -> int:
    """Run ``gradexplorer inspect``; returns the exit status."""
    from gradexplorer.files.capture_file import load_capture
    from gradexplorer.recording.watch_log import is_watch_log
    from gradexplorer_app.cli.inspect_log import check_csv_target, cmd_inspect_log  # imports numpy

    path = Path(args.file).expanduser()
    if args.csv:
        check_csv_target(args.csv, path)
    if path.suffix == ".gxw" or is_watch_log(path):
        return cmd_inspect_log(path, args.csv)

    cap = load_capture(path)
    if args.csv:
        _write_token_csv(cap, args.csv)
    names = list(cap.layers)
    chosen = _chosen_layers(args, names)
    header = _header(path, cap, names)
    width = max(len(k) for k, _ in header)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in header))
    from gradexplorer.analysis.capture_summary import summarize

    onset = onset_lines(cap, summarize(cap).layers_with("nan/inf"))
    if onset:
        print("\n".join(onset))
    print()
    print(table(
        ["LAYER", "CALL", "TYPE", "SHAPE", "ACT MEAN", "ACT STD", "GRAD L2", "MEAN|G|", "MAX|G|", "G ZERO%", "FLAGS"],
        _layer_rows(cap, chosen), "lrllrrrrrrl",
    ))
    if args.layer:
        for name in chosen:
            _print_layer_details(name, cap.layers[name])
    return EXIT_OK


def _chosen_layers(args: argparse.Namespace, names: list[str]) -> list[str]:
    """The layers ``--layer`` names (a name, its label or a glob pattern), else all of them."""
    from gradexplorer.capturing.data import layer_label

    if not args.layer:
        return names
    # The root module's record (its own parameters) is named "" and shown as (model).
    chosen = [n for n in names if args.layer in (n, layer_label(n)) or fnmatch.fnmatchcase(n, args.layer)]
    if not chosen:
        near = difflib.get_close_matches(args.layer, [layer_label(n) for n in names], n=3)
        hint = f"near names: {', '.join(near)}; " if near else ""
        raise GradExplorerError(f"the capture has no layer '{args.layer}';",
                                f"{hint}run 'gradexplorer inspect {args.file}' to list its layers.")
    return chosen


def _header(path: Path, cap: Any, names: list[str]) -> list[tuple[str, str]]:
    """The capture's header lines, (key, value): file, model, target, input, layers, ..."""
    from gradexplorer.files.meta import capture_meta

    yes_no: dict[bool | None, str] = {True: "yes", False: "no"}
    n_calls = sum(len(cap.layers[n].calls) for n in names)
    meta = capture_meta(cap)
    autocast = f"  autocast {meta.autocast}" if meta.autocast else ""
    header = [
        ("file", f"{path} ({human_size(path.stat().st_size)})"),
        ("model", f"{meta.model}  weights {meta.weights or 'random init'}"),
        ("target", (f"{meta.target}  device {meta.device}  dtype {meta.dtype}{autocast}  "
                    f"mode {meta.mode}  train {yes_no.get(meta.train, meta.train)}")),
        ("created", f"{meta.created}  torch {meta.torch_version}"),
        ("input", (f"{fmt_shape(tuple(cap.input.shape)) if cap.input is not None else '-'}"
                   f"  input grad {'yes' if cap.input_grad is not None else 'no'}"
                   + _all_inputs_text(cap.model_inputs))),
        ("layers", f"{len(names)} ({counted(n_calls, 'call')})" + _not_called_text(cap)),
        ("params", _params_text(cap)),
    ]
    if meta.batch:
        header.insert(4, ("batch", meta.batch))
    if meta.sample_names:
        shown = ", ".join(meta.sample_names[:6]) + (" ..." if len(meta.sample_names) > 6 else "")
        header.insert(5, ("samples", shown))
    if meta.labels is not None:
        header.insert(6, ("labels", ", ".join(_label_text(i, meta.categories) for i in meta.labels[:6])
                          + (" ..." if len(meta.labels) > 6 else "")))
    if meta.target_words:
        header.insert(3, ("", meta.target_words))
    if meta.input_grad_of and cap.input_grad is not None:
        header.insert(len(header) - 1, ("", f"input grad of {meta.input_grad_of}"))
    for i, tokens in enumerate((meta.tokens or ())[:6]):
        predicted = meta.predicted_tokens[i] if meta.predicted_tokens and i < len(meta.predicted_tokens) else None
        header.append((f"tokens {i}", " | ".join(tokens) + (f"  -> next {predicted!r}" if predicted else "")))
    return header


def _layer_rows(cap: Any, chosen: list[str]) -> list[list[str]]:
    """One table row per call of each chosen layer (one "not called" row for a layer that never ran)."""
    from gradexplorer.capturing.data import layer_label

    rows = []
    for name in chosen:
        rec = cap.layers[name]
        if not rec.calls:
            rows.append([layer_label(name), "-", rec.type, "-", "-", "-", "-", "-", "-", "-", "not called"])
        for i, call in enumerate(rec.calls):
            act: Mapping[str, Any] = call.stats.get("activation") or {}
            grad = call.stats.get("grad_output")
            flags = _flags(call.stats)
            g: Mapping[str, Any] = grad or {}
            rows.append([
                layer_label(name), str(i), rec.type, fmt_shape(call.shape),
                fmt_num(act.get("mean")), fmt_num(act.get("std")),
                fmt_num(g.get("l2")), fmt_num(g.get("mean_abs")), fmt_num(_max_abs(g) if grad else None),
                f"{g['zero_fraction'] * 100:.1f}" if grad else "-",
                flags,
            ])
    return rows


def _not_called_text(cap: Any) -> str:
    """``"; 2 never called"`` when some layers never ran during forward."""
    n = sum(1 for rec in cap.layers.values() if not rec.calls)
    return f"; {n} never called" if n else ""


def _params_text(cap: Any) -> str:
    """The captured parameters: how many have a gradient, and why the others have none."""
    from collections import Counter

    stats = cap.param_stats
    if not stats:
        return "none captured"
    have = sum(1 for s in stats.values() if s is not None)
    why = Counter(cap.param_absent.values())
    missing = len(stats) - have
    text = f"{have} of {len(stats)} with gradients"
    if missing:
        reasons = ", ".join(f"{n} {reason}" for reason, n in why.most_common())
        text += f" ({reasons})" if reasons else f" ({missing} without)"
    return text


def _write_token_csv(cap: Any, out: str) -> None:
    """``inspect CAPTURE --csv FILE``: each token's saliency, with its string for a text batch."""
    from gradexplorer.analysis.saliency import token_saliency_csv
    from gradexplorer.base.file_write import atomic_write_text

    text = token_saliency_csv(cap)
    if text is None:
        raise GradExplorerError(
            "--csv of a capture file exports each token's saliency, and this capture has none (its input is not "
            "a sequence, or no gradient reached the tokens);",
            "capture with --input-grad (or with the embedding layer selected), or leave out --csv.")
    atomic_write_text(out, text)


def _all_inputs_text(model_inputs: dict[str, Any] | None) -> str:
    """``"  (all inputs: 2 positional 2x3x8x8, 2x3x8x8; mask 2x8)"`` for a model of several inputs."""
    if not model_inputs:
        return ""

    def shown(v: object) -> str:
        return fmt_shape(tuple(v.shape)) if hasattr(v, "shape") else type(v).__name__

    parts = []
    if model_inputs["args"]:
        parts.append(f"{len(model_inputs['args'])} positional " + ", ".join(shown(v) for v in model_inputs["args"]))
    parts += [f"{k} {shown(v)}" for k, v in model_inputs["kwargs"].items()]
    return f"  (all inputs: {'; '.join(parts)})"


def _label_text(index: int, categories: Sequence[str] | None) -> str:
    if categories and 0 <= index < len(categories):
        return f"{index} ({categories[index]})"
    return str(index)


def _max_abs(stats: Mapping[str, Any]) -> float:
    return max(abs(stats["min"]), abs(stats["max"]))


def _flags(stats: dict[str, Any]) -> str:
    from gradexplorer.analysis.gradient_flow import call_flags

    flags = []
    for kind, short in (("activation", "act"), ("grad_output", "grad"), ("grad_input", "grad in")):
        s = stats.get(kind)
        counts = [f"{s[key]} {word}" for key, word in (("nan_count", "NaN"), ("inf_count", "Inf")) if s and s[key]]
        if counts:
            flags.append(f"{short}: {' '.join(counts)}")
        if s and s.get("overflow"):  # the statistic is beyond float64, not the data
            flags.append(f"{short}: {'/'.join(s['overflow'])} beyond float64")
    words = {"no gradient": "no grad", "zero": "zero grad"}
    flags += [words[f] for f in call_flags(stats) if f in words]
    return "; ".join(flags)


def _stat_row(label: str, s: Mapping[str, Any] | None) -> list[str]:
    if not s:
        return [label] + ["-"] * 10
    return [
        label, str(s["numel"]), fmt_num(s["min"]), fmt_num(s["max"]), fmt_num(s["mean"]), fmt_num(s["std"]),
        fmt_num(s["mean_abs"]), fmt_num(s["l2"]), f"{s['zero_fraction'] * 100:.1f}",
        str(s["nan_count"]), str(s["inf_count"]),
    ]


def _print_layer_details(name: str, rec: LayerRecord) -> None:
    from gradexplorer.capturing.data import layer_label

    label = layer_label(name)
    headers = ["TENSOR", "NUMEL", "MIN", "MAX", "MEAN", "STD", "MEAN|X|", "L2", "ZERO%", "NaN", "Inf"]
    if not rec.calls:
        print(f"\n{label} ({rec.type}): never called during forward (the gradients of its parameters, if "
              "any, come from another module using them, as nn.MultiheadAttention uses its out_proj's)")
    for i, call in enumerate(rec.calls):
        print(f"\n{label} ({rec.type}), call {i}: output {fmt_shape(call.shape)} {call.dtype}"
              + (f", output element '{call.output_key}'" if call.output_key else ""))
        kinds = ("activation", "grad_output", "grad_input")
        rows = [_stat_row(kind, call.stats.get(kind)) for kind in kinds]
        print(table(headers, rows, "lrrrrrrrrrr"))
        for kind in kinds:
            if call.stats.get(kind) is None and call.absent.get(kind):
                print(f"  no {kind}: {call.absent[kind]}")
    if rec.param_stats:
        print(f"\n{label} parameter gradients:")
        rows = [_stat_row(pname, s) for pname, s in rec.param_stats.items()]
        print(table(headers, rows, "lrrrrrrrrrr"))
        for pname, why in rec.param_absent.items():
            print(f"  no gradient for {pname}: {why}")
