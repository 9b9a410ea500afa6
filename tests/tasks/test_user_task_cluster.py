"""A user's task gets every guarantee (issue 30, item 2), and its data keeps the global sample
order through every recovery and resize (issue 31, items 2-3), on ONE real local cluster (Ray,
``jax.distributed`` over gloo, Orbax; three 1-host slices of 2 CPU devices: the run on two, one
spare) against ONE uninterrupted run.

The task is ``examples/text_lm`` (outside ``orchestrator/`` and ``workers/``): the decoder LM
fed by the real Grain pipeline (``workers.input``) over a slice of the shipped corpus prepared
here, short enough that 20 steps of 8 rows wrap into new epochs. Every ``rows()`` call is
traced (``task.data.trace_dir``: step, rows, record ids, time), so each run says which samples
each step consumed (``tests/tasks/sample_order.py``).

Faults are chained where one run can honestly carry several:

- a preemption notice drained onto a warm standby, then kill -9 of a host restored from the
  RAM tier (one run);
- the driver SIGKILLed and brought back by the autoresume service (the real service,
  ``orchestrator/autoresume``: the alert, run.json, the entrypoint it vets, the resubmission;
  only Ray's job server is replaced by a local process runner), with the newest checkpoint
  corrupted meanwhile, so the resumed driver falls back to the previous one (one run);
- a notice with no spare: shrink 2 -> 1 slices (2 processes -> 1, the same global batch by
  accumulation), then a new slice joins and the run grows back (one run, last: it changes the
  cluster).

Each: the samples every step consumed equal the uninterrupted run's, every group resumed
reading exactly at the step its restore reported, every restore's data position came from the
tier it restored (``summary.json`` ``restores[].data``, the timeline's ``Compiling.data``), and
the final parameters are the uninterrupted run's bit for bit where every step ran on the same
mesh (a shrunk step accumulates two micro-batches: the same samples, another summation order,
so there the parameters agree to float rounding only).
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.autoresume.config import (
    AutoresumeConfig,
    OriginConfig,
    PolicyConfig,
    RayJobsConfig,
)
from orchestrator.autoresume.service import AutoresumeService
from orchestrator.config import RunConfig, load_config
from orchestrator.controller.config import ChaosFaultConfig
from orchestrator.controller.listener import RunListener
from orchestrator.controller.plugins import ChaosPlugin
from orchestrator.raygroup.cluster_view import RayClusterView
from orchestrator.shared import layout as ckpt_layout
from policies.autoresume import JobStatus
from tests.autoresume.notifications import encode, notification
from tests.faults.harness import (
    BASE_OVERRIDES,
    Action,
    print_recovery,
    run_controller,
    started_cluster,
)
from tests.input.conftest import SEQ_LEN, VOCAB, make_dataset
from tests.integration.cli import newest_step
from tests.support.ray_cluster import RunningCluster
from tests.tasks import sample_order
from tests.tasks.user_task_jobs import LocalJobs, all_gone, host_pids, wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TOTAL, EVERY, BATCH, SEED = 20, 5, 8, 0
CORPUS_CHARS = 3_000  # 69 records of 16 tokens: 20 steps x 8 rows read it in 3 epochs
TASK = {"kind": "examples.text_lm.task:make_task", "vocab_size": VOCAB, "seq_len": SEQ_LEN,
        "d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 64}
TWO_SLICES = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1",
              "cluster.emulate.devices_per_host=2")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RunningCluster]:
    with started_cluster(slices=3, hosts_per_slice=1, devices_per_host=2) as running:
        yield running


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    return make_dataset(tmp_path_factory.mktemp("corpus"), "bin", chars=CORPUS_CHARS)


def write_config(where: Path, data_dir: str, *, name: str = "text-lm") -> Path:
    """The run's YAML (``--config``: a task autoresume may bring back lives in it, not in
    overrides): the task, its data traced into ``where/trace``, the fault tests' small run."""
    where.mkdir(parents=True, exist_ok=True)
    cfg = {"run": {"name": name, "total_steps": TOTAL, "seed": SEED},
           "task": {**TASK, "data": {"dir": data_dir, "trace_dir": str(where / "trace")}},
           "train": {"global_batch": BATCH}}
    path = where / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_config(where: Path, data_dir: str, *overrides: str, chaos=()) -> RunConfig:
    base = [o for o in BASE_OVERRIDES if not o.startswith(("model.", "run.total_steps",
                                                            "train.global_batch"))]
    cfg = load_config(str(write_config(where, data_dir)),
                      [f"run.run_dir={where / 'run'}", *base, *TWO_SLICES, *overrides])
    assert cfg.controller.checkpoint_interval.every_steps == EVERY
    if chaos:
        import dataclasses

        cfg = dataclasses.replace(cfg, controller=dataclasses.replace(cfg.controller,
                                                                      chaos=tuple(chaos)))
    return cfg


