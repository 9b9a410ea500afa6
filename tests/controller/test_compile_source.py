"""Whether the hosts loaded their stored executables or compiled reaches the timeline and the
summary (fake seam; the Ray side's merge is pure)."""

from __future__ import annotations

import json

from orchestrator.controller.seam import Compiled
from orchestrator.raygroup.results import compiled
from tests.controller.fakes import FakeGroup, lost
from tests.controller.harness import make


def _host(source: str, seconds: float, key: str | None = "k0", **extra) -> dict:
    return {"compile_s": seconds, "source": source, "key": key, "reason": "", "flops_xla": 7.0,
            "flops_analytic": 9.0, **extra}


def test_hosts_results_merge_into_one_compiled():
    both = compiled([_host("loaded", 0.1), _host("loaded", 0.3, key="k1")])
    # the task's FLOP count (flops_analytic) wins over XLA's; XLA's when the task gives none
    assert both == Compiled(compile_s=0.3, flops=9.0, source="loaded", key="k0")
    assert compiled([_host("loaded", 0.1, flops_analytic=None, tokens=496)]) == Compiled(
        compile_s=0.1, flops=7.0, source="loaded", key="k0", tokens=496)
    mixed = compiled([_host("compiled", 2.0), _host("loaded", 0.1, key="k1")])
    assert (mixed.source, mixed.compile_s) == ("mixed", 2.0)
    # compile.share: host 0 compiled once for the group, the others loaded its file (one key)
    once = compiled([_host("compiled", 2.0), _host("loaded", 2.1), _host("loaded", 2.1)])
    assert (once.source, once.compile_s, once.key) == ("compiled", 2.1, "k0")
    # not once: another host than 0 compiled, or a host compiled its own after all
    assert compiled([_host("loaded", 0.1), _host("compiled", 2.0)]).source == "mixed"
    assert compiled([_host("compiled", 2.0), _host("loaded", 0.1),
                     _host("compiled", 2.0)]).source == "mixed"
    # a host from before the store (no "source") counts as compiled
    old = compiled([{"compile_s": 1.5, "flops_xla": None, "flops_analytic": 9.0}])
    assert old == Compiled(compile_s=1.5, flops=9.0, source="compiled", key=None)


def test_loaded_step_is_in_the_timeline_reason_and_the_summary(tmp_path, monkeypatch):
    sources = iter(["compiled", "loaded"])

    def compile_(self) -> Compiled:
        return Compiled(compile_s=0.2, flops=1e6, source=next(sources, "loaded"), key="abc")

    monkeypatch.setattr(FakeGroup, "compile", compile_)
    sim = make(tmp_path)
    fired: list[int] = []

    def kill_once(g):
        if not fired:
            fired.append(1)
            return lost()
        return None

    sim.fleet.on_step(8, kill_once)  # one host lost: a second group forms and loads
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    reasons = [t.reason for t in sim.controller.lifecycle.timeline
               if t.state.value == "RUNNING" and t.prev is not None
               and t.prev.value == "COMPILING"]
    assert reasons == ["step compiled", "step loaded from the executable store (key abc)"]
    assert [(c["incarnation"], c["source"], c["key"]) for c in summary.compiles] == [
        (1, "compiled", "abc"), (2, "loaded", "abc")]
    written = json.loads((sim.run_dir / "summary.json").read_text())
    assert written["compiles"] == summary.compiles
