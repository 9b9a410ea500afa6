"""The report's time axis fits the run, every mark is numbered with no label colliding, every
label is inside its panel, and loss and eval loss are drawn by training step too (issue 32
item 7, issue 53 item 7)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from orchestrator.metrics.axes import group_marks, time_unit
from orchestrator.metrics.plots import build_figure, markers
from orchestrator.metrics.records import EvalRecord
from orchestrator.metrics.rundir import load_run
from tests.metrics.synthetic import T0, step_record, transition


@pytest.mark.parametrize(("span_s", "unit"), [(0.0, "seconds"), (27.0, "seconds"),
                                              (119.0, "seconds"), (30 * 60.0, "minutes"),
                                              (5 * 3600.0, "hours")])
def test_time_unit_fits_the_run(span_s, unit):
    scale, name = time_unit(span_s)
    assert name == unit and scale == {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0}[unit]


def _ends(groups, cw):
    return [g.left + len(g.text) * cw for g in groups]


def test_marks_too_close_share_a_label_and_every_mark_is_numbered():
    """20 marks 0.1 s apart, labels 0.3 s a character: every number 1..20 is in exactly one
    label, in order, and no label overlaps the next or leaves the axis."""
    groups = group_marks([12 + i * 0.1 for i in range(20)], char_width=0.3, gap=0.05,
                         lo=0.0, hi=27.0)
    numbers = [n for g in groups for n in range(g.first, g.last + 1)]
    assert numbers == list(range(1, 21))
    ends = _ends(groups, 0.3)
    for k in range(len(groups) - 1):
        assert ends[k] + 0.05 <= groups[k + 1].left
    assert groups[0].left >= 0.0 and ends[-1] <= 27.0
    assert any(g.text != str(g.first) for g in groups)  # some share a label, e.g. "2-4"


def test_far_apart_marks_get_a_label_each_and_the_last_is_pulled_inside():
    groups = group_marks([0.0, 10.0, 26.9], char_width=1.0, lo=0.0, hi=27.0)
    assert [g.text for g in groups] == ["1", "2", "3"]
    assert groups[2].left == pytest.approx(26.0)


def test_a_last_mark_pulled_inside_onto_its_neighbour_joins_it():
    groups = group_marks([25.5, 26.9], char_width=1.0, gap=0.2, lo=0.0, hi=27.0)
    assert [(g.first, g.last) for g in groups] == [(1, 2)]
    assert _ends(groups, 1.0)[0] <= 27.0


def _short_run(run_dir: Path, *, events: int, peak_source: str = "configured",
               evals: bool = False) -> float:
    """A 27 s run with ``events`` handled events 0.1 s apart at t=12 s (with ``evals``, an
    eval every 10 steps). Returns 'now'."""
    run_dir.mkdir(parents=True)
    tl = [transition(0, "PLANNING", None, T0), transition(1, "FORMING", "PLANNING", T0 + 1,
                                                           slices=["s0"]),
          transition(2, "RUNNING", "FORMING", T0 + 5, slices=["s0"]),
          transition(3, "SUCCEEDED", "RUNNING", T0 + 27, slices=["s0"], step=40)]
    (run_dir / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tl))
    steps = [dataclasses.replace(step_record(k, T0 + 5 + 0.5 * k, inc=0, slices=1),
                                 peak_source=peak_source) for k in range(1, 41)]
    lines = [r.to_dict() for r in steps]
    if evals:
        lines += [EvalRecord(step=k, loss=4.0 - k / 20, wall_time=T0 + 5.2 + 0.5 * k,
                             tokens=256).to_dict() for k in (10, 20, 30, 40)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = [{"seq": i, "at": T0 + 12 + 0.1 * i, "received_at": T0 + 12 + 0.1 * i,
             "decision": "accepted", "reason": "", "via": "inbox",
             "event": {"kind": "maintenance_notice", "observed_at": T0 + 12 + 0.1 * i,
                       "target": {"job": None, "slice": "s0", "host": str(i)}}}
            for i in range(events)]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return T0 + 27


def _inside(inner, outer, slack=1.0):
    return (inner.x0 >= outer.x0 - slack and inner.x1 <= outer.x1 + slack
            and inner.y0 >= outer.y0 - slack and inner.y1 <= outer.y1 + slack)


def test_the_figure_of_a_27_s_run_numbers_every_mark_and_no_label_collides(tmp_path):
    """12 events in 1.2 s: each has its number on the state strip (close ones share one, e.g.
    "2-5"), no two numbers overlap, all sit inside the strip, none is left out, and the legend
    panel lists every mark's number and label inside its panel."""
    now = _short_run(tmp_path / "run", events=12)
    data = load_run(tmp_path / "run", now=now)
    ms = markers(data)
    fig = build_figure(data)
    try:
        ax_state, ax_legend = fig.axes[4], fig.axes[7]
        assert ax_state.get_xlabel() == "seconds since the run started"
        assert ax_state.get_xlim()[1] == pytest.approx(27.0, abs=0.5)
        renderer = fig.canvas.get_renderer()
        labels = [t for t in ax_state.texts if t.get_text()]
        numbers = []
        for t in labels:
            first, _, last = t.get_text().partition("-")
            numbers += range(int(first), int(last or first) + 1)
        assert numbers == list(range(1, len(ms) + 1)) and len(ms) >= 12
        boxes = [t.get_window_extent(renderer) for t in labels]
        strip = ax_state.get_window_extent(renderer)
        for i, a in enumerate(boxes):
            assert _inside(a, strip), (labels[i].get_text(), a, strip)
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)
        legend = ax_legend.get_window_extent(renderer)
        lines = [t for t in ax_legend.texts if t.get_text()]
        assert len(lines) == len(ms)
        for n, (t, m) in enumerate(zip(lines, ms, strict=True), start=1):
            assert t.get_text().split()[0] == str(n) and m.label[:20] in t.get_text()
            assert _inside(t.get_window_extent(renderer), legend), t.get_text()
    finally:
        plt.close(fig)


