"""``benchmarks/redraw.py`` on a small net: every series ran, and every switch showed."""

from __future__ import annotations

import math


def test_every_switch_is_timed_and_shown(qapp):
    from benchmarks.redraw import measure_redraw

    r = measure_redraw("resnet18", batch=2, size=64, layers=4, channels=3)

    rows = r["rows"]
    assert {row["kind"] for row in rows} == {"layer", "sample", "channel", "repaint alone"}
    assert math.isfinite(r["arrive_ms"])
    for row in rows:
        assert row["switches"] > 0, row
        assert math.isfinite(row["median_ms"]) and math.isfinite(row["max_ms"]), row
        # The view's label named the layer, sample or channel switched to: the switch
        # reached the view in front and it redrew, not later when shown.
        assert row["shown"] in (row["switches"], None), row
    assert [row["view"] for row in rows if row["kind"] == "layer"] == ["Grad-CAM", "Heatmap (topk)"]
    channel_rows = [row["case"] for row in rows if row["kind"] == "channel"]
    assert len(channel_rows) == 2
    assert channel_rows[0].startswith("layer1.") and channel_rows[1].startswith("layer4."), channel_rows
