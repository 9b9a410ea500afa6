"""Protection at the sizes real runs have: what the defaults cost and buy as a host's share of the
train state grows from a MiB to GiBs, beside this machine's own memory and socket bandwidth.

``python -m bench.sizes [--sizes 1,64,256,1024,2048] [--systems kill,notice,off]``. Per size
(MiB of train state per host), ``python -m orchestrator.main`` runs the **default config** plus
one spare slice (1 slice × 2 hosts × 2 CPU devices, a standby slice), a durable save every 10
steps, the built-in ``llama`` task shaped so that params + AdamW moments come to that size per
host with few tokens per step (``model_for``: steps stay seconds, activations small):

| system | event |
|---|---|
| kill | kill -9 of host 1 before the step after ``AT_STEP`` |
| notice | preemption notice for host 1 at ``AT_STEP`` (30 s deadline) |
| off | none, ``checkpoint.ram.enabled=false``: the step time without copies |

Per size: the tier's decision and copy interval (``checkpoint.ram.every: auto``), the copies'
cost per step (their blocking seconds per step, and the median step with the tier on over the
one without), a kill -9's steps lost and failure → first step, a notice's last old step → first
new step and the same less one step (*time not training*), and the seconds and GB/s of every
movement of the state the runs record (the pack into host memory, the hand-over of a drain,
the restore, the save). The *physical line*, measured in the same run: a copy into touched
memory (``numpy.copyto``), a fresh buffer's first touch, one TCP stream over loopback, and the
MAC every copy carries (HMAC-SHA256). Output: a table on stdout,
``bench/results/sizes-<time>.json`` and a plot of time vs size beside the line
(``bench/results/sizes-<time>.png``); a run started at a 1-minute load >= 1.5 makes the whole
result NOT A RESULT.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench import machine
from bench.orchestrated import RunDir, run_main
from bench.sidebyside import interleave, write_result

MIB = 1024**2
SIZES_MIB = (1, 64, 256, 1024, 2048)
AT_STEP = 25
BASE = ["cluster.emulate.spare_slices=1", "metrics.console_every_steps=0",
        "controller.checkpoint_interval.every_steps=10", "run.total_steps=40",
        "task.kind=llama", "train.global_batch=4"]
"""The default config plus one spare slice and a durable save every 10 steps."""
SYSTEMS = {
    "kill": [f"controller.chaos=[{{at_step: {AT_STEP}, host: 1, kind: kill}}]"],
    "notice": [f"controller.chaos=[{{at_step: {AT_STEP}, host: 1, kind: preempt, "
               "deadline_s: 30}]"],
    "off": ["checkpoint.ram.enabled=false"],
}
HOSTS = 2
STATE_BYTES_PER_PARAM = 12
"""float32 parameters and AdamW's two float32 moments."""
SEQ_LEN = 16


