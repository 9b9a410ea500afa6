"""The soak's pure parts (bench/soak_plan.py): the seeded schedule, and the invariants on
synthetic histories. No cluster."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np

from bench.soak import compare_npz, corrupt_newest, overrides, steps_for
from bench.soak_plan import (
    KINDS,
    Life,
    LifePlan,
    check_causes,
    check_faults_recovered,
    check_no_leftovers,
    check_succeeded,
    check_summaries,
    check_time_bounds,
    draw_plan,
    fault_counts,
    first_failing_life,
    match_faults,
    state_maxima,
)


def test_the_same_seed_draws_the_same_plan_and_another_seed_another():
    assert draw_plan(7, 4, 200) == draw_plan(7, 4, 200)
    assert draw_plan(7, 4, 200) != draw_plan(8, 4, 200)


def test_enough_draws_cover_every_kind_and_both_driver_signals():
    plans = [draw_plan(s, 10, 600) for s in range(40)]
    kinds = Counter(f.kind for p in plans for f in p.faults)
    assert set(kinds) == set(KINDS)
    assert {lp.external for p in plans for lp in p.lives} == {"sigkill", "sigterm", "none"}
    assert any(lp.corrupt_after for p in plans for lp in p.lives)


def test_a_plan_is_valid_chaos_and_ends_with_a_life_let_finish():
    for seed in range(30):
        p = draw_plan(seed, 4, 200)
        keys = [(f.at_step, f.host, f.chaos_kind()) for f in p.faults]
        assert len(keys) == len(set(keys))
        assert all(10 <= f.at_step < 195 and 0 <= f.host < 4 for f in p.faults)
        assert sum(f.kind == "unhealthy" for f in p.faults) <= 1
        assert p.lives[-1] == LifePlan(external="none")
        assert [f.at_step for f in p.faults] == sorted(f.at_step for f in p.faults)


def test_some_faults_come_in_close_pairs():
    faults = [draw_plan(s, 10, 600).faults for s in range(20)]
    pairs = sum(b.at_step - a.at_step <= 3 for fs in faults
                for a, b in itertools.pairwise(fs))
    assert pairs >= 5


def test_the_command_line_sets_the_chaos_and_a_fixed_mesh():
    p = draw_plan(3, 4, steps_for(4))
    args = overrides(p)
    assert "controller.elastic.min_slices=2" in args
    assert any(a.startswith("controller.chaos=[{at_step: ") for a in args)
    assert not any(a.startswith("controller.chaos") for a in overrides(p, faults=False))


def _life(index=0, external="none", *, summary=None, fired=(), transitions=(), sent=None,
          exit_code=0, leftovers=()):
    return Life(index=index, plan=LifePlan(external=external), started_at=100.0,
                exit_code=exit_code, external_at=sent, wrote_summary=summary is not None,
                summary=summary or {}, fired=list(fired), transitions=list(transitions),
                leftovers=list(leftovers))


KILL = {"event": "chaos_armed", "kind": "kill", "host": 1, "step": 20, "at": 110.0}
NOTICE = {"event": "chaos_notice", "kind": "preemption_notice", "host": "emu-slice-0-w1",
          "step": 30, "at": 120.0}


def test_fired_faults_match_their_recoveries():
    s = {"recoveries": [{"kind": "unannounced", "cause": "host_lost", "started_at": 111.0},
                        {"kind": "announced", "event_id": "chaos-30-1-preemption_notice",
                         "started_at": 120.0}]}
    m = match_faults(_life(summary=s, fired=[KILL, NOTICE]))
    assert len(m["matched"]) == 2 and not m["unmatched"]
    assert check_faults_recovered([_life(summary=s, fired=[KILL, NOTICE])]).ok


def test_a_fault_with_no_recovery_fails_naming_its_life():
    s = {"recoveries": [{"kind": "announced", "event_id": "chaos-99-1-preemption_notice",
                         "started_at": 130.0}]}
    lives = [_life(0, summary={"recoveries": []}), _life(1, summary=s, fired=[NOTICE])]
    c = check_faults_recovered(lives)
    assert not c.ok and c.first_life == 1 and "preemption_notice" in c.detail


def test_a_second_failure_inside_a_recovery_counts_as_its_further_failure():
    kill2 = {**KILL, "host": 2, "step": 21, "at": 110.5}
    s = {"recoveries": [{"kind": "unannounced", "started_at": 111.0,
                         "further_failures": [{"cause": "host_lost", "at": 112.0}]}]}
    assert check_faults_recovered([_life(summary=s, fired=[KILL, kill2])]).ok
    one = {"recoveries": [{"kind": "unannounced", "started_at": 111.0}]}
    ended = [{"state": "RELEASING", "prev": "RUNNING", "at": 111.0}]
    # the second armed fault went with its group (a RELEASING after its arming): not fired
    m = match_faults(_life(summary=one, fired=[KILL, kill2], transitions=ended))
    assert len(m["not_fired"]) == 1 and not m["unmatched"]
    m = match_faults(_life(summary=one, fired=[KILL, kill2]))
    assert len(m["unmatched"]) == 1


def test_a_sigkilled_life_needs_no_summary_but_others_do():
    killed = _life(0, "sigkill", sent=150.0, exit_code=-9, fired=[KILL])
    assert check_summaries([killed, _life(1, summary={"state": "SUCCEEDED"})]).ok
    assert match_faults(killed)["unverifiable"] == [KILL]
    c = check_summaries([_life(0, "sigterm", sent=150.0, exit_code=143), _life(1, summary={})])
    assert not c.ok and c.first_life == 0


def test_success_needs_the_last_life_at_total_steps():
    good = _life(summary={"state": "SUCCEEDED", "step": 200})
    assert check_succeeded([good], 200).ok
    assert not check_succeeded([_life(summary={"state": "SUCCEEDED", "step": 150})], 200).ok
    assert not check_succeeded([_life(summary={"state": "FAILED", "step": 200},
                                      exit_code=1)], 200).ok


def test_leftovers_fail_in_the_life_they_outlived():
    c = check_no_leftovers([_life(0), _life(1, leftovers=["raylet --x"])])
    assert not c.ok and c.first_life == 1


def test_time_bounds_and_the_maximum_per_state():
    ok = [{"state": "FORMING", "prev": "RELEASING", "at": 1, "prev_duration_s": 5.0},
          {"state": "RESTORING", "prev": "FORMING", "at": 2, "prev_duration_s": 40.0}]
    slow = [{"state": "FORMING", "prev": "RELEASING", "at": 1, "prev_duration_s": 6.5,
             "step": 40}]
    lives = [_life(0, transitions=ok), _life(1, transitions=slow)]
    checks = {c.name: c for c in check_time_bounds(lives, init_s=20)}
    assert checks["forming_bounded"].ok
    assert not checks["releasing_bounded"].ok and checks["releasing_bounded"].first_life == 1
    assert state_maxima(lives)["RELEASING"]["max_s"] == 6.5
    assert first_failing_life(list(checks.values())) == 1
    assert not check_time_bounds([_life(transitions=[
        {"state": "RESTORING", "prev": "FORMING", "at": 2, "prev_duration_s": 51.0}])],
        init_s=20)[1].ok


def test_parameters_compare_bit_for_bit(tmp_path):
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.zeros(3, np.float32)}
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **a)
    assert compare_npz(tmp_path / "a.npz", tmp_path / "b.npz").startswith("equal")
    bumped = np.array([1.0, np.nextafter(np.float32(2), np.float32(3))], np.float32)
    np.savez(tmp_path / "c.npz", **{**a, "w": bumped})
    assert "w differs in 1 of 2" in compare_npz(tmp_path / "a.npz", tmp_path / "c.npz")


def test_an_unmatched_fault_says_why_from_the_history():
    stopped = [{"state": "DRAINING", "prev": "RUNNING", "at": 121.0},
               {"state": "STOPPED", "prev": "WAITING_FOR_CAPACITY", "at": 130.0}]
    first = _life(0, "sigterm", sent=129.0, exit_code=143, summary={"recoveries": []},
                  fired=[NOTICE], transitions=stopped)
    again = {**NOTICE, "host": "emu-slice-0-w0", "at": 220.0}
    resumed = [{"state": "RUNNING", "prev": "COMPILING", "at": 219.0},
               {"state": "SUCCEEDED", "prev": "CHECKPOINTING", "at": 260.0}]
    second = _life(1, summary={"recoveries": []}, fired=[again], transitions=resumed)
    c = check_faults_recovered([first, second])
    assert not c.ok and c.first_life == 0
    assert "recovery still open" in c.detail and "dedupe window" in c.detail


def test_fault_counts_say_how_each_firing_ended():
    plan = draw_plan(1, 4, 200)
    kill = next(f for f in plan.faults if f.kind == "kill")
    fired = {**KILL, "host": kill.host, "step": kill.at_step, "soak_kind": "kill"}
    s = {"recoveries": [{"kind": "unannounced", "started_at": 111.0}]}
    counts = fault_counts(plan, [_life(summary=s, fired=[fired]),
                                 _life(1, "sigkill", sent=1.0, fired=[fired])])
    assert counts["kill"]["fired"] == 2
    assert counts["kill"]["matched"] == 1 and counts["kill"]["unverifiable"] == 1


def test_a_fault_that_struck_but_left_no_recovery_record_is_unmatched():
    """seed 50, life 0: a hang timed out, then SIGTERM stopped the run before its recovery
    closed; the timeline shows the failure, summary.json no recovery."""
    hang = {"event": "chaos_armed", "kind": "hang", "host": 2, "step": 75, "at": 110.0}
    tl = [{"state": "RELEASING", "prev": "RUNNING", "at": 160.0,
           "reason": "timeout: step did not finish within 50s on hosts [2]"},
          {"state": "STOPPED", "prev": "RELEASING", "at": 160.1, "reason": "stopped by SIGTERM"}]
    m = match_faults(_life(0, "sigterm", sent=160.0, exit_code=143,
                           summary={"recoveries": []}, fired=[hang], transitions=tl))
    assert m["unmatched"] == [hang] and not m["not_fired"]


def test_causes_flag_a_hang_charged_as_an_application_error_and_a_corrupt_checkpoint():
    def failing(reason):
        return _life(transitions=[{"state": "RELEASING", "prev": "RUNNING", "at": 1.0,
                                   "reason": reason}])

    assert check_causes([failing("timeout: step did not finish within 50s on hosts [2]"),
                         failing("host_lost: host(s) [2] died"),
                         _life(transitions=[{"state": "RELEASING", "prev": "CHECKPOINTING",
                                             "at": 2.0, "reason": "step 5 copied"}])]).ok
    gloo = failing("application_error: host(s) [3]: JaxRuntimeError: UNKNOWN: Gloo context "
                   "initialization failed: DEADLINE_EXCEEDED")
    assert not check_causes([gloo]).ok
    assert not check_causes([failing("host_lost: checkpoint step 220 is unreadable")]).ok


def _committed(root, step):
    d = root / str(step)
    (d / "state" / "ocdbt.process_1" / "d").mkdir(parents=True)
    (d / "state" / "ocdbt.process_1" / "d" / "x").write_bytes(b"0123456789")
    (d / "commit_success.txt").write_text("ok")
    (d / "_CHECKPOINT_METADATA").write_text("{}")


def _copy(root, step):
    d = root / str(step) / "source-1" / "data" / "d"
    d.mkdir(parents=True)
    (d / "y").write_bytes(b"0123456789")
    (root / str(step) / "COMPLETE").write_text("")


def test_corrupt_newest_truncates_the_newer_tier(tmp_path):
    _committed(tmp_path / "checkpoints", 10)
    _copy(tmp_path / "checkpoints-from-ram", 15)
    assert corrupt_newest(tmp_path) == ["checkpoints-from-ram/15/source-1/data/d/y"]
    assert (tmp_path / "checkpoints/10/state/ocdbt.process_1/d/x").stat().st_size == 10
    _committed(tmp_path / "checkpoints", 20)
    assert corrupt_newest(tmp_path) == ["checkpoints/20/state/ocdbt.process_1/d/x"]
    assert (tmp_path / "checkpoints/20/state/ocdbt.process_1/d/x").stat().st_size == 5
    assert corrupt_newest(tmp_path / "empty") == []


def test_a_life_killed_at_the_soaks_bound_needs_no_summary():
    assert check_summaries([_life(0, exit_code=None)]).ok
