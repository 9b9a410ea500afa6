"""``python -m orchestrator.data prepare | verify`` (docs/data.md).

    prepare --input FILE_OR_DIR [...] --out DIR [--tokenizer FILE] [--vocab-size N]
            [--seq-len N] [--shard-size RECORDS] [--format bin|npy|arrayrecord]
            [--eval-records N]
    verify DIR [--level auto|full|quick] [--tokenizer-sha256 HEX]

Exit 0 on success, 2 for bad input (a missing file, a changed shard, a bad option) with a
one-paragraph message naming the fix.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence

from orchestrator.data.prepare import TEXT_FILES
from orchestrator.shared.errors import ConfigError

EXIT_BAD_INPUT = 2


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestrator.data",
                                description="Prepare and verify token shards for training.")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("prepare", help="tokenize a text corpus into shards + manifest.json",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    pp.add_argument("--input", nargs="+", required=True, metavar="PATH",
                    help="text files, or directories searched for --glob (files the glob "
                         "leaves out are named in a warning)")
    pp.add_argument("--out", required=True, help="output directory (local or gs://)")
    pp.add_argument("--tokenizer", default=None,
                    help="a tokenizers JSON file; default: train a byte-level BPE on the input")
    pp.add_argument("--vocab-size", type=int, default=4096,
                    help="tokens of the BPE trained when no --tokenizer is given")
    pp.add_argument("--seq-len", type=int, default=128, help="tokens per record")
    pp.add_argument("--shard-size", type=int, default=16384, help="records per shard")
    pp.add_argument("--format", choices=("bin", "npy", "arrayrecord"), default="bin",
                    help="shard format (docs/data.md)")
    pp.add_argument("--glob", default=None,
                    help=f"files taken from input directories, e.g. '*' for all; default: "
                         f"{TEXT_FILES}")
    pp.add_argument("--eval-records", type=int, default=0,
                    help="hold the stream's last N records out as the eval split (eval.*)")
    pp.add_argument("--overwrite", action="store_true",
                    help="replace a dataset already prepared in --out")
    pp.add_argument("--no-progress", action="store_true", help="no progress bar")
    pv = sub.add_parser("verify", help="check a prepared directory against its manifest",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    pv.add_argument("dir", help="a prepared directory (local or gs://) holding manifest.json")
    pv.add_argument("--level", choices=("auto", "full", "quick"), default="full",
                    help="full: every shard's size and sha256; quick: sizes and the hashes of "
                         "each shard's first and last 64 KiB; auto: full up to 1 GiB of shards, "
                         "quick above")
    pv.add_argument("--tokenizer-sha256", default=None, metavar="HEX",
                    help="also refuse data prepared with another tokenizer (the sha256 of the "
                         "run's tokenizer.json)")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "prepare":
            return _prepare(args)
        return _verify(args)
    except ConfigError as exc:  # DataError included
        body = exc.message + (f" Fix: {exc.fix}" if exc.fix else "")
        print(textwrap.fill(f"Data error: {body}", width=100), file=sys.stderr)
        return EXIT_BAD_INPUT


def _prepare(args: argparse.Namespace) -> int:
    from orchestrator.data.prepare import PrepareConfig, find_inputs, left_out_warning, prepare

    cfg = PrepareConfig(inputs=tuple(args.input), out=args.out, tokenizer=args.tokenizer,
                        vocab_size=args.vocab_size, seq_len=args.seq_len,
                        shard_size=args.shard_size, format=args.format, glob=args.glob,
                        overwrite=args.overwrite, eval_records=args.eval_records)
    found = find_inputs(cfg.inputs, cfg.glob)
    if found.left_out:
        print(textwrap.fill(left_out_warning(found, cfg.glob), width=100), file=sys.stderr)
    m = prepare(cfg, progress=not args.no_progress, inputs=found)
    skipped = f", {len(found.left_out)} left out" if found.left_out else ""
    print(f"prepared {args.out} from {len(found.files)} file(s){skipped}: "
          f"{m.records} records of {m.seq_len} tokens ({m.tokens} tokens) "
          f"in {len(m.shards)} {m.format} shard(s); tokenizer {m.tokenizer.name} "
          f"({m.vocab_size} tokens, sha256 {m.tokenizer.sha256[:12]}…)"
          + (f"; held out for eval: {m.eval_records} records in {len(m.eval_shards)} "
             "shard(s)" if m.eval_shards else ""))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from orchestrator.data.manifest import verify

    m = verify(args.dir, level=args.level, tokenizer_sha256=args.tokenizer_sha256,
               setting="verify DIR")
    print(f"ok: {args.dir}: {len(m.shards)} {m.format} shard(s), {m.records} records of "
          f"{m.seq_len} tokens, tokenizer {m.tokenizer.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
