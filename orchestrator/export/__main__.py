"""``python -m orchestrator.export RUN_DIR [--step N] --to DIR [--with-opt-state]``, or
``... --format hf [--dtype f32|bf16] [--shard-size 5GB]`` (a ``llama`` run as a Hugging Face
``LlamaForCausalLM`` directory, ``orchestrator.export.hf``).

Exit codes: 0 exported; 2 bad input (no complete step, a step that is not complete, an
unreadable or refused checkpoint, a ``--to`` that is not new, ``--format hf`` of a run that is
not ``llama``) with one paragraph naming the fix, and nothing written to ``--to``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from orchestrator.shared.errors import OrchestratorError

FORMATS = ("native", "hf")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.export",
        description="Write a run's parameters (newest complete step of any checkpoint tier, or "
                    "--step) as npz and safetensors, with its model/task config and export.json.")
    parser.add_argument("run_dir", type=Path, help="the run directory (run.run_dir)")
    parser.add_argument("--to", type=Path, required=True,
                        help="a new directory for the export (never overwritten)")
    parser.add_argument("--step", type=int, default=None,
                        help="a complete step to export (default: the newest)")
    parser.add_argument("--with-opt-state", action="store_true",
                        help="also export the optimizer state (opt_state/...); native only")
    parser.add_argument("--format", choices=FORMATS, default="native",
                        help="native (default): the tree's own names, npz + safetensors, "
                             "config.yaml; hf: a Hugging Face LlamaForCausalLM directory "
                             "(task.kind llama runs)")
    parser.add_argument("--dtype", choices=("f32", "bf16"), default=None,
                        help="--format hf: the weights' dtype (default f32, lossless)")
    parser.add_argument("--shard-size", type=_size, default=None, metavar="SIZE",
                        help="--format hf: split the weights into files of at most SIZE "
                             "(bytes, or 500MB, 5GB, 2GiB; default 5GB) with an index")
    args = parser.parse_args(argv)
    if args.format == "native" and (args.dtype or args.shard_size):
        parser.error("--dtype and --shard-size apply to --format hf only")
    if args.format == "hf" and args.with_opt_state:
        parser.error("--with-opt-state applies to the native format only (a Hugging Face "
                     "directory holds no optimizer state)")
    # On a TPU VM the export must not take the chips a training job may hold: host memory only.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.format == "hf":
        return _hf(args)
    from orchestrator.export.write import export_run

    try:
        out = export_run(args.run_dir, args.to, step=args.step,
                         with_opt_state=args.with_opt_state)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported step {out['step']} ({out['tier']} tier, {out['source']}) to "
          f"{Path(args.to).absolute()}: {len(out['arrays'])} arrays, {out['parameters']:,} "
          f"parameters, {out['digest']}")
    if out.get("tokenizer"):
        print(f"tokenizer {out['tokenizer']['name']!r} copied as {out['tokenizer']['file']}")
    elif out.get("tokenizer_missing"):
        print(f"tokenizer not exported: {out['tokenizer_missing']}")
    return 0


def _hf(args: argparse.Namespace) -> int:
    from orchestrator.export.hf import DEFAULT_SHARD_BYTES, export_hf

    try:
        out = export_hf(args.run_dir, args.to, step=args.step, dtype=args.dtype or "f32",
                        shard_bytes=args.shard_size or DEFAULT_SHARD_BYTES)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    weights = [f for f in out["files"] if f.endswith(".safetensors")]
    print(f"exported step {out['step']} ({out['tier']} tier, {out['source']}) to "
          f"{Path(args.to).absolute()} as a Hugging Face LlamaForCausalLM: "
          f"{out['parameters']:,} parameters, {out['dtype']}, {len(weights)} safetensors "
          "file(s)")
    return 0


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30}


def _size(text: str) -> int:
    """``5GB`` -> 5·10⁹ (transformers' ``max_shard_size`` spelling), ``2GiB``, or bytes."""
    t = text.strip().upper()
    digits = t.rstrip("KMGIB")
    unit = t[len(digits):]
    try:
        value = float(digits) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 5GB, 500MB, 2GiB, "
                                         "or bytes)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return int(value)


if __name__ == "__main__":
    sys.exit(main())
