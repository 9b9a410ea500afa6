"""``manifest.json``: what a prepared data directory holds, and the check a run makes of it.

Written last by ``python -m orchestrator.data prepare`` (a directory without one is an
unfinished prepare); read by the input pipeline (``workers/input``) and checked by ``verify``
before the group forms. A pure data module (standard library and fsspec, no JAX): hosts import
it too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from orchestrator.data import fs as fslib
from orchestrator.shared.errors import DataError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
FORMATS = ("bin", "npy", "arrayrecord")
DTYPES = ("uint16", "uint32")
QUICK_ABOVE_BYTES = 1 << 30
"""``verify(level="auto")`` hashes every byte up to this much data, then checks edges only."""
_MAX_LISTED = 5


@dataclass(frozen=True, kw_only=True)
class Shard:
    path: str
    """Relative to the manifest's directory."""
    bytes: int
    sha256: str
    edge_sha256: str
    records: int
    tokens: int


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    file: str
    """Relative to the manifest's directory (the tokenizer travels with its shards)."""
    name: str
    sha256: str
    vocab_size: int
    eos_id: int


@dataclass(frozen=True, kw_only=True)
class Manifest:
    format: Literal["bin", "npy", "arrayrecord"]
    dtype: Literal["uint16", "uint32"]
    seq_len: int
    vocab_size: int
    records: int
    tokens: int
    tokenizer: TokenizerInfo
    shards: tuple[Shard, ...]
    sources: tuple[dict, ...] = ()
    format_version: int = FORMAT_VERSION
    created_by: str = "python -m orchestrator.data prepare"
    extra: dict = field(default_factory=dict)
    eval_shards: tuple[Shard, ...] = ()
    """The held-out split (``prepare --eval-records``): the last records of the token stream,
    in shards of their own that training never reads (``records``/``tokens``/``shards`` are
    the training split's). Empty: no held-out split."""
    eval_records: int = 0
    eval_tokens: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def manifest_path(data_dir: str) -> str:
    return fslib.join(data_dir, MANIFEST)


def load(data_dir: str, *, setting: str = "data.dir") -> Manifest:
    """The manifest of ``data_dir``; a ``DataError`` naming the fix when it is missing or
    unreadable."""
    fs, path = fslib.filesystem(manifest_path(data_dir), setting=setting)
    prepare = ("run `python -m orchestrator.data prepare --input <text> --out "
               f"{data_dir}`, or point {setting} at a prepared directory")
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        raise DataError(setting, f"{data_dir!r} has no {MANIFEST} (not a prepared data "
                        "directory, or its prepare did not finish)", prepare) from None
    except OSError as exc:
        raise DataError(setting, f"{manifest_path(data_dir)!r} cannot be read: {exc}",
                        "check the path and its permissions") from exc
    try:
        doc = json.loads(raw)
        m = _from_dict(doc)
    except (ValueError, TypeError, KeyError) as exc:
        raise DataError(setting, f"{manifest_path(data_dir)!r} is not a valid manifest "
                        f"({type(exc).__name__}: {exc})", prepare) from exc
    if (name := _escaping(m)) is not None:
        raise DataError(setting, f"{manifest_path(data_dir)!r} lists {name!r}, which is not a "
                        f"file inside {data_dir!r} (an absolute path, a URL or a '..'): a "
                        "manifest names its own directory's files only, so a run never reads "
                        "what the data directory's writer points it at elsewhere", prepare)
    return m


def _escaping(m: Manifest) -> str | None:
    """The first file name of ``m`` that leads out of its directory, or None (issue 49)."""
    for name in (m.tokenizer.file, *(s.path for s in (*m.shards, *m.eval_shards))):
        if not isinstance(name, str):
            return repr(name)
        parts = name.replace("\\", "/").split("/")
        if not name or name.startswith(("/", "\\")) or "://" in name or ".." in parts:
            return name
    return None


def _from_dict(doc: dict) -> Manifest:
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"format_version {version!r}, this version reads {FORMAT_VERSION}")
    if doc["format"] not in FORMATS or doc["dtype"] not in DTYPES:
        raise ValueError(f"format {doc['format']!r} / dtype {doc['dtype']!r} unknown")
    shards = tuple(Shard(**s) for s in doc["shards"])
    if not shards:
        raise ValueError("no shards listed")
    return Manifest(format=doc["format"], dtype=doc["dtype"], seq_len=int(doc["seq_len"]),
                    vocab_size=int(doc["vocab_size"]), records=int(doc["records"]),
                    tokens=int(doc["tokens"]), tokenizer=TokenizerInfo(**doc["tokenizer"]),
                    shards=shards, sources=tuple(doc.get("sources", ())),
                    created_by=doc.get("created_by", ""), extra=doc.get("extra", {}),
                    eval_shards=tuple(Shard(**s) for s in doc.get("eval_shards", ())),
                    eval_records=int(doc.get("eval_records", 0)),
                    eval_tokens=int(doc.get("eval_tokens", 0)))