def _helper(*args: str) -> str:
    """``tests/tasks/sample_order.py`` in a subprocess: this process never imports JAX (Grain
    and Orbax do), so the Ray nodes a later test starts are not forked from a JAX process."""
    done = subprocess.run([sys.executable, "-m", "tests.tasks.sample_order", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def source(data_dir) -> dict[str, Any]:
    """The run's source, opened as a reader of it would: its order (step -> ids), its records,
    the epochs the run reads, and each step's position (epoch, index)."""
    got = json.loads(_helper("source", data_dir, str(SEQ_LEN), str(VOCAB), str(BATCH),
                             str(SEED), str(TOTAL)))
    return {"records": got["records"], "epochs": got["epochs"],
            "order": {int(s): ids for s, ids in got["order"].items()},
            "positions": {int(s): tuple(p) for s, p in got["positions"].items()}}


def timeline(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "timeline.jsonl").read_text().splitlines() if x]


@pytest.fixture(scope="module")
def plain(cluster, data_dir, source, tmp_path_factory) -> dict[str, Any]:
    """The uninterrupted run every scenario compares with: its consumed samples (which must be
    the source's own order) and final parameters."""
    where = tmp_path_factory.mktemp("plain")
    out = run_controller(run_config(where, data_dir), collect_params=True)
    assert (out.summary.state, out.summary.step) == ("SUCCEEDED", TOTAL)
    got = sample_order.consumed(sample_order.reads(where / "trace"), global_batch=BATCH)
    assert source["epochs"] >= 3, "the corpus slice should wrap into new epochs"
    assert got == source["order"]
    assert out.final_params is not None
    return {"consumed": got, "params": out.final_params}


def check_order(plain: Mapping[str, Any], where: Path, run_dir: Path) -> list:
    """Same samples per step as the uninterrupted run, every group resumed at its restore's
    data step; returns the resumed runs (data step, steps read) for the test's own checks."""
    trace = sample_order.reads(where / "trace")
    assert sample_order.consumed(trace, global_batch=BATCH) == plain["consumed"]
    runs = sample_order.resumed_runs(trace, timeline(run_dir))
    sample_order.check_resumed(runs, total_steps=TOTAL)
    return runs


def check_data_records(restores: Sequence[dict], source: Mapping[str, Any]) -> None:
    """Every restore says where the data resumed, from the record of the tier it restored."""
    for r in restores:
        d = r["data"]
        step = r["restored_step"]
        if step is None:
            assert (d["tier"], d["step"], d["recorded"]) == ("seed", 0, False), r
            continue
        epoch, index = source["positions"][step]
        assert d == {**d, "tier": r["tier"], "step": step, "kind": "step", "recorded": True,
                     "epoch": epoch, "index": index, "records": source["records"],
                     "global_batch": BATCH}, r


def check_orbax_items(run_dir: Path) -> None:
    """Each committed Orbax step holds its data position as its own item."""
    steps = ckpt_layout.committed_steps(run_dir / "checkpoints")
    assert steps
    for s in steps:
        item = json.loads((run_dir / "checkpoints" / str(s) / "data" / "metadata").read_text())
        assert (item["kind"], item["step"]) == ("step", s), item


def assert_same_params(want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray] | None
                       ) -> None:
    assert got is not None and sorted(got) == sorted(want)
    for k, v in want.items():
        np.testing.assert_array_equal(v, got[k], err_msg=k)


# ---- announced drain onto a standby, then kill -9 restored from RAM ------------------------


