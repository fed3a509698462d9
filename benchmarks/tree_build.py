"""Module tree build time for every torchvision model, and the largest net's Qt model.

    python -m benchmarks.tree_build [--qt]

``ModuleTree.build`` for every model of ``torchvision.models.list_models()`` (built on
the ``meta`` device: no weights are allocated, the modules are the same), then, for the
net with the most modules: the build time, and with ``--qt`` (when ``gradexplorer_app.window.module_tree_view``
exists) the construction of ``ModuleTreeModel`` for it and the first full expansion of a
tree view, offscreen.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch
import torchvision

from gradexplorer.capturing.module_tree import ModuleTree


def _build_model(name: str) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
        # Detection and segmentation builders fetch a pretrained backbone unless told not to.
        attempts = [dict(kwargs, weights_backbone=None), kwargs]
        # On the meta device first (no weights allocated); a builder that cannot run there
        # (one that copies data at init) is built for real.
        for device in ("meta", "cpu"):
            for kw in attempts:
                try:
                    with torch.device(device):
                        return torchvision.models.get_model(name, weights=None, **kw)
                except TypeError:
                    continue  # no weights_backbone argument
                except Exception:
                    if device == "cpu":
                        raise
                    break
        raise RuntimeError(f"cannot build {name}")


def _median_build(model, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ModuleTree.build(model)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_all(repeats: int = 3, names: list[str] | None = None) -> dict:
    """Build time of every model's tree; returns the largest net's figures and the slowest."""
    names = names or torchvision.models.list_models()
    rows = []
    for name in names:
        try:
            model = _build_model(name)
        except Exception as exc:  # noqa: BLE001
            print(f"  {name}: cannot build ({type(exc).__name__})")
            continue
        n = sum(1 for _ in model.modules())
        rows.append((name, n, _median_build(model, repeats)))
        del model
    largest = max(rows, key=lambda r: r[1])
    slowest = max(rows, key=lambda r: r[2])
    return {"models": len(rows), "largest": largest, "slowest": slowest,
            "total_s": sum(r[2] for r in rows)}


def measure_qt(name: str) -> dict | None:
    """Construction of the GUI's ``ModuleTreeModel`` for ``name`` and the first full
    expansion of a tree view, offscreen; None when the GUI model is not there."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        from PySide6.QtWidgets import QApplication, QTreeView

        from gradexplorer.models import load_model
        from gradexplorer.pipeline.session import Session, prepare_model
        from gradexplorer_app.window.module_tree_view import ModuleTreeModel
    except ImportError:
        return None
    app = QApplication.instance() or QApplication([])
    loaded = load_model(name)
    prepared = prepare_model(loaded)
    session = Session()
    session.set_model(prepared)
    t0 = time.perf_counter()
    model = ModuleTreeModel(session)
    t_model = time.perf_counter() - t0
    view = QTreeView()
    view.setModel(model)
    view.resize(600, 800)
    view.show()
    t0 = time.perf_counter()
    view.expandAll()
    app.processEvents()
    t_expand = time.perf_counter() - t0
    rows = model.rowCount()
    view.close()
    view.deleteLater()
    app.processEvents()
    return {"model_s": t_model, "expand_s": t_expand, "top_rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qt", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    r = measure_all(args.repeats)
    name, n, t = r["largest"]
    print(f"{r['models']} torchvision models, all trees in {r['total_s']:.2f} s")
    print(f"largest: {name} ({n} modules) {t * 1000:.1f} ms; slowest: {r['slowest'][0]} "
          f"{r['slowest'][2] * 1000:.1f} ms")
    if args.qt:
        q = measure_qt(name)
        if q is None:
            print("Qt model: n/a (gradexplorer_app.window.module_tree_view.ModuleTreeModel not available)")
        else:
            print(f"Qt model for {name}: construction {q['model_s'] * 1000:.0f} ms, first full expansion "
                  f"{q['expand_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