def verify(data_dir: str, *, level: Literal["auto", "full", "quick"] = "auto",
           tokenizer_sha256: str | None = None, setting: str = "data.dir",
           split: Literal["all", "eval"] = "all") -> Manifest:
    """Check ``data_dir`` against its manifest before a run reads it: every shard present and
    readable with the listed size and checksum (``full``: SHA-256 of every byte; ``quick``:
    size and the hash of each shard's edges; ``auto``: full up to 1 GiB of shards), the
    tokenizer file beside them unchanged, and, when ``tokenizer_sha256`` is given, the one the
    run expects. Raises one ``DataError`` listing what is wrong, with the fix. ``split``:
    ``all`` checks the training and held-out shards, ``eval`` the held-out ones only (an eval
    source opening after the training source checked the rest)."""
    m = load(data_dir, setting=setting)
    if level not in ("auto", "full", "quick"):
        raise DataError(setting, f"verify level {level!r} is not auto, full or quick",
                        "pass level='auto'")
    full = level == "full" or (level == "auto" and m.total_bytes <= QUICK_ABOVE_BYTES)
    fs, root = fslib.filesystem(data_dir, setting=setting)
    problems: list[str] = []
    tok = _check_file(fs, fslib.join(root, m.tokenizer.file), None, m.tokenizer.sha256, True)
    if tok:
        problems.append(f"tokenizer {m.tokenizer.file}: {tok}")
    for shard in (m.shards if split == "all" else ()) + m.eval_shards:
        bad = _check_file(fs, fslib.join(root, shard.path), shard, shard.sha256, full)
        if bad:
            problems.append(f"shard {shard.path}: {bad}")
    if problems:
        more = len(problems) - _MAX_LISTED
        listed = "; ".join(problems[:_MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")
        raise DataError(setting, f"{data_dir!r} does not match its {MANIFEST}: {listed}",
                        "restore the listed files from where the data was copied, or re-run "
                        f"`python -m orchestrator.data prepare ... --out {data_dir}` (new "
                        "data is a new dataset: start a new run, or the sample order of "
                        "this one no longer holds)")
    if tokenizer_sha256 is not None and tokenizer_sha256 != m.tokenizer.sha256:
        raise DataError(setting, f"{data_dir!r} was tokenized with {m.tokenizer.name!r} "
                        f"(sha256 {m.tokenizer.sha256[:12]}…), not the tokenizer this run "
                        f"expects (sha256 {tokenizer_sha256[:12]}…)",
                        "prepare the data with the run's tokenizer (prepare --tokenizer FILE), "
                        "or set the run's tokenizer to the one beside the shards")
    return m


def _check_file(fs: Any, path: str, shard: Shard | None, digest: str, full: bool) -> str:
    """What is wrong with ``path`` ("" when nothing)."""
    try:
        nbytes = fslib.size(fs, path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc})"
    if shard is not None and nbytes != shard.bytes:
        return f"{nbytes} bytes, the manifest lists {shard.bytes} (changed or truncated)"
    try:
        if full:
            got = fslib.sha256(fs, path)
            want = digest
        else:
            assert shard is not None
            got, want = fslib.edge_sha256(fs, path, nbytes), shard.edge_sha256
    except OSError as exc:
        return f"unreadable ({exc})"
    if got != want:
        return f"checksum {got[:12]}… differs from the manifest's {want[:12]}… (changed)"
    return ""


def check_model(m: Manifest, *, seq_len: int, vocab_size: int, setting: str = "data.dir",
                model_setting: str = "model") -> None:
    """Refuse data the model cannot take: tokens at or above its vocabulary (silently wrong
    embeddings on an accelerator), or records of another length (ArrayRecord records are
    fixed; flat token files are cut to any length that leaves a record)."""
    if m.vocab_size > vocab_size:
        raise DataError(f"{model_setting}.vocab_size", f"the data's tokenizer "
                        f"{m.tokenizer.name!r} has {m.vocab_size} tokens, more than the "
                        f"model's vocab_size {vocab_size}",
                        f"set {model_setting}.vocab_size={m.vocab_size} (or more), or prepare "
                        "the data with a smaller tokenizer (prepare --vocab-size)")
    if seq_len < 2:
        raise DataError(f"{model_setting}.seq_len", f"seq_len {seq_len} leaves no target token",
                        f"set {model_setting}.seq_len to 2 or more")
    if m.format == "arrayrecord" and seq_len != m.seq_len:
        raise DataError(f"{model_setting}.seq_len", f"the ArrayRecord shards in {setting} hold "
                        f"records of {m.seq_len} tokens; the model takes {seq_len}",
                        f"set {model_setting}.seq_len={m.seq_len}, or re-run prepare with "
                        f"--seq-len {seq_len}")
    longest = max(s.tokens for s in m.shards)
    if m.format != "arrayrecord" and seq_len > longest:
        raise DataError(f"{model_setting}.seq_len", f"seq_len {seq_len} is longer than the "
                        f"largest shard in {setting} ({longest} tokens): no record fits",
                        f"lower {model_setting}.seq_len, or re-run prepare with a larger "
                        "--shard-size")