def test_drain_onto_standby_then_kill_9_from_ram_keep_the_sample_order(cluster, data_dir,
                                                                       source, plain, tmp_path):
    chaos = [ChaosFaultConfig(at_step=6, host=1, kind="preempt", deadline_s=60),
             ChaosFaultConfig(at_step=13, host=1, kind="kill")]
    hit = run_controller(run_config(tmp_path, data_dir, "controller.warm.standby_slices=1",
                                    # drain at once, not after the standby's warm-up: the kill
                                    # at 13 must find the re-formed group
                                    "controller.warm.handover_max_s=0",
                                    "checkpoint.ram.enabled=true",
                                    # a copy every step (auto may choose fewer on a slow
                                    # machine): the kill at 13 then loses at most one
                                    "checkpoint.ram.every=1", chaos=chaos),
                         collect_params=True)
    print_recovery("text-lm-standby-then-ram", hit)
    s = hit.summary
    assert (s.state, s.step) == ("SUCCEEDED", TOTAL)
    # the drain and the kill; a host can also die on its own while the first group forms on
    # a loaded machine (a Ray worker crash at start, seen once in CI): one more host_lost then
    assert s.restarts.get("spot_preemption") == 1 and s.restarts.get("host_lost", 0) >= 1, \
        s.restarts
    assert "DRAINING" in hit.states
    [announced] = [r for r in s.recoveries if r["kind"] == "announced"]
    assert announced["processes"]["standby"] == 1, s.recoveries
    drained, killed = hit.restores[-2], hit.restores[-1]
    assert drained["lost_steps"] == 0 and drained["restored_step"] >= 6, drained
    assert killed["tier"] == "ram" and killed["restored_step"] in (12, 13), killed
    check_data_records(hit.restores, source)
    runs = check_order(plain, tmp_path, hit.controller.run_state.run_dir)
    assert [start for start, _ in runs] == [0, drained["restored_step"], killed["restored_step"]]
    assert_same_params(plain["params"], hit.final_params)


# ---- driver SIGKILLed, autoresumed; its newest checkpoint corrupt meanwhile ------------------


def _final_params(run_dir: Path, out: Path) -> dict[str, np.ndarray]:
    """The parameters of the run's step TOTAL, read from its checkpoint on this machine
    (``orchestrator.export``'s reader, in a subprocess)."""
    _helper("params", str(run_dir), str(TOTAL), str(out))
    with np.load(out) as got:
        return {k: got[k] for k in got.files}


def test_killed_driver_autoresumed_past_a_corrupt_checkpoint_keeps_the_sample_order(
        cluster, data_dir, source, plain, tmp_path):
    runs_dir = tmp_path / "runs"
    run_id = "text-lm-resumed"
    run_dir = runs_dir / run_id
    conf = write_config(tmp_path / "conf", data_dir, name=run_id)
    base = [o for o in BASE_OVERRIDES if not o.startswith(("model.", "run.total_steps",
                                                            "train.global_batch",
                                                            "cluster.mode"))]
    argv = ["python", "-m", "orchestrator.main", "--config", str(conf), "--log-format", "json",
            f"run.run_dir={run_dir}", "cluster.mode=auto", *base, *TWO_SLICES,
            "metrics.cloud_monitoring.enabled=false", "metrics.console_every_steps=0",
            # Orbax's own periodic saves, one of which is corrupted below (with the RAM tier
            # the holders would write them from their copies); a chunk per step, so steps reach
            # metrics.jsonl as they happen and the kill below lands before step 20; no standby
            # on the spare slice (the hosts counted below are the group's two)
            "checkpoint.ram.enabled=false", "run.steps_per_call=1",
            "controller.warm.standby_slices=0"]
    jobs = LocalJobs(cluster.address, tmp_path)
    first = f"{run_id}-r0"
    jobs.submit(submission_id=first, entrypoint=shlex.join(argv), runtime_env={},
                metadata={})
    # the group's host processes, taken while it trains: once step 10 is committed, steps 11
    # to 20 take about a second here, and the kill below must follow the commit at once
    driver = jobs.jobs[first][0]
    wait_for(lambda: newest_step(run_dir) >= 1 or driver.poll() is not None, 300, "a first step")
    assert driver.poll() is None, jobs.log(first)
    hosts = host_pids()
    assert len(hosts) == 2, hosts
    # SIGKILL as soon as step 10 is committed: the driver dies with its hosts mid-run (Ray
    # ends a dead driver's actors); nothing of it tears down in order
    wait_for(lambda: ckpt_layout.is_committed(run_dir / "checkpoints", 10)
             or driver.poll() is not None, 300, "step 10 committed", every_s=0.02)
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    assert newest_step(run_dir) < TOTAL, "the run ended before the kill landed"
    assert jobs.status(first) == JobStatus.FAILED
    # Ray ends a dead driver's actors: once their processes are gone no save can still commit
    wait_for(lambda: all_gone(hosts), 120, "the killed driver's host processes gone")
    # the newest committed checkpoint: process 1's shard of it truncated
    newest = max(ckpt_layout.committed_steps(run_dir / "checkpoints"))
    shards = sorted((run_dir / "checkpoints" / str(newest) / "state").glob("ocdbt.process_1/d/*"))
    assert shards, "process 1 wrote no shard files of its own"
    for f in shards:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    service = AutoresumeService(AutoresumeConfig(
        state_dir=str(tmp_path / "autoresume"), run_dirs=(str(runs_dir / "*"),),
        config_roots=(str(conf.parent),), ray=RayJobsConfig(auth_mode="disabled"),
        policy=PolicyConfig(startup_grace_s=0.0, backoff_base_s=0.0),
        origin=OriginConfig(project="demo-project")),
        ray=jobs)
    outcome = service.handle_message(encode(notification(
        incident_id="inc-driver-killed", run_id=run_id, started_at=int(time.time()))))
    assert outcome == "submitted", service.audit.read()
    second = f"{run_id}-r1"
    assert jobs.jobs[second][0].wait(400) == 0, jobs.log(second)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["state"], summary["step"]) == ("SUCCEEDED", TOTAL)
    [back] = [r for r in summary["restores"] if r["restored_step"] is not None]
    print(f"\n[text-lm-autoresumed] killed past step 10, step {newest} corrupted; restored "
          f"{back['restored_step']} from the {back['tier']} tier, skipped "
          f"{[k['step'] for k in back['skipped']]}; {back['data']}")
    assert back["tier"] == "durable" and back["restored_step"] == newest - EVERY, back
    assert [k["step"] for k in back["skipped"]] == [newest], back
    check_data_records(summary["restores"], source)
    check_orbax_items(run_dir)
    runs = check_order(plain, tmp_path / "conf", run_dir)
    assert [start for start, _ in runs] == [0, newest - EVERY], runs
    assert_same_params(plain["params"], _final_params(run_dir, tmp_path / "resumed.npz"))


