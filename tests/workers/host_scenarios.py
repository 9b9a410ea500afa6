"""Host-actor scenarios in ONE plain process with 4 CPU devices (no Ray), for the contract tests.

Run as ``python -m tests.workers.host_scenarios --out F.json [NAME ...]`` in a subprocess, so the
device count is fixed there and never in the pytest process. Each scenario builds real
``HostActor``s (the class Ray wraps) over real JAX and Orbax in a fresh directory and returns
what it observed; ``F.json`` maps scenario name -> observations (or ``{"error": traceback}``).
The assertions live in ``test_host_contract.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEVICES = 4
OVERRIDES = ["model.num_layers=1", "model.d_model=32", "model.d_ff=64", "model.num_heads=2",
             "model.seq_len=16", "model.vocab_size=64", "train.global_batch=8",
             "train.warmup_steps=2", "run.total_steps=50", "checkpoint.keep=10"]


class Gate:
    """Holds Orbax's async commit (its post-finalization callback) until released."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def __call__(self) -> None:
        if not self._open.wait(timeout=300):
            raise TimeoutError("gate never released")


_STORE = os.environ.get("TPU_ORCH_EXECUTABLES_DIR") or tempfile.mkdtemp(prefix="host-exe-")
"""One executable store for every actor of the process (the suite's shared one when set): the
actors after the first load their step instead of compiling it, which is not what these
scenarios test (``test_executables.py`` tests the store)."""


def make_actor(ckpt: Path, *, overrides: tuple[str, ...] = (),
               before_commit: Callable[[], None] | None = None, build: bool = True) -> Any:
    from orchestrator.config import load_config
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import plan_mesh
    from workers.host.actor import HostActor

    cfg = load_config(None, [*OVERRIDES, *overrides])
    host = HostRef(index=0, slice_name="local", worker_id=0, node_id="local",
                   node_ip="127.0.0.1", instance="local", devices=DEVICES)
    plan = plan_mesh(cfg, [host], platform="cpu")
    spec = HostSpec.for_host(cfg, plan, plan.hosts[0], checkpoint_dir=str(ckpt),
                             executables_dir=_STORE)
    actor = HostActor(spec, {}, before_commit=before_commit)
    if build:
        actor.build()
    return actor


