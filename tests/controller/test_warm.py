"""What the controller tells the seam about warm processes (``controller.warm``): which spare
hosts to keep a standby on, and when a drained group's processes may be kept for the next."""

from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError
from tests.controller.fakes import lost
from tests.controller.harness import make

COLD = "controller.warm.standby_slices=0"
"""The opt-out: no standby on the spares (the replacement starts cold or warms in a handover)."""


def test_standby_hosts_are_the_first_spare_slices_and_never_the_mesh(tmp_path):
    sim = make(tmp_path, "controller.warm.standby_slices=1", spare=("s1", "s2"))
    sim.fleet.on_step(7, lambda g: sim.notice(host=None))  # the whole mesh is doomed
    assert sim.run().state == "SUCCEEDED"
    first, second = sim.fleet.groups
    assert {h.slice_name for h in first.spec.standby} == {"s1"}
    assert len(first.spec.standby) == 2  # both hosts of the spare slice
    # the re-form took s1; the next spare not doomed is s2 (s0 is excluded for good)
    assert {h.slice_name for h in second.spec.plan.hosts} == {"s1"}
    assert {h.slice_name for h in second.spec.standby} == {"s2"}


def test_every_spare_slice_keeps_a_standby_by_default_and_zero_opts_out(tmp_path):
    sim = make(tmp_path / "auto", spare=("s1", "s2"))
    assert sim.run().state == "SUCCEEDED"
    assert {h.slice_name for h in sim.fleet.groups[0].spec.standby} == {"s1", "s2"}
    sim = make(tmp_path / "one", "controller.warm.standby_slices=1", spare=("s1", "s2"))
    assert sim.run().state == "SUCCEEDED"
    assert {h.slice_name for h in sim.fleet.groups[0].spec.standby} == {"s1"}
    sim = make(tmp_path / "off", COLD, spare=("s1",))
    assert sim.run().state == "SUCCEEDED"
    assert sim.fleet.groups[0].spec.standby == ()


