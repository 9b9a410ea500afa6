"""RAM-tier copies on real JAX, in ONE plain process with 4 CPU devices (no Ray).

Run as ``python -m tests.workers.replica_scenarios --out F.json``: the device count is fixed in
that subprocess, never in pytest's. Real ``HostActor``s train a few steps, ``workers.ram.replica``
packs their state, and the copies are restored into the same mesh and into a different one
(fsdp=4 -> fsdp=2 x tensor=2); the results are compared with an uninterrupted actor's.
Assertions live in ``test_replica.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from tests.workers.host_scenarios import make_actor


def _params_equal(a: dict, b: dict) -> bool:
    import numpy as np

    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _flat(params: Any) -> dict:
    import jax
    import numpy as np

    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(params)}


def run(tmp: Path) -> dict:
    from tests.workers.ram_testing import TOKEN, damage, holder, put
    from workers.ram import replica

    out: dict[str, Any] = {}
    plain = make_actor(tmp / "plain")
    plain.restore()
    plain.compile()
    plain.run_steps(6, chunk=1)
    want = _flat(plain.params())

    src = make_actor(tmp / "src")
    src.restore()
    src.compile()
    src.run_steps(3, chunk=1)
    layout, data = replica.pack(src.trainer.state)
    out["pieces"] = len(layout["pieces"])
    out["nbytes"] = len(data)
    h = holder()
    put(h, "node-a", 3, data, layout=layout)

    def copy(step: int = 3) -> dict:
        return {"node-a": h.get(TOKEN, incarnation=1, step=step, source=0)}

    # the same mesh: restore, train on, compare with the uninterrupted run
    same = make_actor(tmp / "same")
    got = same.restore_copies(3, copy(), TOKEN)
    out["same_restore"] = got
    same.compile()
    same.run_steps(6, chunk=1)
    out["same_equal"] = _params_equal(_flat(same.params()), want)

    # another mesh: fsdp=2 x tensor=2 instead of fsdp=4
    other = make_actor(tmp / "other", overrides=("mesh.ici.fsdp=2", "mesh.ici.tensor=2"))
    out["other_axes"] = dict(other.trainer.mesh.shape)
    out["other_restore"] = other.restore_copies(3, copy(), TOKEN)
    out["other_params_equal_at_3"] = _params_equal(_flat(other.params()),
                                                   _flat(src.params()))

    # a copy of another step, or under another run's secret, is refused before it is used
    bad = make_actor(tmp / "bad")
    out["wrong_step_restore"] = bad.restore_copies(4, copy(), TOKEN)
    out["other_secret_restore"] = bad.restore_copies(3, copy(), "another-run")
    # a damaged copy is refused by the reader, and by the holder's inventory
    damage(h, step=3, source=0)
    out["inventory_after_damage"] = h.inventory(TOKEN)
    out["damaged_restore"] = bad.restore_copies(3, copy(), TOKEN)

    # half the pieces: incomplete; another model: refused
    half = dict(layout, pieces=layout["pieces"][: len(layout["pieces"]) // 2])
    out["incomplete"] = _refusal(lambda: replica.place([(half, data)],
                                                        src.trainer.abstract_state))
    bigger = make_actor(tmp / "bigger", overrides=("model.d_model=64",))
    out["other_model"] = _refusal(lambda: replica.place([(layout, data)],
                                                         bigger.trainer.abstract_state))
    # keep: a holder keeps the newest `keep` steps of each writer
    for step in (4, 5):
        put(h, "node-a", step, data, layout=layout)
    out["kept_steps"] = sorted(c["step"] for c in h.inventory(TOKEN))
    out["disk"] = _disk_copies(tmp / "copies", layout, data, src, tmp)
    # the sender's path: a Packer made once packs every later state like pack()
    packer = replica.Packer(src.trainer.state)
    first = packer.pack(src.trainer.state)
    src.run_steps(5, chunk=2)
    out["packer_equals_pack"] = (first == (layout, data)
                                 and packer.pack(src.trainer.state) == replica.pack(
                                     src.trainer.state))
    # a released buffer is the next pack's (its pages already touched), with the same bytes
    _, used = packer.pack(src.trainer.state)
    packer.release(used)
    _, again = packer.pack(src.trainer.state)
    out["packer_reuses_released"] = again is used and again == replica.pack(src.trainer.state)[1]
    # a host fetches only the sources holding a piece of its shards; placing from too few
    # pieces is refused
    empty = dict(layout, pieces=[])
    out["needed_sources"] = replica.needed_sources({0: layout, 1: empty},
                                                   src.trainer.abstract_state)
    out["incomplete_placed"] = _refusal(lambda: replica.place([(half, data)],
                                                              src.trainer.abstract_state))
    # a state on another mesh: refused, never packed into the wrong places
    out["packer_other_mesh"] = _refusal(lambda: packer.pack(other.trainer.state))
    for a in (plain, src, same, other, bigger, bad):
        a.shutdown()
    return out


def _disk_copies(where: Path, layout: dict, data: bytes, src: Any, tmp: Path) -> dict:
    """The holders' durable save (copy_store): a step is complete only with every source;
    it reads back bit-identical and restores; prune keeps the newest."""
    from tests.workers.ram_testing import TOKEN, copy_header
    from workers.ram import copy_store

    out: dict[str, Any] = {}
    macs: dict[tuple[int, int], str] = {}

    def write(step: int, source: int) -> bool:
        h = copy_header(step, data, source=source, sources=2, layout=layout)
        macs[step, source] = h["mac"]
        return copy_store.write(where, step=step, source=source, sources=2, incarnation=1,
                                layout=layout, data=data, mac=h["mac"])

    out["first_of_two_completes"] = write(3, 0)
    out["complete_after_one"] = copy_store.complete_steps(where)
    out["second_completes"] = write(3, 1)
    out["complete_after_two"] = copy_store.complete_steps(where)
    back = copy_store.read(where, step=3, source=0)
    out["read_back_equal"] = back["data"] == data and back["mac"] == macs[3, 0]
    restored = make_actor(tmp / "from-disk").restore_copies(3, {"disk": back}, TOKEN)
    out["restore_ok"] = restored["ok"]
    for source in (0, 1):
        write(4, source)
    out["pruned"] = copy_store.prune(where, keep=1)
    out["after_prune"] = copy_store.complete_steps(where)
    return out


def _refusal(fn) -> str:
    try:
        fn()
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory(prefix="replica-") as tmp:
        try:
            result = run(Path(tmp))
        except Exception:
            result = {"error": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
