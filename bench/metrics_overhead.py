"""Exporter overhead on the training step: on_step() cost with and without Cloud Monitoring.

Runs a fake training loop (a small numpy matmul per step, ~10 ms) that reports every step to a
MetricsPipeline with the JSONL sink, then the same with the Cloud Monitoring sink added, pointed at
the local MetricService (tests/support/metric_service.py) on loopback. Prints per-call on_step
times and the loop's wall time ratio. Usage: .venv/bin/python bench/metrics_overhead.py [steps]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a busy-waiting BLAS pool blurs CPU times
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.controller.listener import RunListener
from orchestrator.lifecycle import RunState, Transition
from orchestrator.metrics.cloud.client import make_client
from orchestrator.metrics.cloud.sink import CloudMonitoringSink
from orchestrator.metrics.config import CloudMonitoringConfig
from orchestrator.metrics.identity import ResourceIdentity
from orchestrator.metrics.jsonl import JsonlSink
from orchestrator.metrics.pipeline import MetricsPipeline
from orchestrator.metrics.records import StepRecord
from tests.support.metric_server import LocalMetricService


class CpuTimed(RunListener):
    """Counts the CPU time a sink spends on its worker thread (robust to other load)."""

    def __init__(self, inner: RunListener) -> None:
        self.inner = inner
        self.name = inner.name
        self.queue_size = getattr(inner, "queue_size", None)  # the pipeline's default if None
        self.cpu_s = 0.0

    def _timed(self, fn, *args) -> None:
        t = time.thread_time()
        try:
            fn(*args)
        finally:
            self.cpu_s += time.thread_time() - t

    def on_step(self, rec):
        self._timed(self.inner.on_step, rec)

    def on_transition(self, t):
        self._timed(self.inner.on_transition, t)

    def flush(self):
        self._timed(self.inner.flush)

    def close(self):
        self._timed(self.inner.close)


def run(raw_sinks: list[RunListener], steps: int, work: tuple[np.ndarray, np.ndarray]) -> dict:
    sinks = [CpuTimed(s) for s in raw_sinks]
    pipe = MetricsPipeline(sinks, queue_size=10_000)
    a, b = work
    calls: list[float] = []
    t_loop = time.perf_counter()
    cpu0 = time.process_time()
    now = time.time()
    pipe.on_transition(Transition(seq=0, state=RunState.RUNNING, prev=RunState.COMPILING,
                                  at=now, prev_duration_s=0.0, reason="bench", incarnation=0,
                                  slices=("s0",), hosts=1, step=0))
    for k in range(1, steps + 1):
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        dt = time.perf_counter() - t0
        rec = StepRecord(step=k, loss=1.0 / k, step_time_s=dt, tokens=512, flops=4 * 2 * 256**3,
                         grad_norm=1.0, wall_time=time.time(), devices=1,
                         peak_flops_per_device=1e11, peak_source="configured",
                         mfu=4 * 2 * 256**3 / dt / 1e11, incarnation=0, slices=1)
        c0 = time.perf_counter()
        pipe.on_step(rec)
        calls.append(time.perf_counter() - c0)
    loop_s = time.perf_counter() - t_loop
    pipe.close(timeout=30)
    cpu_s = time.process_time() - cpu0  # all threads: the sinks' work included
    calls.sort()
    return {"loop_s": loop_s, "cpu_s": cpu_s,
            "sink_cpu_us_per_step": {s.name: s.cpu_s / steps * 1e6 for s in sinks},
            "call_mean_us": statistics.fmean(calls) * 1e6,
            "call_p99_us": calls[int(0.99 * len(calls))] * 1e6, "stats": pipe.stats()}


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rng = np.random.default_rng(0)
    work = (rng.standard_normal((256, 256), dtype=np.float32),
            rng.standard_normal((256, 256), dtype=np.float32))
    ident = ResourceIdentity(project_id="bench", job="bench")
    empty: list[dict] = []
    base: list[dict] = []
    cloud_runs: list[dict] = []
    sink_stats: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, LocalMetricService() as svc:
        for i in range(repeats):  # alternate, so machine noise hits all variants alike
            empty.append(run([], steps, work))
            base.append(run([JsonlSink(Path(tmp) / f"a{i}.jsonl")], steps, work))
            cfg = CloudMonitoringConfig(enabled=True, project="bench", endpoint=svc.address,
                                        window_s=5.0, job=f"bench-{i}")
            cloud = CloudMonitoringSink(cfg, identity=ResourceIdentity(
                project_id="bench", job=f"{ident.job}-{i}"), client=make_client(svc.address))
            cloud_runs.append(run([JsonlSink(Path(tmp) / f"b{i}.jsonl"), cloud], steps, work))
            sink_stats.append(cloud.stats())
        accepted = len(svc.state.record.accepted)
        rejected = len(svc.state.record.rejected)

    def med(rs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rs)

    print(f"steps per run: {steps}, runs per variant: {repeats}, "
          f"step ~{med(base, 'loop_s') / steps * 1e3:.1f} ms")
    for name, rs in (("no sinks", empty), ("jsonl only", base),
                     ("jsonl + cloud monitoring", cloud_runs)):
        runs = ", ".join(f"{r['loop_s']:.2f}" for r in rs)
        print(f"{name:26s} loop median {med(rs, 'loop_s'):.3f} s (runs {runs}) | on_step mean "
              f"{med(rs, 'call_mean_us'):.1f} us, p99 {med(rs, 'call_p99_us'):.1f} us | "
              f"process CPU median {med(rs, 'cpu_s'):.3f} s")
    cloud_cpu = statistics.median(r["sink_cpu_us_per_step"]["cloud_monitoring"] for r in cloud_runs)
    jsonl_cpu = statistics.median(r["sink_cpu_us_per_step"]["jsonl"] for r in cloud_runs)
    print(f"sink CPU per step (worker threads): cloud_monitoring {cloud_cpu:.1f} us, "
          f"jsonl {jsonl_cpu:.1f} us; step ~{med(base, 'loop_s') / steps * 1e6:.0f} us")
    print(f"cloud: {accepted} points accepted, {rejected} rejected; sink stats {sink_stats}")
    print("ratio loop time with/without cloud export: "
          f"{med(cloud_runs, 'loop_s') / med(base, 'loop_s'):.3f}")
    print("ratio process CPU time with/without cloud export (robust to machine load): "
          f"{med(cloud_runs, 'cpu_s') / med(base, 'cpu_s'):.3f}")
    print("ratio on_step mean with/without cloud export: "
          f"{med(cloud_runs, 'call_mean_us') / med(base, 'call_mean_us'):.2f}")


if __name__ == "__main__":
    main()