def model_for(per_host_bytes: int) -> dict[str, int]:
    """A ``llama`` shape whose train state is about ``per_host_bytes`` per host on ``HOSTS``
    hosts: two blocks of width ``d`` (``d_ff`` = 4·d), the vocabulary filling the rest (its
    embedding costs a lookup, its head a matmul over few tokens)."""
    from workers.models.llama import LlamaConfig, param_count

    params = per_host_bytes * HOSTS // STATE_BYTES_PER_PARAM
    d = 64 if params < 4 * MIB else 256 if params < 32 * MIB else 1024
    shape = dict(d_model=d, num_layers=2, num_heads=8 if d >= 256 else 4,
                 num_kv_heads=8 if d >= 256 else 4, d_ff=4 * d, seq_len=SEQ_LEN)
    blocks = param_count(LlamaConfig(**shape, vocab_size=0 + 1, tie_embeddings=False)) - 2 * d
    shape["vocab_size"] = max(64, (params - blocks) // (2 * d))
    return shape


def overrides(size_mib: int, system: str) -> list[str]:
    model = model_for(size_mib * MIB)
    return [*BASE, *(f"task.model.{k}={v}" for k, v in model.items()),
            f"run.name=sizes-{size_mib}-{system}", *SYSTEMS[system]]


# ---- the physical line ---------------------------------------------------------------------

def _rate(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3)


def physical(nbytes: int = 512 * MIB) -> dict:
    """GB/s of the movements everything else is compared with, measured now."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page once
    t0 = time.perf_counter()
    np.copyto(dst, src)
    memcpy = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh = bytearray(nbytes)
    np.frombuffer(fresh, np.uint8)[:] = 1
    first_touch = time.perf_counter() - t0
    del fresh
    t0 = time.perf_counter()
    hmac.new(b"k" * 32, memoryview(src), hashlib.sha256).digest()
    mac = time.perf_counter() - t0
    return {"bytes": nbytes, "memcpy_GBps": _rate(nbytes, memcpy),
            "first_touch_GBps": _rate(nbytes, first_touch),
            "socket_GBps": _rate(nbytes, _one_stream(src)),
            "hmac_sha256_GBps": _rate(nbytes, mac)}


def _one_stream(data: np.ndarray) -> float:
    """Seconds for one TCP stream over loopback to move ``data`` into a touched buffer."""
    listener = socket.create_server(("127.0.0.1", 0))
    sink = bytearray(data.nbytes)
    np.frombuffer(sink, np.uint8)[:] = 0

    def receive() -> None:
        conn, _ = listener.accept()
        view, got = memoryview(sink), 0
        with conn:
            while got < len(sink):
                got += conn.recv_into(view[got:])

    t = threading.Thread(target=receive)
    t.start()
    with socket.create_connection(listener.getsockname()) as s:
        t0 = time.perf_counter()
        s.sendall(memoryview(data))
        t.join()
        seconds = time.perf_counter() - t0
    listener.close()
    return seconds


# ---- one run -------------------------------------------------------------------------------

def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def movements(rd: RunDir, rec: dict) -> dict:
    """Seconds and GB/s of the state's movements the run recorded."""
    out: dict = {}
    steps = [m for m in rd.metrics if m.get("ram_copy_s")]
    ram = (rd.summary.get("protection") or {}).get("ram_tier") or {}
    copy_bytes = ram.get("copy_bytes")
    if steps:
        s = _median([float(m["ram_copy_s"]) for m in steps])
        out["pack"] = {"s": s, "GBps": _rate(copy_bytes, s) if copy_bytes and s else None}
    restores = rd.summary.get("restores") or []
    for r in restores:
        if r.get("restore_s") and r.get("nbytes"):
            out.setdefault("restore", {"s": round(float(r["restore_s"]), 3),
                                       "GBps": _rate(int(r["nbytes"]), float(r["restore_s"])),
                                       "tier": r.get("tier")})
    for phase, secs in (rec.get("phases_s") or {}).items():
        out.setdefault("phases", {})[phase] = secs
    return out


def measure(size_mib: int, system: str, run_dir: Path, *, timeout_s: float) -> dict:
    before = machine.load_average()
    t0 = time.time()
    code, rd = run_main(run_dir, overrides(size_mib, system), timeout_s=timeout_s)
    s = rd.summary
    rec = (s.get("recoveries") or [{}])[0]
    steady = [m for m in rd.metrics if 5 < m.get("step", 0) < AT_STEP]
    times = [float(m["step_time_s"]) for m in steady if m.get("step_time_s") is not None]
    copies = [float(m.get("ram_copy_s") or 0.0) for m in steady]
    first, boundary = rec.get("first_step_at"), rec.get("boundary_at")
    step = _median(times)
    downtime = round(first - boundary, 3) if first and boundary else None
    protection = s.get("protection") or {}
    return {"size_mib": size_mib, "system": system, "exit_code": code, "state": s.get("state"),
            "tier": (protection.get("ram_tier") or {}).get("enabled"),
            "tier_reason": (protection.get("ram_tier") or {}).get("reason"),
            "ram_every": [c.get("every") for c in protection.get("ram_every", [])],
            "median_step_s": step,
            "copy_s_per_step": round(sum(copies) / len(copies), 4) if copies else None,
            "to_first_step_s": rec.get("to_first_step_s"), "downtime_s": downtime,
            "not_training_s": round(downtime - step, 3) if downtime and step else None,
            "lost_steps": s.get("lost_steps"), "recovery_lost": rec.get("lost_steps"),
            "movements": movements(rd, rec), "wall_s": round(time.time() - t0, 1),
            "load_before": before, "load_after": machine.load_average(),
            "run_dir": str(run_dir)}


# ---- the table -----------------------------------------------------------------------------

def figures(runs: list[dict]) -> dict:
    out: dict = {}
    for size in sorted({r["size_mib"] for r in runs}):
        mine = {r["system"]: r for r in runs if r["size_mib"] == size}
        on, off = mine.get("kill") or mine.get("notice"), mine.get("off")
        ratio = (round(on["median_step_s"] / off["median_step_s"], 4)
                 if on and off and on["median_step_s"] and off["median_step_s"] else None)
        out[str(size)] = {
            "tier": on and on["tier"], "tier_reason": on and on["tier_reason"],
            "ram_every": on and on["ram_every"], "step_s": on and on["median_step_s"],
            "copy_share": (round(on["copy_s_per_step"] / on["median_step_s"], 4)
                           if on and on["copy_s_per_step"] is not None and on["median_step_s"]
                           else None),
            "step_ratio_on_off": ratio,
            "kill": {k: (mine.get("kill") or {}).get(k) for k in
                     ("state", "recovery_lost", "lost_steps", "to_first_step_s", "movements")},
            "notice": {k: (mine.get("notice") or {}).get(k) for k in
                       ("state", "downtime_s", "not_training_s", "movements")}}
    return out


def render(result: dict) -> str:
    v, line = result["validity"], result["physical"]
    rows = [f"sizes ({'VALID' if v['valid'] else 'NOT A RESULT'}: max 1-minute load before a "
            f"run {v['max_load_1min_before']}, threshold {v['threshold']})",
            f"physical line: memcpy {line['memcpy_GBps']} GB/s, first touch "
            f"{line['first_touch_GBps']} GB/s, one loopback TCP stream {line['socket_GBps']} "
            f"GB/s, HMAC-SHA256 {line['hmac_sha256_GBps']} GB/s", "",
            "| MiB/host | tier | every | step (s) | copies/step | on/off step | kill: lost, "
            "to first step (s) | notice: downtime, not training (s) |",
            "|---|---|---|---|---|---|---|---|"]
    for size, f in result["figures"].items():
        k, n = f["kill"], f["notice"]
        rows.append(f"| {size} | {'on' if f['tier'] else 'off'} | {f['ram_every']} | "
                    f"{f['step_s']} | {f['copy_share']} | {f['step_ratio_on_off']} | "
                    f"{k.get('recovery_lost')}, {k.get('to_first_step_s')} | "
                    f"{n.get('downtime_s')}, {n.get('not_training_s')} |")
    rows.append("")
    for size, f in result["figures"].items():
        rows.append(f"{size} MiB: kill movements {f['kill'].get('movements')}; notice "
                    f"movements {f['notice'].get('movements')}; tier: {f['tier_reason']}")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> Path | None:
    """Time vs size, log-log, beside the time the physical line would take."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sizes = [int(s) for s in result["figures"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, get in (("kill -9: failure → first step",
                        lambda f: f["kill"].get("to_first_step_s")),
                       ("notice: time not training", lambda f: f["notice"].get("not_training_s"))):
        pts = [(s, get(f)) for s, f in zip(sizes, result["figures"].values(), strict=True)
               if get(f)]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    line = result["physical"]
    xs = np.array(sizes, dtype=float)
    for label, rate in (("one memcpy of the share", line["memcpy_GBps"]),
                        ("one loopback TCP stream of the share", line["socket_GBps"])):
        ax.plot(xs, xs * MIB / (rate * 1e9), linestyle="--", label=label)
    ax.set(xscale="log", yscale="log", xlabel="train state per host (MiB)", ylabel="seconds",
           title="Protection vs state size (default config, CPU emulation)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=",".join(map(str, SIZES_MIB)),
                   help="MiB of train state per host, comma-separated")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"which runs per size, of {', '.join(SYSTEMS)}")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    systems = [s for s in args.systems.split(",") if s]
    if unknown := sorted(set(systems) - set(SYSTEMS)):
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    line = physical()
    cases = [f"{size}:{system}" for size in sizes for system in systems]
    runs, loads, started = interleave(
        "sizes", cases, args.repeats,
        lambda case, run_dir: measure(int(case.split(":")[0]), case.split(":")[1], run_dir,
                                      timeout_s=args.timeout_s),
        lambda out: (f"{out['state']} tier {out['tier']} lost {out['recovery_lost']} "
                     f"to first step {out['to_first_step_s']} downtime {out['downtime_s']}"))
    result = {"machine": machine.describe(), "settings": vars(args), "physical": line,
              "runs": runs, "figures": figures(runs), "validity": machine.validity(loads),
              "seconds": round(time.time() - started, 1)}
    path = write_result("sizes", args.out, result)
    png = plot(result, path.with_suffix(".png"))
    print(render(result))
    print(f"\nwritten: {path}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
