"""The samples a run consumed, from the input pipeline's read trace (``DataSettings.trace_dir``:
every ``rows()`` call appends ``{"step", "rows", "ids", "epoch", "pid", "t"}``), and the
checks that a recovery neither skipped nor repeated any (tests/tasks/test_user_task_cluster.py).

*Consumed*: for each step and row, the ids of the latest read of it. A step a group read and
that a restore rolled back is read again by the next group; the later read is the one whose
gradient the final parameters hold. *Resumed*: the reads between one restore and the next
(or the end of that driver) must be one unbroken run of steps starting exactly at the step the
restore reported for the data: a restore that resumed the data one step late (a skip) or
early (a repeat) breaks that, whatever the per-step ids say.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def reads(trace_dir: Path) -> list[dict]:
    """Every read of every process, oldest first."""
    out = []
    for f in sorted(trace_dir.glob("samples-*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda r: r["t"])


def consumed(trace: Sequence[dict], *, global_batch: int) -> dict[int, list[int]]:
    """step -> the record id of each row of its global batch (the latest read of the row)."""
    out: dict[int, list[int | None]] = {}
    for r in trace:
        row = out.setdefault(r["step"], [None] * global_batch)
        start, stop = r["rows"]
        row[start:stop] = r["ids"]
    missing = {s: [i for i, x in enumerate(ids) if x is None] for s, ids in out.items()}
    missing = {s: m for s, m in missing.items() if m}
    assert not missing, f"rows never read: {missing}"
    return {s: list(ids) for s, ids in sorted(out.items())}  # type: ignore[misc]


@dataclass(frozen=True)
class Restore:
    at: float
    """The RESTORING -> COMPILING transition's time (reads after it are this group's)."""
    data: dict
    """``Compiling.data``: where the data resumed."""
    restored_step: int | None


def restores(timeline: Sequence[dict]) -> tuple[list[Restore], list[float]]:
    """Every restore (with its data position) and every driver start, from timeline.jsonl."""
    done = [Restore(at=t["at"], data=t["payload"]["data"],
                    restored_step=t["payload"]["restored_step"])
            for t in timeline if t["prev"] == "RESTORING" and t["state"] == "COMPILING"]
    starts = [t["at"] for t in timeline if t["prev"] is None]
    return done, starts


def resumed_runs(trace: Sequence[dict], timeline: Sequence[dict]) -> list[tuple[int, list[int]]]:
    """(the data step each restore reported, the steps read until the next restore or driver
    start), in order."""
    done, starts = restores(timeline)
    out = []
    for i, r in enumerate(done):
        ends = [x.at for x in done[i + 1:]] + [t for t in starts if t > r.at]
        end = min(ends, default=float("inf"))
        steps = sorted({x["step"] for x in trace if r.at < x["t"] < end})
        out.append((int(r.data["step"]), steps))
    return out


def check_resumed(runs: Sequence[tuple[int, list[int]]], *, total_steps: int) -> None:
    """Each group read one unbroken run of steps from where its restore put the data, and the
    last one read up to the final step."""
    for i, (start, steps) in enumerate(runs):
        assert steps, f"restore {i} (data at step {start}) read nothing"
        assert steps == list(range(start, steps[-1] + 1)), (
            f"restore {i}: the data resumed at step {start} but the group read steps {steps}")
    assert runs and runs[-1][1][-1] == total_steps - 1, runs[-1]


# ---- in a subprocess: the pytest process never imports JAX (Grain does) ----------------------

def _source_order(data_dir: str, *, seq_len: int, vocab: int, batch: int, seed: int,
                  steps: int) -> dict:
    from workers.input import DataSettings, open_source

    with open_source(DataSettings(dir=data_dir, prefetch_steps=0), seq_len=seq_len,
                     vocab_size=vocab, global_batch=batch, total_steps=steps) as src:
        return {"records": src.n, "epochs": src.epochs(steps),
                "order": {s: src.sample_ids(seed, s).tolist() for s in range(steps)},
                "positions": {s: [src.position(s).epoch, src.position(s).index]
                              for s in range(steps + 1)}}


def _params(run_dir: str, step: int, out: str) -> None:
    import numpy as np

    from orchestrator.export.read import read
    from orchestrator.export.select import choose

    arrays, _ = read(choose(Path(run_dir), step), Path(run_dir), with_opt_state=False)
    np.savez(out, **{k.removeprefix("params/"): np.asarray(v) for k, v in arrays.items()})


if __name__ == "__main__":
    import sys

    what, *rest = sys.argv[1:]
    if what == "source":
        data_dir, seq_len, vocab, batch, seed, steps = rest
        print(json.dumps(_source_order(data_dir, seq_len=int(seq_len), vocab=int(vocab),
                                       batch=int(batch), seed=int(seed), steps=int(steps))))
    else:
        _params(rest[0], int(rest[1]), rest[2])
