"""Classifying step directories on disk and moving bad ones aside (pure file logic; the same
cases against real Orbax checkpoints are in test_host_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.shared import layout
from orchestrator.shared.layout import StepState


def _step(root: Path, step: int, *, marker: bool = True, step_meta: str | None = "{}",
          items: bool = True) -> Path:
    d = root / str(step)
    d.mkdir(parents=True)
    if marker:
        (d / layout.COMMIT_MARKER).write_text("ok")
    if step_meta is not None:
        (d / layout.STEP_METADATA).write_text(step_meta)
    if items:
        (d / "state").mkdir()
        (d / "meta").mkdir()
        (d / "meta" / "metadata").write_text(json.dumps({"step": step}))
    return d


def test_states(tmp_path):
    _step(tmp_path, 2)
    _step(tmp_path, 4, marker=False)
    _step(tmp_path, 6, step_meta='{"trunc')
    _step(tmp_path, 8, marker=False, step_meta=None, items=False)
    (tmp_path / "8" / "state").mkdir()
    (tmp_path / "10.orbax-checkpoint-tmp").mkdir()
    (tmp_path / "3.corrupt-1").mkdir()
    got = {d.step: d.state for d in layout.scan(tmp_path)}
    assert got == {2: StepState.COMMITTED, 4: StepState.UNCOMMITTED, 6: StepState.DAMAGED,
                   8: StepState.FOREIGN}
    assert layout.committed_steps(tmp_path) == [2]
    assert layout.is_committed(tmp_path, 2) and not layout.is_committed(tmp_path, 4)
    assert not layout.is_committed(tmp_path, 10)


def test_steps_sort_numerically(tmp_path):
    for s in (100, 20, 3):
        _step(tmp_path, s)
    assert layout.committed_steps(tmp_path) == [3, 20, 100]


def test_move_aside_keeps_everything_and_frees_the_name(tmp_path):
    d = _step(tmp_path, 6)
    (d / "state" / "blob").write_bytes(b"x" * 100)
    first = layout.move_aside(d, "truncated array")
    assert first.name == "6.corrupt-1" and not d.exists()
    assert (first / "state" / "blob").read_bytes() == b"x" * 100
    assert (first / layout.REASON_FILE).read_text().strip() == "truncated array"
    again = _step(tmp_path, 6)
    second = layout.move_aside(again, "again")
    assert second.name == "6.corrupt-2"
    assert [p.name for p in layout.moved_aside(tmp_path)] == ["6.corrupt-1", "6.corrupt-2"]
    assert layout.scan(tmp_path) == []


def test_read_run_meta_errors_are_value_errors(tmp_path):
    d = _step(tmp_path, 2)
    assert layout.read_run_meta(d) == {"step": 2}
    (d / "meta" / "metadata").write_text('{"step": ')
    with pytest.raises(ValueError, match="unreadable"):
        layout.read_run_meta(d)


def test_missing_root_is_empty(tmp_path):
    assert layout.scan(tmp_path / "nope") == [] and layout.committed_steps(tmp_path / "x") == []
