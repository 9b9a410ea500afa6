"""The host actor's contract, on real JAX and Orbax in one process with 4 CPU devices.

One subprocess (``host_scenarios``) runs every scenario with the real ``HostActor`` class (what
Ray wraps) and records what it saw; each test checks one part of the contract. The parts that
need several processes (a stop across hosts, the Ray queue sink) are in
``test_host_cluster.py``; a corrupt shard on one host of two, end to end, in
``tests/faults/test_group_faults.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("host") / "scenarios.json"
    proc = subprocess.run([sys.executable, "-m", "tests.workers.host_scenarios", "--out",
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def scenario(seen: dict, name: str) -> dict:
    got = seen[name]
    assert "error" not in got, got.get("error")
    return got


# ---- saves and commits -----------------------------------------------------------------------

def test_a_save_held_in_flight_is_never_reported_committed(seen):
    """Orbax lists step 2 as soon as its save starts; committed_step and checkpoint_steps don't."""
    held = scenario(seen, "commit")["held"]
    assert held["orbax_in_progress"] and held["orbax_all_steps"] == [2]
    assert held["orbax_latest_step"] == 2  # Orbax's own view counts the started save
    assert held["result"]["committed_step"] is None
    assert held["checkpoint_steps"] == []
    assert held["dirs"] == ["2.orbax-checkpoint-tmp"]


def test_released_save_commits_and_save_reports_its_commit(seen):
    got = scenario(seen, "commit")
    assert got["save_after_release"]["step"] == 3
    assert got["save_after_release"]["committed_step"] == 3
    assert got["after_release_steps"] == [2, 3]


def test_saves_only_at_the_steps_the_driver_gives(seen):
    """No modulo on the host: saves exactly after steps 2 (chunk 1) and 5, 7 (chunk 2)."""
    got = scenario(seen, "commit")
    records = got["held"]["result"]["records"] + got["second"]["records"]
    assert [r["step"] for r in records if r["saved"]] == [2, 5, 7]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert got["final_steps"] == [2, 3, 5, 7]
    # a chunk's committed_step is a step whose save finished: 3 (5 or 7 may still be writing)
    assert got["second"]["committed_step"] in (3, 5, 7)


def test_saving_a_step_twice_is_one_save(seen):
    """run_steps saved step 2; save() at step 2 adds nothing and reports step 2 committed."""
    twice = scenario(seen, "commit")["again_same_step"]
    assert twice["run"] is True
    assert twice["save"]["step"] == 2 and twice["save"]["committed_step"] == 2
    assert twice["dirs"] == ["2"]


# ---- stopping a chunk ------------------------------------------------------------------------

def test_stop_requested_before_its_chunk_started_stops_it_at_that_step(seen):
    got = scenario(seen, "stop")
    assert got["early_request_returned"] == 0
    assert got["chunk1"] == {"step": 2, "stopped_early": True, "n_records": 2, "first": 1}


def test_stop_for_an_old_chunk_is_ignored(seen):
    """Chunk 1's stop arriving after chunk 1 ended does not touch chunk 2, which runs to 4."""
    got = scenario(seen, "stop")
    assert got["stale_request_returned"] == 2
    assert got["chunk2"] == {"step": 4, "stopped_early": False, "n_records": 2, "first": 3}


def test_stop_mid_chunk_lands_within_one_step(seen):
    """A stop sent from another thread mid-chunk (plus a late one for chunk 2, ignored) stops
    chunk 3 at the requested step, or one step after the step seen when it arrived."""
    got = scenario(seen, "stop")
    at, seen_at_request = got["mid"]["at"], got["mid"]["returned"]
    stopped = got["chunk3"]["step"]
    assert got["chunk3"]["stopped_early"]
    assert at <= stopped <= max(at, seen_at_request + 1)
    assert got["current_after"] == stopped
    assert stopped < 500


# ---- restore: corrupt and half-written checkpoints -------------------------------------------

CORRUPTIONS = ["truncate", "no_marker", "garble", "bad_run_meta", "bad_step_meta",
               "driver_skip"]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_damaged_latest_step_falls_back_to_the_previous_one(seen, kind):
    """Step 6 truncated / without commit marker / garbled / with unreadable metadata / skipped
    by the driver: step 4 is restored, 6 is moved aside whole (not deleted), 2 and 4 are
    untouched, and training continues with the uninterrupted run's exact losses."""
    got = scenario(seen, "corrupt")
    v = got[kind]
    assert v["restore"]["restored_step"] == 4 and v["restore"]["step"] == 4
    assert [(s["step"], s["moved_to"]) for s in v["restore"]["skipped"]] == [(6, "6.corrupt-1")]
    assert v["restore"]["skipped"][0]["reason"]
    assert v["dirs"] == ["2", "4", "6.corrupt-1"]
    assert v["older_intact"]
    expected_files = set(v["before_files"]) - ({"commit_success.txt"} if kind == "no_marker"
                                               else set())
    assert set(v["moved_files"]) == expected_files | {"MOVED_ASIDE_REASON.txt"}
    assert v["continued_losses"] == got["base_losses"][4:6]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_later_save_at_the_moved_step_is_not_skipped(seen, kind):
    v = scenario(seen, "corrupt")[kind]
    assert v["continued_saved"] == [False, True]
    assert v["save"]["committed_step"] == 6
    assert v["steps_after"] == [2, 4, 6]


def test_the_new_step_restores_afterwards(seen):
    v = scenario(seen, "corrupt")["truncate"]
    assert v["restore_again"]["restored_step"] == 6 and v["restore_again"]["skipped"] == []


def test_every_step_unreadable_starts_from_the_seed_without_deleting(seen):
    v = scenario(seen, "corrupt")["all_bad"]
    assert v["restore"]["restored_step"] is None and v["restore"]["step"] == 0
    assert [s["step"] for s in v["restore"]["skipped"]] == [6, 4, 2]
    assert v["dirs"] == ["2.corrupt-1", "4.corrupt-1", "6.corrupt-1"]


def test_foreign_directory_and_other_model_are_refused_untouched(seen):
    got = scenario(seen, "refuse")
    foreign, other = got["foreign"], got["other_model"]
    assert foreign["raised"] == other["raised"] == "CheckpointError"
    assert not foreign["retryable"] and not other["retryable"]
    assert "not written by Orbax" in foreign["message"] and "run.run_dir" in foreign["fix"]
    assert "another task" in other["message"] and "model.*" in other["fix"]
    assert foreign["untouched"] and other["untouched"]


# ---- the rest -----------------------------------------------------------------------------------

def test_a_host_ref_instead_of_a_spec_is_refused_with_the_fix(seen):
    got = scenario(seen, "not_a_spec")
    assert got["raised"] and "HostSpec.for_host" in got["raised"]


def test_learning_rate_comes_from_the_jitted_step(seen):
    got = scenario(seen, "lr")
    assert got["got"] == got["expected"]
    assert got["got"][0] == 0.0 and got["got"][2] > got["got"][1] > 0
