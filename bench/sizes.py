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
import shutil
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench import machine
from bench.orchestrated import RunDir, read_jsonl, run_main
from bench.sidebyside import interleave, write_result

MIB = 1024**2
SIZES_MIB = (1, 64, 256, 1024, 2048)
AT_STEP = 25
BASE = ["cluster.emulate.spare_slices=1", "metrics.console_every_steps=0",
        "controller.checkpoint_interval.every_steps=10", "run.total_steps=40",
        "task.kind=llama", "train.global_batch=8"]
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
SEQ_LEN = 32


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


def overrides(size_mib: int, system: str, *, at_step: int = AT_STEP,
              total_steps: int | None = None) -> list[str]:
    """The run's settings: ``BASE``, the shape of ``size_mib`` per host, the ``system``'s event
    (``at_step`` moves it; ``total_steps`` shortens the run)."""
    model = model_for(size_mib * MIB)
    event = [o.replace(f"at_step: {AT_STEP},", f"at_step: {at_step},") for o in SYSTEMS[system]]
    steps = [] if total_steps is None else [f"run.total_steps={total_steps}"]
    return [*BASE, *(f"task.model.{k}={v}" for k, v in model.items()),
            f"run.name=sizes-{size_mib}-{system}", *event, *steps]


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
    for line in read_jsonl(rd.path / "driver.log.jsonl"):
        if line.get("message") == "ram_restore_parts":  # the slowest host's parts
            hosts = line.get("hosts") or []
            if hosts and "restore" in out:
                out["restore"]["parts_s"] = max(hosts, key=lambda h: sum(
                    v for k, v in h.items() if k != "nbytes" and isinstance(v, int | float)))
    saved = (rec.get("phases_s") or {}).get("CHECKPOINTING")
    if saved and copy_bytes and ram.get("enabled") and rec.get("kind") != "unannounced":
        out["drain_copy"] = {"s": saved, "GBps": _rate(copy_bytes, saved)}
    for phase, secs in (rec.get("phases_s") or {}).items():
        out.setdefault("phases", {})[phase] = secs
    return out


BULKY = ("checkpoints", "checkpoints-from-ram", "executables")
"""What a measured run leaves that the table does not read: GiBs per run at these sizes (a sweep
once filled this machine's disk and failed a run's final save)."""


def measure(size_mib: int, system: str, run_dir: Path, *, timeout_s: float) -> dict:
    try:
        return _measure(size_mib, system, run_dir, timeout_s=timeout_s)
    finally:
        for name in BULKY:
            shutil.rmtree(run_dir / name, ignore_errors=True)


def _measure(size_mib: int, system: str, run_dir: Path, *, timeout_s: float) -> dict:
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
            "| MiB/host | tier | every | step (s) | copies' share of a step | on/off step | "
            "kill: lost, to first step (s) | notice: downtime, not training (s) |",
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
                        ("one loopback TCP stream of the share", line["socket_GBps"]),
                        ("the share's first touch (fresh memory)", line["first_touch_GBps"])):
        ax.plot(xs, xs * MIB / (rate * 1e9), linestyle="--", label=label)
    ax.set(xscale="log", yscale="log", xlabel="train state per host (MiB)", ylabel="seconds",
           title="Protection vs state size (default config, CPU emulation)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--fit" or a.startswith("--fit=") for a in argv):
        return fit_main(argv)  # calibrate the simulator from a result instead
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


# ---- calibration of the simulator (issue 48 item 5) ----------------------------------------

WRITE_CAP_GBPS = 10_000.0
"""Gbit/s standing for a movement that took no measurably longer with more bytes."""


def _movement_points(result: dict) -> dict[str, list[tuple[int, float]]]:
    """(bytes per host, seconds) per movement over the sweep's runs: ``pack`` (the copy into
    host memory), ``restore`` (from the RAM tier; ``durable_restore`` from Orbax), ``handover``
    (a notice's CHECKPOINTING with the tier on) and ``save`` (a recorded save, or the notice's
    CHECKPOINTING with the tier off: the drain saved durably)."""
    out: dict[str, list[tuple[int, float]]] = {}

    def add(name: str, seconds: object, nbytes: int) -> None:
        if isinstance(seconds, int | float) and seconds > 0 and nbytes > 0:
            out.setdefault(name, []).append((nbytes, float(seconds)))

    for r in result.get("runs") or []:
        nbytes, m = int(r["size_mib"]) * 2**20, r.get("movements") or {}
        add("pack", (m.get("pack") or {}).get("s"), nbytes)
        restore = m.get("restore") or {}
        add("restore" if restore.get("tier", "ram") == "ram" else "durable_restore",
            restore.get("s"), nbytes)
        add("save", (m.get("save") or {}).get("s"), nbytes)
        if r.get("system") == "notice":
            add("handover" if r.get("tier") else "save",
                (m.get("phases") or {}).get("CHECKPOINTING"), nbytes)
    return out