def test_processes_may_be_kept_whenever_a_re_form_follows(tmp_path):
    """Announced drain → re-form and a host lost → re-form: keep_processes (the seam keeps what
    it can warm: survivors); the run's end: nothing is kept."""
    sim = make(tmp_path, "run.total_steps=30", spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1"))
    sim.fleet.on_step(17, lambda g: lost())
    assert sim.run().state == "SUCCEEDED"
    kept = [g.kept_processes for g in sim.fleet.groups]
    assert kept == [[True], [True], [False]]


def test_the_seam_is_told_which_nodes_the_notice_dooms_when_it_releases_the_group(tmp_path):
    """A notice for a host dooms its node: the group's release names it (the Ray seam kills,
    rather than parks, a group whose every node is doomed); a loss dooms none."""
    sim = make(tmp_path, "run.total_steps=30", spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1"))
    sim.fleet.on_step(17, lambda g: lost())
    assert sim.run().state == "SUCCEEDED"
    first, second, _ = sim.fleet.groups
    assert first.doomed_at_shutdown == [frozenset({"s0-h1"})]
    assert second.doomed_at_shutdown == [frozenset()]


def test_an_operator_stop_keeps_no_process(tmp_path):
    sim = make(tmp_path, "run.total_steps=100")
    sim.fleet.on_step(12, lambda g: sim.notice("operator_stop", deadline_in=None))
    assert sim.run().state == "STOPPED"
    assert sim.fleet.groups[0].kept_processes == [False]


def test_recoveries_say_how_the_next_group_got_its_processes(tmp_path):
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1"))
    summary = sim.run()
    assert [f["incarnation"] for f in summary.forms] == [1, 2]
    assert summary.recoveries[0]["processes"] == summary.forms[1]["processes"]


@pytest.mark.parametrize("override, fix", [
    ("controller.warm.standby_slices=-1", "spare slices"),
    ("controller.warm.reuse_processes=maybe", "one of"),
])
def test_bad_warm_settings_name_the_fix(override, fix):
    with pytest.raises(ConfigError, match=fix):
        load_config(None, [override])


def test_a_failed_host_is_replaced_by_the_warm_standby_at_once(tmp_path):
    """Host 2 (slice s1) dies with a standby warm on s2: no backoff, the next mesh is s0 + s2,
    and s1 (its node still up) becomes the spare that gets the next standby."""
    sim = make(tmp_path, "cluster.emulate.slices=2", "controller.warm.standby_slices=1",
               slices=("s0", "s1"), spare=("s2",))
    sim.fleet.on_step(7, lambda g: lost(hosts=(2,)))
    assert sim.run().state == "SUCCEEDED"
    first, second = sim.fleet.groups
    assert {h.slice_name for h in first.spec.standby} == {"s2"}
    assert {h.slice_name for h in second.spec.plan.hosts} == {"s0", "s2"}
    assert {h.slice_name for h in second.spec.standby} == {"s1"}
    assert "BACKOFF" not in sim.states()


def test_without_a_standby_the_failed_slice_is_re_formed_after_backoff(tmp_path):
    sim = make(tmp_path, COLD, "cluster.emulate.slices=2", slices=("s0", "s1"), spare=("s2",))
    sim.fleet.on_step(7, lambda g: lost(hosts=(2,)))
    assert sim.run().state == "SUCCEEDED"
    assert {h.slice_name for h in sim.fleet.groups[1].spec.plan.hosts} == {"s0", "s1"}
    assert "BACKOFF" in sim.states()


def test_a_drain_with_the_ram_tier_hands_over_in_ram_and_persists_after(tmp_path):
    """Time for a durable save, the RAM tier on with durable_from_ram: the drain copies the
    step to the holders and asks them to persist it (no device save in the downtime); the
    final save at the end is still a device save."""
    sim = make(tmp_path, "checkpoint.ram.enabled=true", "cluster.emulate.slices=2",
               "controller.checkpoint_interval.every_steps=100", slices=("s0", "s1"),
               spare=("s2",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    drained = sim.fleet.ram_copies
    assert len(drained) == 1 and sim.fleet.persisted == drained  # the step the drain stopped at
    assert summary.restores[1]["restored_step"] == drained[0]


def test_without_durable_from_ram_a_drain_saves_from_the_devices(tmp_path):
    sim = make(tmp_path, "checkpoint.ram.enabled=true", "checkpoint.ram.durable_from_ram=false",
               spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1"))
    assert sim.run().state == "SUCCEEDED"
    assert sim.fleet.persisted == [] and sim.fleet.ram_copies == []


# ---- HANDING_OVER --------------------------------------------------------------------------


def test_a_notice_with_time_trains_on_while_the_replacement_warms_then_drains(tmp_path):
    """Slice s1's host is doomed 60 s ahead; the spare s2 has no standby: the run goes
    HANDING_OVER (steps go on), asks the seam to warm s2's hosts, drains once they are warm,
    and the next mesh is s0 + s2. The recovery records the handover."""
    sim = make(tmp_path, COLD, "cluster.emulate.slices=2", slices=("s0", "s1"), spare=("s2",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s1-0"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    states = sim.states()
    assert states[states.index("HANDING_OVER") + 1] == "DRAINING"
    assert sim.fleet.warmed == [["vm-s2-0", "vm-s2-1"]]
    first, second = sim.fleet.groups
    assert first.chunks[-1]["until"] > 7 + 1, "training went on while the replacement warmed"
    assert {h.slice_name for h in second.spec.plan.hosts} == {"s0", "s2"}
    rec = summary.recoveries[0]
    assert rec["handover"] == "ready" and rec["handover_s"] > 0
    drain = next(t for t in sim.controller.lifecycle.timeline if t.state.value == "DRAINING")
    assert "handover: ready" in drain.reason


def test_a_replacement_not_warm_by_the_last_safe_moment_drains_anyway_and_says_so(tmp_path):
    sim = make(tmp_path, COLD, "cluster.emulate.slices=2", "controller.warm.handover_max_s=3",
               "run.total_steps=100", slices=("s0", "s1"), spare=("s2",))
    sim.fleet.warm_after_polls = 10**9  # never warm
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s1-0"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    rec = summary.recoveries[0]
    assert rec["handover"].startswith("not ready") and 2.9 <= rec["handover_s"] <= 4.0
    drain = next(t for t in sim.controller.lifecycle.timeline if t.state.value == "DRAINING")
    assert "not ready" in drain.reason and "cold" in drain.reason


def test_a_notice_for_the_whole_mesh_with_no_spare_trains_on_until_a_slice_joins(tmp_path):
    """One slice, no spare: the notice leaves 60 s. Draining at once would only wait for
    capacity; the run trains on (HANDING_OVER with no host yet) until s1 joins, warms it up,
    drains once it is warm and re-forms on it, losing nothing."""
    sim = make(tmp_path, COLD, "run.total_steps=200")
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1"))
    sim.fleet.on_step(40, lambda g: sim.cluster.add_slice("s1"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    states = sim.states()
    assert states[states.index("HANDING_OVER") + 1] == "DRAINING"
    assert "WAITING_FOR_CAPACITY" not in states
    assert sim.fleet.warmed == [["vm-s1-0", "vm-s1-1"]]
    first, second = sim.fleet.groups
    assert first.chunks[-1]["until"] >= 40, "training went on until the slice joined"
    assert {h.slice_name for h in second.spec.plan.hosts} == {"s1"}
    assert summary.recoveries[0]["handover"] == "ready"


def test_a_notice_with_no_capacity_in_sight_drains_at_the_last_safe_moment(tmp_path):
    """No slice joins: the steps the notice allows are trained and saved at the last safe
    moment (deadline − 2 s − 2 × the expected save), then the run waits for capacity."""
    sim = make(tmp_path, COLD, "run.total_steps=400")
    sent: list[float] = []

    def notice(g):
        sent.append(sim.clock.now())
        sim.notice(host="vm-s0-1", deadline_in=10.0)

    sim.fleet.on_step(7, notice)
    sim.run()
    drain = next(t for t in sim.controller.lifecycle.timeline if t.state.value == "DRAINING")
    assert 3.0 <= drain.at - sent[0] <= 8.0, drain.at - sent[0]
    assert sim.fleet.groups[0].chunks[-1]["until"] > 30, "it did not train on"
    assert "no replacement joined" in drain.reason
    assert sim.fleet.warmed == []
    assert "WAITING_FOR_CAPACITY" in sim.states()[sim.states().index("DRAINING"):]


@pytest.mark.parametrize("why, overrides, notice", [
    ("handover off", ("controller.warm.handover_max_s=0",), {}),
    ("deadline too close", (), {"deadline_in": 3.0}),
    ("no deadline", (), {"deadline_in": None}),
])
def test_no_handover_when_it_cannot_help(tmp_path, why, overrides, notice):
    sim = make(tmp_path, "cluster.emulate.slices=2", *overrides, slices=("s0", "s1"),
               spare=("s2",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s1-0", **notice))
    assert sim.run().state == "SUCCEEDED", why
    assert "HANDING_OVER" not in sim.states() and sim.fleet.warmed == []


def test_no_handover_when_the_replacement_is_a_standby_already_or_the_run_shrinks(tmp_path):
    sim = make(tmp_path, "cluster.emulate.slices=2", "controller.warm.standby_slices=1",
               slices=("s0", "s1"), spare=("s2",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s1-0"))
    assert sim.run().state == "SUCCEEDED"
    assert "HANDING_OVER" not in sim.states()
    shrink = make(tmp_path / "shrink", "cluster.emulate.slices=2", slices=("s0", "s1"))
    shrink.fleet.on_step(7, lambda g: shrink.notice(host="vm-s1-0"))
    assert shrink.run().state == "SUCCEEDED"
    assert "HANDING_OVER" not in shrink.states()


def test_a_notice_while_the_standby_still_warms_or_pre_forms_trains_on_until_it_is_ready(
        tmp_path):
    """The spare slice has its standbys, but they are not ready yet (importing, or pre-forming
    the whole mesh: ``raygroup.preform``): training goes on (HANDING_OVER) until they are, then
    the drain; the re-form takes them. Ready at once: drain at once (the test above)."""
    sim = make(tmp_path, "run.total_steps=30", slices=("s0",), spare=("s1",))
    sim.fleet.standby_ready_after_polls = 3
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    assert ("RUNNING", "HANDING_OVER") in sim.edges()
    assert ("HANDING_OVER", "DRAINING") in sim.edges()
    assert sim.fleet.warmed == [["vm-s1-0", "vm-s1-1"]]  # the standby hosts, not new ones
    first, second = sim.fleet.groups
    assert {h.slice_name for h in second.spec.plan.hosts} == {"s1"}
    assert first.chunks[-1]["until"] > 7 + 1, "trained on while the standbys got ready"
    assert summary.recoveries[0]["handover"] == "ready"


def test_a_failure_during_the_handover_is_an_ordinary_failure(tmp_path):
    sim = make(tmp_path, COLD, "cluster.emulate.slices=2", slices=("s0", "s1"), spare=("s2",))
    sim.fleet.warm_after_polls = 10**9
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s1-0"))
    sim.fleet.on_step(9, lambda g: lost(hosts=(0,)))
    assert sim.run().state == "SUCCEEDED"
    assert ("HANDING_OVER", "RELEASING") in sim.edges()


def test_a_notice_with_an_earlier_deadline_during_the_handover_brings_the_drain_forward(
        tmp_path):
    """The handover may last 20 s, but a second notice due in 5 s arrives during it: the drain
    comes within that notice's bound (deadline − 2 s − 2 × the expected save), not 20 s later,
    and the recovery still records the handover."""
    sim = make(tmp_path, COLD, "cluster.emulate.slices=2", "run.total_steps=400",
               slices=("s0", "s1"), spare=("s2", "s3"))
    sim.fleet.warm_after_polls = 10**9
    sent: list[float] = []
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s1-0"))

    def second(g):
        sent.append(sim.clock.now())
        sim.notice(host="vm-s1-1", deadline_in=5.0)

    sim.fleet.on_step(12, second)
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and sent
    drain = next(t for t in sim.controller.lifecycle.timeline if t.state.value == "DRAINING")
    assert drain.at - sent[0] <= 3.5, drain.at - sent[0]
    assert summary.recoveries[0]["handover"].startswith("not ready")
