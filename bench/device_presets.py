"""The realistic presets on one accelerator, for the record: the llama task's step at the
``1b`` shape (and the ``8b`` shape cut to a few layers), its MFU from the task's analytic FLOPs
against XLA's cost analysis of the compiled step, the executable's store and load at that size
(``workers.training.executables.ExecutableStore``), and the RAM tier's device→host copy
(``workers.ram.replica.Packer``) and restore (``place``).

No Ray, no cluster: one process, the task contract's own pieces (``workers.task.llama``,
``workers.task.state.train_step``). Run where a GPU or TPU is lent (``bench/RESULTS.md``
"Realistic presets on a device" has the figures and the device)::

    python -m bench.device_presets --out results/device.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # before JAX's backend starts

import jax
import jax.numpy as jnp
import numpy as np

from bench import machine
from orchestrator.shared.sections import TrainConfig
from workers.ram.replica import Packer, place
from workers.task.contract import TaskContext
from workers.task.llama import LlamaSettings, make_task
from workers.task.state import init_boxed, init_unboxed, train_step
from workers.training import memory
from workers.training.executables import ExecutableStore, executable_key

PEAK_BF16 = {"H100 PCIe": 756.0e12, "H100": 989.4e12, "H200": 989.4e12}
"""Dense bf16 tensor-core peaks (NVIDIA's H100 / H200 datasheets, without sparsity), matched
in this order against the device kind: an H100 that is not PCIe is the SXM part."""

CASES = (
    # name, preset, overrides, global batch
    ("tiny", "tiny", {}, 4),  # a check of this script on CPU
    ("1b", "1b", {"remat": True}, 1),
    ("8b-shape-4-layers", "8b", {"remat": True, "num_layers": 4}, 1),
)


def _peak(device) -> tuple[float | None, str]:
    kind = getattr(device, "device_kind", "")
    for name, value in PEAK_BF16.items():
        if name in kind:
            return value, f"{name} datasheet bf16 dense"
    return None, "unknown device"


def _matmul_peak(n: int = 8192) -> float:
    a = jnp.ones((n, n), jnp.bfloat16)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def hlo_flops(preset: str, overrides: dict, ctx: TaskContext, batch_shape: tuple) -> float:
    """XLA's FLOP count of the plain step (layers unrolled, no remat), from its HLO lowered for
    CPU: a scanned layer stack is counted once by ``cost_analysis``, a GPU compile leaves out
    its cuBLAS GEMMs and a GPU lowering gives no count. Tracing only: nothing is allocated."""
    flat = make_task(LlamaSettings(preset=preset, model={**overrides, "scan_layers": False,
                                                         "remat": False}), ctx)
    state = jax.eval_shape(functools.partial(init_unboxed, flat), jax.random.key(0))
    batch = jax.ShapeDtypeStruct(batch_shape, jnp.int32)
    cost = (jax.jit(functools.partial(train_step, flat)).trace(state, batch)
            .lower(lowering_platforms=("cpu",)).cost_analysis())
    cost = cost[0] if isinstance(cost, list) else cost
    return float((cost or {}).get("flops", float("nan")))


def _case(preset: str, overrides: dict, batch: int) -> tuple[LlamaSettings, TaskContext, Any]:
    """A case's settings, the context its task is made with, and the task."""
    settings = LlamaSettings(preset=preset, model=overrides)
    ctx = TaskContext(train=TrainConfig(global_batch=batch), total_steps=1000, seed=0)
    return settings, ctx, make_task(settings, ctx)


def _abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of ``tree``'s arrays (what a load or a place is given)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def _timed_step(step: Any, state: Any, batch: Any) -> tuple[Any, Any, float]:
    """One step, waited for: the new state, its metrics and the seconds it took."""
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    return state, metrics, time.perf_counter() - t0


def count_case(name: str, preset: str, overrides: dict, batch: int) -> dict:
    """The FLOP counts alone: the task's analytic count and XLA's count of the plain step."""
    settings, ctx, task = _case(preset, overrides, batch)
    shape = (1, batch, settings.config().seq_len)
    hlo = hlo_flops(preset, overrides, ctx, shape)
    return {"case": name, "analytic_flops": float(task.flops_per_step), "xla_flops_hlo": hlo,
            "hlo_over_analytic": hlo / task.flops_per_step}


def run_case(name: str, preset: str, overrides: dict, batch: int, *, steps: int) -> dict:
    settings, ctx, task = _case(preset, overrides, batch)
    cfg = settings.config()
    out: dict = {"case": name, "preset": preset, "overrides": overrides, "global_batch": batch,
                 "seq_len": cfg.seq_len}
    device = jax.devices()[0]

    boxed = jax.eval_shape(functools.partial(init_boxed, task), jax.random.key(0))
    est = memory.estimate(boxed, mesh_shape={"data": 1, "fsdp": 1, "tensor": 1},
                          devices_per_host=1, rules=task.all_rules())
    out["estimate"] = est.human()
    out["estimate_device_bytes"] = est.device_total
    limit = (device.memory_stats() or {}).get("bytes_limit")
    out["device_bytes_limit"] = limit
    try:
        memory.check_fits(est, device_bytes=limit, host_bytes=None)
        out["fits"] = "yes"
    except memory.DoesNotFit as exc:
        out["fits"] = f"refused: {exc}"
        return out

    t0 = time.perf_counter()
    state = jax.jit(functools.partial(init_unboxed, task))(jax.random.key(0))
    jax.block_until_ready(state)
    out["init_s"] = time.perf_counter() - t0
    n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    out["parameters"] = int(n_params)
    rows = task.data.rows(0, 0, range(batch))
    batch_arr = jnp.asarray(rows)[None]  # (accum=1, micro, seq)

    step = jax.jit(functools.partial(train_step, task), donate_argnums=0)
    t0 = time.perf_counter()
    lowered = step.lower(state, batch_arr)
    compiled = lowered.compile()
    out["compile_s"] = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out["xla_flops_compiled"] = float((cost or {}).get("flops", float("nan")))
    out["analytic_flops"] = float(task.flops_per_step)
    out["xla_flops_hlo"] = hlo_flops(preset, overrides, ctx, batch_arr.shape)
    mem = compiled.memory_analysis()
    if mem is not None:
        out["temp_bytes"] = int(getattr(mem, "temp_size_in_bytes", 0))

    times = []
    for _ in range(steps):
        state, metrics, seconds = _timed_step(compiled, state, batch_arr)
        times.append(seconds)
    out["step_s"] = times
    steady = float(np.median(times[2:])) if len(times) > 2 else times[-1]
    out["step_s_median"] = steady
    out["loss"] = float(metrics["loss"])
    peak, source = _peak(device)
    out["peak_flops"], out["peak_source"] = peak, source
    if peak:
        out["mfu_analytic"] = task.flops_per_step / steady / peak
        out["mfu_xla_hlo"] = out["xla_flops_hlo"] / steady / peak
    out["tokens_per_s"] = batch * (cfg.seq_len - 1) / steady

    # the executable tier at this size: store, then load into this process, and its first run
    with tempfile.TemporaryDirectory() as tmp:
        store = ExecutableStore(Path(tmp) / "exe", key_file=str(Path(tmp) / "key"))
        key = executable_key(function="train_step", runtime={"jax": jax.__version__},
                             config={"case": name}, mesh={"devices": 1}, process_index=0,
                             process_count=1)
        out["exe_save_s"] = store.save(key, compiled)
        files = list((Path(tmp) / "exe").glob("*"))
        out["exe_bytes"] = sum(f.stat().st_size for f in files)
        found = store.load(key, args=_abstract((state, batch_arr)))
        out["exe_load_s"] = found.load_s if found.compiled is not None else found.reason
        if found.compiled is not None:
            state, _, out["loaded_first_step_s"] = _timed_step(found.compiled, state, batch_arr)
            state, _, out["loaded_second_step_s"] = _timed_step(found.compiled, state, batch_arr)

    # the RAM tier's copy of this process's shards (all of them: one device) and its restore
    packer = Packer(state)
    t0 = time.perf_counter()
    layout, data = packer.pack(state)
    out["ram_pack_s"] = time.perf_counter() - t0
    del data
    t0 = time.perf_counter()  # every shard's device->host copy started at once, then packed
    for leaf in jax.tree.leaves(state):
        leaf.copy_to_host_async()
    layout, data = packer.pack(state)
    out["ram_pack_async_s"] = time.perf_counter() - t0
    out["ram_copy_bytes"] = len(data)
    out["ram_pack_gb_s"] = len(data) / out["ram_pack_s"] / 1e9
    abstract_state = _abstract(state)
    del state
    t0 = time.perf_counter()
    restored = place([(layout, bytes(data))], abstract_state)
    jax.block_until_ready(restored)
    out["ram_unpack_s"] = time.perf_counter() - t0
    del restored, data
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="device-presets.json")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--cases", default="1b,8b-shape-4-layers")
    parser.add_argument("--hlo-only", action="store_true",
                        help="only the analytic and HLO FLOP counts (no device work; any machine)")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    record: dict = {"jax": jax.__version__, "device": str(device),
                    "device_kind": getattr(device, "device_kind", ""),
                    "platform": device.platform, "cases": []}
    if device.platform != "cpu":
        record["matmul_peak_bf16_8192"] = _matmul_peak()
    print(json.dumps({k: v for k, v in record.items() if k != "cases"}), flush=True)
    wanted = set(args.cases.split(","))
    for name, preset, overrides, batch in CASES:
        if name not in wanted:
            continue
        before = machine.load_average()
        try:
            if args.hlo_only:
                result = count_case(name, preset, overrides, batch)
            else:
                result = run_case(name, preset, overrides, batch, steps=args.steps)
        except Exception as exc:  # keep the other cases' figures
            result = {"case": name, "error": f"{type(exc).__name__}: {exc}"[:2000],
                      "traceback": traceback.format_exc()[-3000:]}
        record["cases"].append(result)
        record.setdefault("loads", []).append({"measurement": name, "before": before,
                                               "after": machine.load_average()})
        record["validity"] = machine.validity(record["loads"])
        print(json.dumps(result, default=str), flush=True)
        Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