# ---- shrink 2 -> 1 slices, grow back (runs last: it changes the cluster) ---------------------


class HoldForSlice(RunListener):
    """Holds the one-slice group before its chunk from step ``at`` until the test's thread has
    added a slice (Ray adds nodes from the main thread only), so the run grows back whatever
    this machine's speed; the group has trained on one slice by then."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.need, self.joined = threading.Event(), threading.Event()

    def before_chunk(self, run: Any, step: int, until: int) -> None:
        if (run.plan is not None and run.plan.num_slices == 1 and step >= self.at
                and not self.need.is_set()):
            self.need.set()
            self.joined.wait(180)


def test_shrink_to_one_slice_and_grow_back_keep_the_sample_order(cluster, data_dir, source,
                                                                plain, tmp_path):
    spare = cluster.slice_names[-1]
    cluster.emulated.retire_host(spare, 0)  # no spare: a notice leaves one slice
    wait_for(lambda: spare not in {h.slice_name for h in RayClusterView().hosts()}, 60,
          "the spare slice gone")
    hold = HoldForSlice(at=10)
    added: list[str] = []

    def add_slice(ctl) -> None:
        if not hold.need.wait(300):
            return
        added.append(cluster.emulated.add_slice(1))
        wait_for(lambda: added[0] in {h.slice_name for h in RayClusterView().hosts()}, 60,
              "the new slice in the driver's view")
        hold.joined.set()

    cfg = run_config(tmp_path, data_dir, "controller.elastic.shrink_after_s=0",
                     chaos=[ChaosFaultConfig(at_step=5, host=1, kind="preempt",
                                             deadline_s=60)])
    hit = run_controller(cfg, actions=[Action(step=0, name="add_slice", fn=add_slice)],
                         listeners=[ChaosPlugin(cfg.controller.build_policies().chaos), hold],
                         collect_params=True)
    print_recovery("text-lm-shrink-grow", hit)
    s = hit.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", TOTAL, 0)
    sizes = [t["hosts"] for t in hit.timeline if t["state"] == "RUNNING"]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes
    assert added and added[0] in hit.timeline[-1]["slices"], hit.timeline[-1]
    shrunk, grown = hit.restores[1], hit.restores[2]
    assert shrunk["restored_step"] == 5 and grown["restored_step"] >= 10, hit.restores
    assert shrunk["data"]["processes_now"] == 1 and grown["data"]["processes_now"] == 2
    check_data_records(hit.restores, source)
    runs = check_order(plain, tmp_path, hit.controller.run_state.run_dir)
    assert [start for start, _ in runs] == [0, 5, grown["restored_step"]], runs
    # steps 6..grown ran on one process accumulating two micro-batches of 4: the same samples,
    # another summation order than 2 processes' one batch of 8
    got = hit.final_params
    assert got is not None and sorted(got) == sorted(plain["params"])
    same = all(np.array_equal(v, got[k]) for k, v in plain["params"].items())
    worst = max(float(np.max(np.abs(v - got[k]))) for k, v in plain["params"].items())
    print(f"\n[text-lm-shrink-grow] parameters bit-identical: {same}; max |diff| {worst:.3g}")
    for k, v in plain["params"].items():
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
