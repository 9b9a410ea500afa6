"""Notice ids on the fake seam: a "stale" verdict (the notice names a host the cluster does not
have yet) is not remembered, so the replacement's later notice with the same id is acted on
(issue 11)."""

from __future__ import annotations

from tests.controller.harness import make


def test_a_stale_notice_id_is_acted_on_once_its_host_exists(tmp_path):
    """Step 3: notice "n-s1" for vm-s1-0, which does not exist yet (stale). Step 6: slice s1
    arrives and s0 is preempted, so the run moves to s1. Step 14: "n-s1" again, now for a mesh
    host: it must drain (a permanent stale verdict would drop it); the run ends on s2."""
    sim = make(tmp_path, "run.total_steps=30")
    sim.fleet.on_step(3, lambda g: sim.notice(host="vm-s1-0", id="n-s1"))

    def preempt_s0(g):
        sim.cluster.add_slice("s1")
        sim.notice(host="vm-s0-0", id="n-s0")

    def reuse_id(g):
        sim.cluster.add_slice("s2")
        sim.notice(host="vm-s1-0", id="n-s1")

    sim.fleet.on_step(6, preempt_s0)
    sim.fleet.on_step(14, reuse_id)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert [{h.slice_name for h in g.spec.plan.hosts} for g in sim.fleet.groups] == [
        {"s0"}, {"s1"}, {"s2"}]
    verdicts = [(r["event"]["id"], r["decision"]) for r in sim.events()
                if r.get("decision") in ("stale", "accepted", "duplicate")]
    assert verdicts == [("n-s1", "stale"), ("n-s0", "accepted"), ("n-s1", "accepted")]
    assert len(sim.payloads("DRAINING")) == 2 and summary.lost_steps == 0
