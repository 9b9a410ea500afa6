"""``python -m orchestrator.export RUN_DIR [--step N] --to DIR [--with-opt-state]``.

Exit codes: 0 exported; 2 bad input (no complete step, a step that is not complete, an
unreadable or refused checkpoint, a ``--to`` that is not new) with one paragraph naming the fix,
and nothing written to ``--to``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from orchestrator.shared.errors import OrchestratorError


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
                        help="also export the optimizer state (opt_state/...)")
    args = parser.parse_args(argv)
    # On a TPU VM the export must not take the chips a training job may hold: host memory only.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
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


if __name__ == "__main__":
    sys.exit(main())
