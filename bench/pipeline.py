"""``python -m bench.pipeline``: does the real input pipeline slow the step down?

The same tiny decoder LM (``workers/training/model.py``) and jitted AdamW step, fed two ways in
interleaved pairs (A B, then B A, ...): **synthetic** batches made in memory before timing (no
input cost at all), and the **pipeline**: ``workers.input.TokenSource.rows`` over a prepared
directory (default: the shipped corpus, prepared into a temporary directory), with its
read-ahead threads. Each timed step is fetch + ``device_put`` + step + ``block_until_ready``.
Prints the median step time of each, their ratio (pipeline / synthetic; 1.00 means loading is
fully off the step), the prefetch hits, and the 1-minute load before and after: numbers taken
on a busy machine (load above ``bench.machine.IDLE_LOAD_1MIN``) are flagged, not to be trusted.

    python -m bench.pipeline [--data DIR] [--pairs 5] [--steps 30] [--batch 16] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np

from bench.machine import IDLE_LOAD_1MIN, load_average

SEED = 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="a prepared directory (default: prepare the "
                   "shipped corpus into a temporary one)")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=30, help="timed steps per arm and pair")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--prefetch", type=int, default=2, help="steps read ahead")
    return p.parse_args(list(argv))


def _prepare_shipped(seq_len: int) -> str:
    from pathlib import Path

    from orchestrator.data.prepare import PrepareConfig, prepare

    corpus = Path(__file__).resolve().parents[1] / "examples" / "data"
    out = tempfile.mkdtemp(prefix="bench-pipeline-") + "/data"
    prepare(PrepareConfig(inputs=(str(corpus),), out=out, seq_len=seq_len, shard_size=1024),
            progress=False)
    return out


def _step_fn(args: argparse.Namespace, vocab: int) -> tuple[Callable, object, object]:
    import jax
    import jax.numpy as jnp
    import optax

    from orchestrator.config import ModelConfig
    from workers.training.model import build_model

    cfg = ModelConfig(vocab_size=vocab, d_model=args.d_model, num_layers=args.layers,
                      num_heads=4, d_ff=4 * args.d_model, seq_len=args.seq_len)
    model = build_model(cfg)
    params = model.init(jax.random.key(SEED),
                        jnp.zeros((1, args.seq_len - 1), jnp.int32))["params"]
    tx = optax.adamw(1e-3)

    def loss(p, tokens):
        logits = model.apply({"params": p}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(p, opt, tokens):
        value, grads = jax.value_and_grad(loss)(p, tokens)
        updates, opt = tx.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt, value

    return step, params, tx.init(params)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import jax

    from orchestrator.data.manifest import load
    from orchestrator.data.settings import DataSettings
    from workers.input import open_source

    load_before = load_average()
    data = args.data or _prepare_shipped(args.seq_len)
    vocab = load(data).vocab_size
    source = open_source(DataSettings(dir=data, prefetch_steps=args.prefetch), seq_len=args.seq_len,
                         vocab_size=vocab, global_batch=args.batch)
    step, params, opt = _step_fn(args, vocab)
    rng = np.random.default_rng(SEED)
    pool = [rng.integers(0, vocab, (args.batch, args.seq_len), dtype=np.int32)
            for _ in range(8)]
    feeds = {"synthetic": lambda s: pool[s % len(pool)],
             "pipeline": lambda s: source.rows(SEED, s, range(args.batch))}
    state = {"params": params, "opt": opt, "next": {"synthetic": 0, "pipeline": 0}}

    def run(arm: str, n: int) -> list[float]:
        times = []
        for _ in range(n):
            s = state["next"][arm]
            state["next"][arm] += 1
            t0 = time.perf_counter()
            tokens = jax.device_put(feeds[arm](s))
            state["params"], state["opt"], value = step(state["params"], state["opt"], tokens)
            value.block_until_ready()
            times.append(time.perf_counter() - t0)
        return times

    run("synthetic", 2)
    run("pipeline", 2)  # compiled, pipeline warm
    medians: dict[str, list[float]] = {"synthetic": [], "pipeline": []}
    for pair in range(args.pairs):
        order = ("synthetic", "pipeline") if pair % 2 == 0 else ("pipeline", "synthetic")
        for arm in order:
            medians[arm].append(statistics.median(run(arm, args.steps)))
    source_stats = source.prefetch_stats
    source.close()
    if args.data is None:
        shutil.rmtree(os.path.dirname(data), ignore_errors=True)
    load_after = load_average()
    synth, real = (statistics.median(medians[a]) for a in ("synthetic", "pipeline"))
    print(f"data: {data} ({source.n} records of {args.seq_len} tokens, batch {args.batch})")
    print(f"pairs: {args.pairs} x {args.steps} steps per arm, interleaved")
    print(f"step median  synthetic {synth * 1e3:8.2f} ms   pipeline {real * 1e3:8.2f} ms")
    print("per pair     pipeline/synthetic "
          + " ".join(f"{r / s:.3f}" for r, s in zip(medians["pipeline"], medians["synthetic"],
                                                       strict=True)))
    print(f"ratio        pipeline/synthetic {real / synth:.3f}")
    print(f"prefetch     hits {source_stats['hits']}  misses {source_stats['misses']}")
    loads = [x[0] for x in (load_before, load_after) if x]
    print(f"load (1 min) before {load_before and load_before[0]}  after "
          f"{load_after and load_after[0]}"
          + ("   BUSY MACHINE: numbers not trustworthy" if loads and max(loads) >
             IDLE_LOAD_1MIN else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