def _line(points: list[tuple[int, float]]) -> dict:
    """seconds = latency + bytes / rate, least squares over ``points``. One size: latency 0 and
    the rate through the origin; a negative latency is refitted through the origin, and a time
    that does not grow with the size gives no rate (its mean as the latency)."""
    import math

    xs, ys = [float(x) for x, _ in points], [y for _, y in points]
    if len(set(xs)) < 2:
        a, b = 0.0, sum(ys) / sum(xs)
    else:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        b = (sum((x - mx) * (y - my) for x, y in points)
             / sum((x - mx) ** 2 for x in xs))
        a = my - b * mx
        if b <= 0:
            a, b = my, 0.0
        elif a < 0:
            a, b = 0.0, sum(x * y for x, y in points) / sum(x * x for x in xs)
    rms = math.sqrt(statistics.fmean([(a + b * x - y) ** 2 for x, y in points]))
    return {"latency_s": round(a, 4), "s_per_GB": round(b * 1e9, 5),
            "GBps": round(1.0 / (b * 1e9), 3) if b > 0 else None, "points": len(points),
            "sizes_mib": sorted({x // 2**20 for x, _ in points}), "rms_s": round(rms, 4)}


def _gbps(s_per_gb: float) -> float:
    """Gbit/s (the simulator's unit) of a movement taking ``s_per_gb`` seconds per GB."""
    return float(f"{8.0 / s_per_gb:.4g}") if s_per_gb > 0 else WRITE_CAP_GBPS


def _sim_settings(lines: dict[str, dict]) -> tuple[dict, list[str]]:
    """The simulator's RAM tier (and restore base) that reproduce the fitted lines: a save
    blocks for the pack, a drain's save is the pack then the commit (``latency_s`` + the
    write), a restore is ``restore_base_s`` + ``latency_s`` + the read."""
    from orchestrator.sim.config import RamTier

    ram: dict[str, float] = {}
    notes: list[str] = []
    pack, hand, rest = lines.get("pack"), lines.get("handover"), lines.get("restore")
    if pack:
        ram["blocking_s"] = pack["latency_s"]
        ram["copy_gbps"] = _gbps(pack["s_per_GB"])
    if hand:
        blocking = ram.get("blocking_s", RamTier().blocking_s)
        ram["latency_s"] = round(max(0.0, hand["latency_s"] - blocking), 4)
        write = hand["s_per_GB"] - (pack["s_per_GB"] if pack else 0.0)
        ram["write_gbps"] = _gbps(write)
        if write <= 0:
            notes.append("the hand-over took no longer per byte than the pack: write_gbps "
                         f"{WRITE_CAP_GBPS:g} stands for no measurable write")
    else:
        notes.append("no notice run with the tier on: write_gbps and latency_s keep the RAM "
                     "tier's defaults")
    reform: dict[str, float] = {}
    if rest:
        ram["read_gbps"] = _gbps(rest["s_per_GB"])
        latency = ram.get("latency_s", RamTier().latency_s)
        reform["restore_base_s"] = round(max(0.0, rest["latency_s"] - latency), 4)
    sim: dict = {"checkpoint": {"tiers": {"ram": ram}}} if ram else {}
    if reform:
        sim["reform"] = reform
    return sim, notes


def fit(result: dict) -> dict:
    """Per movement of a sweep's result (``bench/results/sizes-*.json``), seconds = latency +
    bytes per host / GB/s by least squares over the sizes, and the simulator's settings
    (``checkpoint.tiers.ram``, ``reform.restore_base_s``) that reproduce them, as YAML."""
    import yaml

    lines = {name: _line(points)
             for name, points in sorted(_movement_points(result).items())}
    sim, notes = _sim_settings(lines)
    return {"valid": (result.get("validity") or {}).get("valid"),
            "sizes_mib": sorted({int(r["size_mib"]) for r in result.get("runs") or []}),
            "lines": lines, "sim": sim, "notes": notes,
            "yaml": yaml.safe_dump(sim, default_flow_style=None, sort_keys=False)}


def render_fit(fitted: dict) -> str:
    rows = [f"fit over sizes {fitted['sizes_mib']} MiB per host"
            + ("" if fitted["valid"] else " (from a result that is NOT A RESULT)"),
            "| movement | latency (s) | GB/s | points | rms (s) |", "|---|---|---|---|---|"]
    for name, ln in fitted["lines"].items():
        rows.append(f"| {name} | {ln['latency_s']} | {ln['GBps']} | {ln['points']} | "
                    f"{ln['rms_s']} |")
    rows += ["", "simulator settings (rates in Gbit/s):", fitted["yaml"].rstrip()]
    rows += [f"note: {n}" for n in fitted["notes"]]
    return "\n".join(rows)


def fit_main(argv: list[str]) -> int:
    """``python -m bench.sizes --fit RESULT.json``: the fitted lines and the sim's YAML."""
    import json

    p = argparse.ArgumentParser(prog="python -m bench.sizes --fit",
                                description="fit a size sweep's movements for the simulator")
    p.add_argument("--fit", required=True, metavar="RESULT.json",
                   help="a bench/results/sizes-*.json")
    args = p.parse_args(argv)
    try:
        result = json.loads(Path(args.fit).read_text())
        fitted = fit(result)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot fit {args.fit}: {exc!r}; pass a result written by "
              "python -m bench.sizes (bench/results/sizes-*.json)", file=sys.stderr)
        return 2
    if not fitted["lines"]:
        print(f"error: {args.fit} records no movement to fit; pass a sweep with the tier on "
              "(systems kill or notice)", file=sys.stderr)
        return 2
    print(render_fit(fitted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