def test_every_label_is_inside_its_panel(tmp_path):
    """A long peak source ("measured:cpu-matmul") no longer runs the MFU label past its panel;
    each panel's y label spans no more than the panel, its texts (badput numbers too) are
    inside it."""
    now = _short_run(tmp_path / "run", events=3, peak_source="measured:cpu-matmul")
    fig = build_figure(load_run(tmp_path / "run", now=now))
    try:
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            box = ax.get_window_extent(renderer)
            if ax.get_ylabel():
                y = ax.yaxis.label.get_window_extent(renderer)
                assert y.y0 >= box.y0 - 1 and y.y1 <= box.y1 + 1, (ax.get_ylabel(), y, box)
            for t in ax.texts:
                if t.get_text():
                    assert _inside(t.get_window_extent(renderer), box), t.get_text()
        assert any("measured:cpu-matmul" in ax.get_title(loc="left") for ax in fig.axes)
    finally:
        plt.close(fig)


def _line(ax, label):
    lines = [ln for ln in ax.get_lines() if ln.get_label() == label]
    assert len(lines) == 1, [ln.get_label() for ln in ax.get_lines()]
    return lines[0]


def test_loss_and_eval_loss_are_drawn_by_wall_time_and_by_training_step(tmp_path):
    """The eval loss is on the loss panel at its wall time; a panel by training step holds the
    train loss at every step and the eval loss at the steps it was taken."""
    now = _short_run(tmp_path / "run", events=0, evals=True)
    fig = build_figure(load_run(tmp_path / "run", now=now))
    try:
        ax_loss, ax_by_step = fig.axes[0], fig.axes[5]
        timed = _line(ax_loss, "eval loss")
        assert list(timed.get_xdata()) == pytest.approx([10.2, 15.2, 20.2, 25.2])
        assert ax_by_step.get_xlabel() == "training step"
        assert list(_line(ax_by_step, "inc 0").get_xdata()) == list(range(1, 41))
        by_step = _line(ax_by_step, "eval loss")
        assert list(by_step.get_xdata()) == [10, 20, 30, 40]
        assert list(by_step.get_ydata()) == pytest.approx([3.5, 3.0, 2.5, 2.0])
    finally:
        plt.close(fig)

