"""The bare multi-process JAX loop: N plain subprocesses (no Ray), one JAX group on loopback."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bench import procs
from orchestrator.shared.host_env import free_port


def run_bare(*, processes: int, devices: int, steps: int, overrides: list[str], workdir: Path,
             checkpoint_every: int = 0, timeout_s: float = 600.0,
             gloo_loop: str = "idle") -> dict:
    """Run the loop once; returns process 0's JSON (per-step records) plus wall seconds.
    ``gloo_loop="busy"`` leaves gloo's event loop as JAX starts it (``bench.gloo_loop``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "bare.json"
    coordinator = f"127.0.0.1:{free_port('127.0.0.1')}"
    env = procs.child_env({"OMP_NUM_THREADS": "1"})  # what Ray gives a num_cpus=0 actor
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir=workdir, prefix="ckpt-") as ckpt:
        started = []
        try:
            for i in range(processes):
                cmd = procs.python_cmd(
                    "bench.bare_worker", "--process-id", str(i), "--num-processes",
                    str(processes), "--coordinator", coordinator, "--devices", str(devices),
                    "--steps", str(steps), "--checkpoint-dir", ckpt,
                    "--checkpoint-every", str(checkpoint_every), "--out", str(out),
                    "--gloo-loop", gloo_loop, *overrides)
                started.append(procs.start(cmd, log_path=workdir / f"bare-{i}.log", env=env))
            codes = procs.wait_all(started, timeout_s=timeout_s)
        finally:
            for p in started:
                if p.poll() is None:
                    procs.kill_tree(p)
                procs.reap_group(p)
    if any(codes) or not out.exists():
        raise RuntimeError(f"bare loop failed (exit codes {codes}); see {workdir}/bare-*.log")
    result = json.loads(out.read_text())
    result["wall_s"] = time.time() - t0
    return result
