"""Executable-store scenarios on real JAX, run in subprocesses (the device count is fixed there).

``python -m tests.workers.exec_scenarios single --out F.json [NAME ...]``: one process with 4 CPU
devices; each scenario builds real ``HostActor``s over a fresh run directory and records what
the store did (``F.json``: scenario -> observations, or ``{"error": traceback}``).

``python -m tests.workers.exec_scenarios member --process-id I --num-processes N
--coordinator HOST:PORT --run-dir D --out F.json``: ONE process of a distributed JAX group (gloo,
2 CPU devices per process): initialise, build, restore (seed), compile or load, run 3 steps.
The assertions live in ``test_executables.py``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

OVERRIDES = ["model.num_layers=1", "model.d_model=32", "model.d_ff=64", "model.num_heads=2",
             "model.seq_len=16", "model.vocab_size=64", "train.global_batch=8",
             "train.warmup_steps=2", "run.total_steps=50"]
STEPS = 3


def make_actor(run_dir: Path, *, overrides: tuple[str, ...] = (), processes: int = 1,
               process_id: int = 0, devices: int = 4) -> Any:
    from orchestrator.config import load_config
    from orchestrator.shared.host_env import DIR_NAME
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import plan_mesh
    from workers.host.actor import HostActor

    cfg = load_config(None, [*OVERRIDES, *overrides])
    hosts = [HostRef(index=i, slice_name="local", worker_id=i, node_id=f"n{i}",
                     node_ip="127.0.0.1", instance=f"vm-{i}", devices=devices)
             for i in range(processes)]
    plan = plan_mesh(cfg, hosts, platform="cpu", hosts_per_slice=processes)
    spec = HostSpec.for_host(cfg, plan, plan.hosts[process_id],
                             checkpoint_dir=str(run_dir / "checkpoints"),
                             executables_dir=str(run_dir / DIR_NAME))
    return HostActor(spec, {})


def train(actor: Any, *, initialize: tuple[str, int, int] | None = None) -> dict:
    """initialize (optional), build, restore, compile, run STEPS steps; what each part said."""
    out: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if initialize is not None:
        out["init"] = actor.initialize(*initialize)
        seconds["initialize"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    actor.build()
    seconds["build"] = time.perf_counter() - t0
    out["restore"] = actor.restore()
    out["compile"] = actor.compile()
    t0 = time.perf_counter()
    run = actor.run_steps(STEPS, chunk=1, report=True)
    seconds["first_steps"] = time.perf_counter() - t0
    out["seconds"] = seconds
    # float.hex: bit-exact in JSON
    out["losses"] = [float(r["loss"]).hex() for r in run["records"]]
    out["step"] = run["step"]
    actor.shutdown()
    return out


def files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# ---- single-process scenarios -------------------------------------------------------------------

_BASE_STORE: Path | None = None
"""The base config's stored executables once ``roundtrip`` has made them: the scenarios after
it start from a copy, so their base group loads instead of compiling again (what they test is
what happens after the base)."""


def _seed(tmp: Path) -> None:
    if _BASE_STORE is not None and _BASE_STORE.is_dir():
        shutil.copytree(_BASE_STORE, tmp / "executables")


def roundtrip(tmp: Path) -> dict:
    """First actor compiles and stores; a second actor on the same run dir loads."""
    global _BASE_STORE
    first = train(make_actor(tmp))
    listed = files(tmp / "executables")
    second = train(make_actor(tmp))
    _BASE_STORE = Path(tempfile.mkdtemp(prefix="exec-base-")) / "executables"
    atexit.register(shutil.rmtree, _BASE_STORE.parent, True)
    shutil.copytree(tmp / "executables", _BASE_STORE)
    return {"first": first, "second": second, "files": listed,
            "files_after": files(tmp / "executables")}


# Every damage kind is refused at the file level without JAX
# (test_executables.py::test_a_damaged_file_is_refused_with_the_reason); here one goes through
# a real group: a checksum failure.
CORRUPTIONS = ("garble_body",)


def corrupt(tmp: Path) -> dict:
    """A damaged train_step file: compile instead (losses unchanged), and the file is rewritten
    so the next group loads again."""
    _seed(tmp)
    base = train(make_actor(tmp))
    root = tmp / "executables"
    (step_file,) = [p for p in root.iterdir() if p.name.startswith("train_step.")]
    out: dict[str, Any] = {"base": base}
    for kind in CORRUPTIONS:
        _damage(step_file, kind)
        got = train(make_actor(tmp))
        again = train(make_actor(tmp))
        out[kind] = {"compile": got["compile"], "losses": got["losses"],
                     "again": again["compile"]}
    return out


def _damage(path: Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "garble_body":
        path.write_bytes(data[:-2000] + os.urandom(1000) + data[-1000:])
    elif kind == "bad_header":
        first = data.index(b"\n") + 1
        path.write_bytes(data[:first] + b"{not json\n" + data[first:])
    elif kind == "not_ours":
        path.write_bytes(b"hello, this is not an executable\n")
    elif kind == "empty":
        path.write_bytes(b"")


def mismatch(tmp: Path) -> dict:
    """Another learning rate: a new key, so compile (the log reason names the ingredient); a
    stored file copied under the new key's name is refused by its header."""
    from workers.training.executables import file_name

    _seed(tmp)
    base = train(make_actor(tmp))
    other = train(make_actor(tmp, overrides=("train.learning_rate=0.001",)))
    root = tmp / "executables"
    # plant the base config's step file under the name a third config (seq_len 8) looks for
    third = make_actor(tmp, overrides=("model.seq_len=8",))
    third.build()
    wanted = file_name(third.trainer.executable_key("train_step"))
    (src,) = [p for p in root.iterdir()
              if p.name.startswith(f"train_step.{base['compile']['key']}.")]
    shutil.copy(src, root / wanted)  # its mode too: a group-writable copy would be refused
    third.restore()
    planted = third.compile()
    third.shutdown()
    return {"base": base, "other": other, "planted": planted, "probe": _probe_args(tmp)}


