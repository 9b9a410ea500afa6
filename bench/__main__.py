"""``python -m bench [--smoke | --full] [--set name=value ...]``: every figure, one table + JSON.

Modes: ``--smoke`` (tiny, for the test suite), default quick, ``--full`` (repeats and the
≥10-minute goodput schedule). ``--set`` changes one BenchConfig field (bench/config.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

from orchestrator.driver import logs
from orchestrator.shared.errors import ConfigError


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="tiny run for the test suite")
    mode.add_argument("--full", action="store_true", help="repeats + >=10-minute goodput schedule")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a bench setting, e.g. --set repeats=3 --set preempt_every_s=60")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"),
                   help="directory for the result JSON")
    p.add_argument("--workdir", default=None, help="scratch dir for run dirs and logs "
                   "(default: a fresh temporary directory, kept and printed)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logs.configure(json_logs=True, level="warning")
    os.environ.setdefault("NO_GCE_CHECK", "true")
    os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from bench.config import preset
    from bench.suite import Suite, write_result
    from bench.table import render

    mode = "smoke" if args.smoke else "full" if args.full else "quick"
    try:
        overrides = {}
        for item in args.set:
            name, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"bench.{name}", "expected NAME=VALUE", "e.g. --set repeats=3")
            overrides[name] = yaml.safe_load(value)
        cfg = preset(mode, **overrides)
    except ConfigError as exc:
        print(f"Bad benchmark setting: {exc}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    print(f"scratch: {workdir}", flush=True)
    result = Suite(cfg, workdir=workdir, progress=lambda s: print(s, flush=True)).run()
    result["command"] = " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)])
    path = write_result(result, Path(args.out))
    print(render(result))
    print(f"json: {path}")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
