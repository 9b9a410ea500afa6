"""In ONE plain process (no Ray) with 2 CPU devices: a Trainer saves to Orbax and packs a RAM
copy, and fresh Trainers restore from each; prints where each restore resumed the data as JSON.

``python -m tests.tasks.data_position_run (--data DIR | --stateful)``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data")
    p.add_argument("--stateful", action="store_true")
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    from tests.tasks.local_run import _spec
    from workers.ram import replica
    from workers.training.trainer import Trainer

    if args.stateful:
        task = ["task.kind=tests.tasks.stateful_task:make_task"]
    else:
        from tests.input.conftest import SEQ_LEN, VOCAB
        task = ["task.kind=examples.text_lm.task:make_task", f"task.vocab_size={VOCAB}",
                f"task.seq_len={SEQ_LEN}", "task.d_model=16", "task.num_layers=1",
                "task.num_heads=2", "task.d_ff=32", f"task.data.dir={args.data}"]
    overrides = [*task, "run.total_steps=10", "train.global_batch=4", "compile.cache=off"]
    out: dict = {}
    with tempfile.TemporaryDirectory() as ckpt:
        ns = argparse.Namespace(devices=2, overrides=overrides, accum=1, store=None)
        _, spec = _spec(ns, ckpt)
        first = Trainer(spec)
        first.init_state(spec.seed)
        out["seed"] = first.data_resumed
        for _ in range(3):
            first.train_step()
        first.save(wait=True)
        layout, body = replica.pack(first.state)
        copy = ({**layout, "data": first.data_record()}, bytes(body))
        out["saved_cursor"] = getattr(first.task.data, "cursor", None)
        first.close()
        with open(os.path.join(ckpt, "3", "data", "metadata")) as fh:
            item = json.load(fh)
        out["orbax_item"] = item
        for tier, restore in (("durable", lambda t: t.restore()),
                              ("ram", lambda t: t.restore_from_copies(3, [copy])),
                              ("ram_without_record", lambda t: t.restore_from_copies(
                                  3, [({k: v for k, v in copy[0].items() if k != "data"},
                                       copy[1])]))):
            tr = Trainer(spec)
            if hasattr(tr.task.data, "cursor"):
                tr.task.data.cursor, tr.task.data.restored = 0, []
            try:
                restore(tr)
                out[tier] = {"where": tr.data_resumed, "step": tr.step,
                             "cursor": getattr(tr.task.data, "cursor", None)}
            except Exception as exc:
                out[tier] = {"error": f"{type(exc).__name__}: {exc}"}
            tr.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