def _probe_args(tmp: Path) -> dict:
    """The base key's stored step asked for with other arguments: refused, not loaded."""
    import jax
    import jax.numpy as jnp

    probe = make_actor(tmp)
    probe.build()
    tr = probe.trainer
    key = tr.executable_key("train_step")

    def batch(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=tr.batch_sharding)

    out = {name: tr.executables.load(key, args=args).reason for name, args in (
        ("same", (tr.abstract_state, batch(tr.batch_shape.shape))),  # lm: one array
        ("shapes", (tr.abstract_state, batch((1, 4, 16)))),
        ("tree", (tr.abstract_state,)))}
    probe.shutdown()
    return out


def off(tmp: Path) -> dict:
    """compile.cache=off: compiled, no key, nothing written (so the next group compiles too)."""
    first = train(make_actor(tmp, overrides=("compile.cache=off",)))
    return {"first": first, "exists": (tmp / "executables").exists()}


def unwritable(tmp: Path) -> dict:
    """RUN_DIR/executables is a file: nothing can be stored; the group compiles and trains."""
    (tmp / "executables").write_text("in the way")
    return {"first": train(make_actor(tmp)), "in_the_way": (tmp / "executables").read_text()}


SCENARIOS: dict[str, Callable[[Path], dict]] = {
    "roundtrip": roundtrip, "corrupt": corrupt, "mismatch": mismatch, "off": off,
    "unwritable": unwritable}


def single(args: argparse.Namespace) -> int:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    results: dict[str, Any] = {}
    for name in args.names or list(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix=f"exec-{name}-") as tmp:
            t0 = time.perf_counter()
            try:
                results[name] = SCENARIOS[name](Path(tmp))
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            print(f"{name}: {time.perf_counter() - t0:.1f}s", flush=True)
    Path(args.out).write_text(json.dumps(results, default=str))
    return 0


# ---- one member of a distributed group ----------------------------------------------------------

def member(args: argparse.Namespace) -> int:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        actor = make_actor(Path(args.run_dir), processes=args.num_processes,
                           process_id=args.process_id, devices=args.devices,
                           overrides=tuple(args.override))
        t0 = time.perf_counter()
        out = train(actor, initialize=(args.coordinator, args.num_processes, args.process_id))
        out["wall_s"] = time.perf_counter() - t0
    except Exception:
        out = {"error": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(out, default=str))
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("single")
    s.add_argument("--out", required=True)
    s.add_argument("names", nargs="*")
    m = sub.add_parser("member")
    m.add_argument("--process-id", type=int, required=True)
    m.add_argument("--num-processes", type=int, required=True)
    m.add_argument("--coordinator", required=True)
    m.add_argument("--run-dir", required=True)
    m.add_argument("--devices", type=int, default=2)
    m.add_argument("--out", required=True)
    m.add_argument("--override", action="append", default=[], help="a RunConfig key=value")
    args = p.parse_args(argv)
    return single(args) if args.mode == "single" else member(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