def listing(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def tree(root: Path) -> dict[str, int]:
    """Every file under ``root`` with its size (to show nothing was deleted)."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file()}


# ---- scenarios ----------------------------------------------------------------------------------

def commit(tmp: Path) -> dict:
    """Saves start only at driver-given steps; a save held in flight is never 'committed'."""
    from orchestrator.shared import layout as ckpt_layout

    gate = Gate()
    ckpt = tmp / "ckpt"
    a = make_actor(ckpt, before_commit=gate)
    out: dict[str, Any] = {"restore": a.restore()}
    a.compile()
    gate.hold()
    first = a.run_steps(3, chunk=1, save_steps=[2], report=True)
    manager = a.trainer.ckpt.manager
    out["held"] = {"result": first, "orbax_all_steps": list(manager.all_steps()),
                   "orbax_latest_step": manager.latest_step(),
                   "orbax_in_progress": bool(manager.is_saving_in_progress()),
                   "checkpoint_steps": a.checkpoint_steps(), "dirs": listing(ckpt)}
    gate.release()
    out["save_after_release"] = a.save(wait=True)
    out["after_release_steps"] = a.checkpoint_steps()
    out["second"] = a.run_steps(8, chunk=2, save_steps=[5, 7], report=True)
    a.shutdown()
    out["final_steps"] = ckpt_layout.committed_steps(ckpt)
    out["again_same_step"] = _save_same_step_twice(tmp / "twice")
    return out


def _save_same_step_twice(ckpt: Path) -> dict:
    """run_steps saves step 2; save() at step 2 afterwards is a no-op that still reports it."""
    a = make_actor(ckpt)
    a.restore()
    r = a.run_steps(2, chunk=1, save_steps=[2], report=True)
    s = a.save(wait=True)
    a.shutdown()
    return {"run": r["records"][-1]["saved"], "save": s, "dirs": listing(ckpt)}


def stop(tmp: Path) -> dict:
    """request_stop: before its chunk, stale ids, and mid-chunk from another thread."""
    a = make_actor(tmp / "ckpt")
    a.restore()
    a.compile()
    out: dict[str, Any] = {}
    out["early_request_returned"] = a.request_stop(1, 2)
    out["chunk1"] = _brief(a.run_steps(10, chunk=1, report=True))
    out["stale_request_returned"] = a.request_stop(1, 0)
    out["chunk2"] = _brief(a.run_steps(4, chunk=2, report=True))
    seen: dict[str, int] = {}

    def driver() -> None:
        deadline = time.monotonic() + 120
        while a.current_step() < 6 and time.monotonic() < deadline:
            time.sleep(0.002)
        a.request_stop(2, 0)  # an old chunk's stop arriving late: ignored
        at = a.current_step() + 1
        seen["at"] = at
        seen["returned"] = a.request_stop(3, at)

    t = threading.Thread(target=driver)
    t.start()
    out["chunk3"] = _brief(a.run_steps(500, chunk=3, report=True))
    t.join()
    out["mid"] = seen
    out["current_after"] = a.current_step()
    a.shutdown()
    return out


def _brief(r: dict) -> dict:
    return {"step": r["step"], "stopped_early": r["stopped_early"], "n_records": len(r["records"]),
            "first": r["records"][0]["step"] if r["records"] else None}


CORRUPTIONS = ("truncate", "no_marker", "garble", "bad_run_meta", "bad_step_meta",
               "driver_skip")


def corrupt(tmp: Path) -> dict:
    """Steps 2, 4, 6 committed; step 6 damaged in one way per variant; restore falls back."""
    base = tmp / "base"
    a = make_actor(base)
    a.restore()
    a.compile()
    run = a.run_steps(6, chunk=1, save_steps=[2, 4, 6], report=True)
    a.shutdown()
    out: dict[str, Any] = {"base_steps": a.checkpoint_steps(),
                           "base_losses": [r["loss"] for r in run["records"]]}
    for kind in CORRUPTIONS:
        ckpt = tmp / kind
        shutil.copytree(base, ckpt)
        before = {s: tree(ckpt / s) for s in ("2", "4", "6")}
        skip = _damage(ckpt / "6", kind)
        out[kind] = _restore_and_continue(ckpt, before, skip, again=(kind == "truncate"))
    out["all_bad"] = _all_bad(tmp, base)
    return out


def _damage(step_dir: Path, kind: str) -> list[int]:
    shards = sorted((step_dir / "state").glob("ocdbt.process_0/d/*"))
    if kind == "truncate":
        for f in shards:
            os.truncate(f, 10)
    elif kind == "no_marker":
        (step_dir / "commit_success.txt").unlink()
    elif kind == "garble":
        for f in shards:
            f.write_bytes(os.urandom(f.stat().st_size))
    elif kind == "bad_run_meta":
        os.truncate(step_dir / "meta" / "metadata", 7)
    elif kind == "bad_step_meta":
        os.truncate(step_dir / "_CHECKPOINT_METADATA", 5)
    elif kind == "driver_skip":
        return [6]
    return []


def _restore_and_continue(ckpt: Path, before: dict, skip: list[int], *, again: bool) -> dict:
    a = make_actor(ckpt)
    r = a.restore(skip)
    moved = sorted(p.name for p in ckpt.iterdir() if ".corrupt-" in p.name)
    out: dict[str, Any] = {
        "restore": r, "dirs": listing(ckpt), "moved": moved,
        "older_intact": all(tree(ckpt / s) == before[s] for s in ("2", "4")),
        "moved_files": sorted(tree(ckpt / moved[0])) if moved else [],
        "before_files": sorted(before["6"]),
    }
    a.compile()
    cont = a.run_steps(6, chunk=1, save_steps=[6], report=True)
    out["continued_losses"] = [x["loss"] for x in cont["records"]]
    out["continued_saved"] = [x["saved"] for x in cont["records"]]
    out["save"] = a.save(wait=True)
    out["steps_after"] = a.checkpoint_steps()
    a.shutdown()
    if again:
        b = make_actor(ckpt)
        out["restore_again"] = b.restore()
        b.shutdown()
    return out


def _all_bad(tmp: Path, base: Path) -> dict:
    """Every committed step unreadable: start from the seed, having moved them all aside."""
    ckpt = tmp / "all_bad"
    shutil.copytree(base, ckpt)
    for s in ("2", "4", "6"):
        _damage(ckpt / s, "truncate")
    a = make_actor(ckpt)
    r = a.restore()
    a.shutdown()
    return {"restore": r, "dirs": listing(ckpt)}


def refuse(tmp: Path) -> dict:
    """A foreign step directory or another model's checkpoint: CheckpointError, untouched."""
    out: dict[str, Any] = {}
    foreign = tmp / "foreign"
    (foreign / "5" / "state").mkdir(parents=True)
    (foreign / "5" / "state" / "junk").write_text("not orbax")
    out["foreign"] = _expect_refusal(foreign, ())
    other = tmp / "other"
    a = make_actor(other)
    a.restore()
    a.run_steps(2, chunk=1, save_steps=[2])
    a.shutdown()
    out["other_model"] = _expect_refusal(other, ("model.d_model=64",))
    return out


def _expect_refusal(ckpt: Path, overrides: tuple[str, ...]) -> dict:
    from orchestrator.shared.errors import CheckpointError

    before = tree(ckpt)
    a = make_actor(ckpt, overrides=overrides)
    try:
        a.restore()
        got: dict[str, Any] = {"raised": None}
    except CheckpointError as exc:
        got = {"raised": type(exc).__name__, "message": exc.message, "fix": exc.fix,
               "retryable": exc.retryable}
    got["untouched"] = tree(ckpt) == before
    return got


def not_a_spec(tmp: Path) -> dict:
    """A bare HostRef (the old constructor) is refused with the way to build a spec."""
    from workers.host.actor import HostActor

    probe = make_actor(tmp / "unused", build=False)
    try:
        HostActor(probe.host, {})
    except TypeError as exc:
        return {"raised": str(exc)}
    return {"raised": None}


def lr(tmp: Path) -> dict:
    """The learning rate comes out of the jitted step and equals the schedule's value."""
    import numpy as np

    from workers.task.optim import make_lr_schedule

    a = make_actor(tmp / "ckpt")
    a.restore()
    run = a.run_steps(4, chunk=1, report=True)
    sched = make_lr_schedule(a.spec.train, a.spec.total_steps)
    expected = [float(np.asarray(sched(s))) for s in range(4)]
    a.shutdown()
    return {"got": [x["lr"] for x in run["records"]], "expected": expected}


SCENARIOS: dict[str, Callable[[Path], dict]] = {
    "commit": commit, "stop": stop, "corrupt": corrupt, "refuse": refuse, "not_a_spec": not_a_spec,
    "lr": lr}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("names", nargs="*")
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    results: dict[str, Any] = {}
    for name in args.names or list(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix=f"host-{name}-") as tmp:
            t0 = time.perf_counter()
            try:
                results[name] = SCENARIOS[name](Path(tmp))
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            print(f"{name}: {time.perf_counter() - t0:.1f}s", flush=True)
    Path(args.out).write_text(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
