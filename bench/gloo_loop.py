"""Gloo's event loop busy-polling vs idled (``workers.host.gloo_loop``), side by side.

``python -m bench.gloo_loop [--steps 300] [--repeats 2] [--out DIR]``: the bare loop (2 processes
x 1 CPU device, the tests' model), gloo's loop left as JAX starts it and in the idle class,
alone and beside one busy process (a machine with more runnable threads than cores, as under
an emulated cluster). Pairs are interleaved per repeat. Prints the median step time and the CPU
seconds of the two processes; run it on an idle machine (the load is printed with the table).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import machine
from bench.bare import run_bare
from bench.stats import spread

TEST_MODEL = ["model.num_layers=1", "model.d_model=32", "model.d_ff=64", "model.num_heads=2",
              "model.seq_len=16", "model.vocab_size=64", "train.global_batch=8",
              "train.warmup_steps=2"]
"""The tests' model (``tests/faults/harness.py``): a step of a few collectives, little math."""

SKIP = 5
"""First steps left out of the median (compile and warm-up)."""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one(mode: str, beside: bool, steps: int, workdir: Path) -> dict:
    """One bare run with gloo's loop ``mode`` ("busy" or "idle"), ``beside`` a busy process."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if beside else None
    try:
        cpu0 = _children_cpu()
        out = run_bare(processes=2, devices=1, steps=steps, overrides=TEST_MODEL,
                       workdir=workdir, gloo_loop=mode)
        cpu = _children_cpu() - cpu0
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    times = [r["step_time_s"] for r in out["records"][SKIP:]]
    if (out.get("gloo_loop_idled", 0) == 1) != (mode == "idle"):
        raise RuntimeError(f"gloo_loop={mode} but process 0 idled {out.get('gloo_loop_idled')} "
                           f"threads: the comparison would not be one")
    return {"gloo_loop": mode, "beside_busy": beside, "median_step_s": spread(times)["median"],
            "wall_s": out["wall_s"], "cpu_s": cpu, "idled": out["gloo_loop_idled"]}


def table(rows: list[dict]) -> str:
    lines = ["| condition | gloo loop | median step (s) | CPU-s (2 processes) | runs |",
             "|---|---|---|---|---|"]
    for beside in (False, True):
        for mode in ("busy", "idle"):
            got = [r for r in rows if r["beside_busy"] == beside and r["gloo_loop"] == mode]
            if got:
                step = spread([r["median_step_s"] for r in got])["median"]
                cpu = spread([r["cpu_s"] for r in got])["median"]
                lines.append(f"| {'beside 1 busy process' if beside else 'alone'} | {mode} | "
                             f"{step:.4f} | {cpu:.1f} | {len(got)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gloo_loop", description=__doc__)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    load = machine.load_average()
    rows, loads = [], []
    with tempfile.TemporaryDirectory(prefix="bench-gloo-") as tmp:
        for i in range(args.repeats):
            for beside in (False, True):
                for mode in (("busy", "idle") if i % 2 == 0 else ("idle", "busy")):
                    before = machine.load_average()
                    row = one(mode, beside, args.steps, Path(tmp) / f"{i}-{beside}-{mode}")
                    loads.append({"measurement": f"{i}-{'beside' if beside else 'alone'}-{mode}",
                                  "before": before, "after": machine.load_average()})
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"\nload average before: {load}; machine: {machine.describe().get('cpu_model')}, "
          f"{machine.describe().get('nproc')} cores; {args.steps} steps per run\n")
    print(table(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"gloo-loop-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
        path.write_text(json.dumps({"load_before": load, "machine": machine.describe(),
                                    "steps": args.steps, "rows": rows, "loads": loads,
                                    "validity": machine.validity(loads)}, indent=1))
        print(f"json: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
