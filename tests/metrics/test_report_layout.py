"""The report's time axis fits the run and its event labels never overlap (issue 32 item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from orchestrator.metrics.axes import layout_labels, time_unit
from orchestrator.metrics.plots import build_figure
from orchestrator.metrics.rundir import load_run
from tests.metrics.synthetic import T0, step_record, transition


@pytest.mark.parametrize(("span_s", "unit"), [(0.0, "seconds"), (27.0, "seconds"),
                                              (119.0, "seconds"), (30 * 60.0, "minutes"),
                                              (5 * 3600.0, "hours")])
def test_time_unit_fits_the_run(span_s, unit):
    scale, name = time_unit(span_s)
    assert name == unit and scale == {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0}[unit]


def test_labels_in_one_row_never_overlap_and_the_rest_are_counted():
    xs = [i * 0.1 for i in range(20)]  # events 0.1 s apart, each label 1.5 s wide
    lay = layout_labels(xs, [1.5] * 20, rows=4, gap=0.05, lo=0.0, hi=27.0)
    placed = [(lay.rows[i], lay.lefts[i], lay.lefts[i] + 1.5) for i in range(20)
              if lay.rows[i] is not None]
    assert len(placed) == 8 and lay.skipped == 12  # rows 0-3 at 0.0-0.3 s, again at 1.6-1.9 s
    for a in placed:
        for b in placed:
            if a is not b and a[0] == b[0]:
                assert a[2] + 0.05 <= b[1] or b[2] + 0.05 <= a[1]


def test_far_apart_labels_all_fit_and_the_last_is_pulled_inside():
    lay = layout_labels([0.0, 10.0, 26.9], [2.0, 2.0, 2.0], rows=4, lo=0.0, hi=27.0)
    assert lay.rows == [0, 0, 0] and lay.skipped == 0 and lay.lefts[2] == pytest.approx(25.0)


def _short_run(run_dir: Path, *, events: int) -> float:
    """A 27 s run with ``events`` handled events 0.1 s apart at t=12 s. Returns 'now'."""
    run_dir.mkdir(parents=True)
    tl = [transition(0, "PLANNING", None, T0), transition(1, "FORMING", "PLANNING", T0 + 1,
                                                           slices=["s0"]),
          transition(2, "RUNNING", "FORMING", T0 + 5, slices=["s0"]),
          transition(3, "SUCCEEDED", "RUNNING", T0 + 27, slices=["s0"], step=40)]
    (run_dir / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tl))
    steps = [step_record(k, T0 + 5 + 0.5 * k, inc=0, slices=1) for k in range(1, 41)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n"
                                                   for r in steps))
    rows = [{"seq": i, "at": T0 + 12 + 0.1 * i, "received_at": T0 + 12 + 0.1 * i,
             "decision": "accepted", "reason": "", "via": "inbox",
             "event": {"kind": "maintenance_notice", "observed_at": T0 + 12 + 0.1 * i,
                       "target": {"job": None, "slice": "s0", "host": str(i)}}}
            for i in range(events)]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return T0 + 27


def test_the_figure_of_a_27_s_run_has_a_seconds_axis_and_no_overlapping_labels(tmp_path):
    now = _short_run(tmp_path / "run", events=12)
    fig = build_figure(load_run(tmp_path / "run", now=now))
    try:
        ax_state = fig.axes[4]
        assert ax_state.get_xlabel().startswith("seconds since the run started")
        assert "too close to show" in ax_state.get_xlabel()  # 12 labels in 1.2 s: some left out
        assert ax_state.get_xlim()[1] == pytest.approx(27.0, abs=0.5)
        renderer = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in ax_state.texts if t.get_text()]
        assert len(boxes) >= 2
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)
    finally:
        plt.close(fig)
