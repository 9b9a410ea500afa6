"""The data position in every tier (issue 31, item 2; ``workers/task/data_state.py``): what
each tier records, what a restore checks and reports, the iterator state of a stateful source
and its refusal of a resize. The cluster runs of tests/tasks/test_user_task_cluster.py show the
records through real recoveries; here the rules, and one Trainer's round trips (Orbax item, RAM
copy) in a plain process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

from orchestrator.shared.errors import DataError
from tests.input.conftest import make_dataset
from workers.task import data_state


@dataclass(frozen=True)
class _Pos:
    epoch: int
    index: int
    records: int
    global_batch: int


class _StepSource:
    """A random-access source: 10 records, 4 per step."""

    def position(self, step: int) -> _Pos:
        epoch, index = divmod(step * 4, 10)
        return _Pos(epoch, index, 10, 4)


class _Stream:
    def __init__(self, cursor: int = 0, reshardable: bool = False) -> None:
        self.cursor, self.reshardable, self.got = cursor, reshardable, None

    def state(self) -> dict:
        return {"cursor": self.cursor}

    def set_state(self, states, *, process_index, process_count) -> None:
        self.got = (states, process_index, process_count)


def test_a_step_source_records_its_position_and_resumes_from_it():
    rec = data_state.record(_StepSource(), 7, process_index=0, process_count=2)
    assert rec == {"format": 1, "kind": "step", "step": 7, "processes": 2, "epoch": 2,
                   "index": 8, "records": 10, "global_batch": 4}
    where = data_state.resume(_StepSource(), rec, step=7, tier="ram", process_index=0,
                              process_count=1)  # another number of processes: the same order
    assert where == {"tier": "ram", "step": 7, "kind": "step", "recorded": True,
                     "processes_now": 1, "processes": 2, "epoch": 2, "index": 8,
                     "records": 10, "global_batch": 4}


def test_a_tier_without_a_record_is_reported_as_such_and_a_fresh_start_as_the_seed():
    where = data_state.resume(_StepSource(), None, step=5, tier="durable", process_index=0,
                              process_count=1)
    assert (where["recorded"], where["step"], where["epoch"]) == (False, 5, 2)
    fresh = data_state.resume(_StepSource(), None, step=None, tier="durable", process_index=0,
                              process_count=1)
    assert (fresh["tier"], fresh["step"], fresh["recorded"]) == ("seed", 0, False)


def test_a_record_of_another_step_than_the_state_is_refused():
    rec = data_state.record(_StepSource(), 6, process_index=0, process_count=1)
    with pytest.raises(DataError, match="train state of step 7 but the data position of step 6"):
        data_state.resume(_StepSource(), rec, step=7, tier="durable", process_index=0,
                          process_count=1)


def test_copies_make_one_record_with_every_source_iterator_state():
    recs = {i: data_state.record(_Stream(cursor=10 + i), 3, process_index=i, process_count=2)
            for i in (1, 0)}
    merged = data_state.from_copies(recs)
    assert merged["kind"] == "iterator" and merged["iterators"] == [{"cursor": 10},
                                                                     {"cursor": 11}]
    assert "iterator" not in merged and "process_index" not in merged
    assert data_state.from_copies({0: recs[0], 1: None}) is None  # a copy without a record
    other = data_state.record(_Stream(), 4, process_index=1, process_count=2)
    with pytest.raises(DataError, match="disagree"):
        data_state.from_copies({0: recs[0], 1: other})


def test_an_iterator_state_comes_back_on_a_restore_of_the_same_shape():
    saved = data_state.record(_Stream(), 3, process_index=0, process_count=2,
                              iterators=[{"cursor": 12}, {"cursor": 13}])
    stream = _Stream()
    where = data_state.resume(stream, saved, step=3, tier="durable", process_index=1,
                              process_count=2)
    assert stream.got == ([{"cursor": 12}, {"cursor": 13}], 1, 2)
    assert (where["kind"], where["iterators"], where["recorded"]) == ("iterator", 2, True)


def test_an_iterator_that_cannot_be_resharded_refuses_a_resize_with_the_reason():
    saved = data_state.record(_Stream(), 3, process_index=0, process_count=2,
                              iterators=[{"cursor": 12}, {"cursor": 13}])
    stream = _Stream()
    with pytest.raises(DataError) as err:
        data_state.resume(stream, saved, step=3, tier="ram", process_index=0, process_count=1)
    text = str(err.value)
    assert "written by 2 processes and this group has 1" in text
    assert "cannot re-shard" in text and "controller.elastic.enabled=false" in text
    assert stream.got is None, "nothing was handed to the source"
    able = _Stream(reshardable=True)
    data_state.resume(able, saved, step=3, tier="ram", process_index=0, process_count=1)
    assert able.got == ([{"cursor": 12}, {"cursor": 13}], 0, 1)


def test_an_iterator_source_refuses_a_tier_without_its_state():
    with pytest.raises(DataError, match="holds no data iterator state"):
        data_state.resume(_Stream(), None, step=3, tier="copy", process_index=0,
                          process_count=1)
    step_only = data_state.record(_StepSource(), 3, process_index=0, process_count=1)
    with pytest.raises(DataError, match="holds no data iterator state"):
        data_state.resume(_Stream(), step_only, step=3, tier="durable", process_index=0,
                          process_count=1)


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.tasks.data_position_run", *args],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_trainer_writes_the_position_into_orbax_and_its_ram_copy_and_restores_it(tmp_path):
    """text_lm on prepared data: the Orbax ``data`` item and the copy's layout hold step 3's
    position; each restore reports it as recorded; a copy without one says so."""
    out = _run("--data", make_dataset(tmp_path, "bin", chars=6_000))
    assert out["seed"]["tier"] == "seed"
    item = out["orbax_item"]
    assert (item["kind"], item["step"], item["processes"]) == ("step", 3, 1)
    for tier in ("durable", "ram"):
        where = out[tier]["where"]
        assert out[tier]["step"] == 3
        assert {k: where[k] for k in ("tier", "step", "recorded", "epoch", "index")} == {
            "tier": tier, "step": 3, "recorded": True, "epoch": item["epoch"],
            "index": item["index"]}, where
    assert out["ram_without_record"]["where"]["recorded"] is False


def test_a_stateful_source_gets_its_iterator_state_back_from_every_tier():
    """The stream's cursor after 3 steps of 4 rows travels in the Orbax item and the RAM copy
    and is handed back on each restore; a copy without it is refused, not read in another
    order."""
    out = _run("--stateful")
    assert out["saved_cursor"] == 12
    assert out["orbax_item"]["iterators"] == [{"cursor": 12}]
    for tier in ("durable", "ram"):
        assert out[tier]["cursor"] == 12, out[tier]
        assert out[tier]["where"]["kind"] == "iterator"
    assert "holds no data iterator state" in out["ram_without_record"]["error"]


# ---- the cluster tests' checker (tests/tasks/sample_order.py) can fail -----------------------

def _trace(*groups: tuple[float, range]) -> list[dict]:
    """Reads of 2 rows per step (B = 2), each group at its own time."""
    return [{"step": s, "rows": [0, 2], "ids": [10 * s, 10 * s + 1], "t": t + s / 100}
            for t, steps in groups for s in steps]


def _timeline(*restores: tuple[float, int]) -> list[dict]:
    return [{"prev": None, "state": "PLANNING", "at": 0.0}] + [
        {"prev": "RESTORING", "state": "COMPILING", "at": at,
         "payload": {"restored_step": step or None, "data": {"step": step}}}
        for at, step in restores]


def test_the_sample_order_checker_passes_a_clean_resume_and_catches_a_skip_or_a_repeat():
    from tests.tasks import sample_order

    runs = sample_order.resumed_runs(_trace((1, range(0, 7)), (11, range(5, 10))),
                                     _timeline((0.5, 0), (10.5, 5)))
    sample_order.check_resumed(runs, total_steps=10)  # steps 5, 6 read again: rolled back
    late = sample_order.resumed_runs(_trace((1, range(0, 7)), (11, range(6, 10))),
                                     _timeline((0.5, 0), (10.5, 5)))
    with pytest.raises(AssertionError, match="resumed at step 5 but the group read steps"):
        sample_order.check_resumed(late, total_steps=10)  # step 5 of the new line skipped
    early = sample_order.resumed_runs(_trace((1, range(0, 7)), (11, range(4, 10))),
                                      _timeline((0.5, 0), (10.5, 5)))
    with pytest.raises(AssertionError, match="resumed at step 5"):
        sample_order.check_resumed(early, total_steps=10)  # step 4 trained twice
    wrong = _trace((1, range(0, 10)))
    wrong[3]["ids"] = [99, 98]
    got = sample_order.consumed(wrong, global_batch=2)
    assert got != sample_order.consumed(_trace((1, range(0, 10))), global_batch=2)
