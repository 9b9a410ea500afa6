"""``python -m orchestrator.data prepare``: a text corpus into token shards and a manifest.

Each input file is one document; documents are joined by ``<|endoftext|>`` into one token
stream, cut into records of ``seq_len`` tokens (a tail shorter than a record is dropped and
counted), and written ``shard_size`` records to a shard. ``eval_records`` > 0 holds the last
records of the stream out as the held-out split (``eval-*`` shards, the manifest's
``eval_shards``; training never reads them):

- ``bin``: the shard's tokens back to back, little-endian ``uint16`` (``uint32`` past 65,536
  tokens), no header (the manifest says the dtype);
- ``npy``: the same as a 1-D ``.npy`` array;
- ``arrayrecord``: one record per sequence (its tokens' bytes), ``group_size:1`` so any record
  is one read.

The tokenizer (given, or a byte-level BPE trained on the corpus) is saved beside the shards as
``tokenizer.json``; ``manifest.json`` is written last. Shards are written to a local staging
directory and moved (or uploaded, for ``gs://``) into place.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from orchestrator.data import fs as fslib
from orchestrator.data import tokenizer as toklib
from orchestrator.data.manifest import MANIFEST, Manifest, Shard, TokenizerInfo
from orchestrator.shared.errors import ConfigError, DataError

TOKENIZER_FILE = "tokenizer.json"
CHUNK_CHARS = 1 << 20


@dataclass(frozen=True, kw_only=True)
class PrepareConfig:
    inputs: tuple[str, ...]
    """Text files, or directories searched (recursively) for ``glob``; hidden files and
    directories are left out."""
    out: str
    tokenizer: str | None = None
    """A ``tokenizers`` JSON file; None trains a byte-level BPE of ``vocab_size`` here."""
    vocab_size: int = 4096
    seq_len: int = 128
    shard_size: int = 16384
    """Records (sequences of ``seq_len`` tokens) per shard."""
    format: Literal["bin", "npy", "arrayrecord"] = "bin"
    glob: str | None = None
    """Files taken from input directories; None: ``*.txt`` and files without an extension."""
    overwrite: bool = False
    eval_records: int = 0
    """Records (of ``seq_len`` tokens) held out from the end of the stream as the eval split
    (``Task.eval_data``, ``eval.*``); 0: none."""

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ConfigError("prepare --input", "no input given",
                              "give text files or directories: --input corpus/")
        if self.tokenizer is None and not (toklib.MIN_VOCAB <= self.vocab_size <= 1 << 20):
            raise ConfigError("prepare --vocab-size", f"{self.vocab_size} is outside "
                              f"[{toklib.MIN_VOCAB}, {1 << 20}]",
                              f"give at least {toklib.MIN_VOCAB} (256 bytes + end of text)")
        if self.seq_len < 2:
            raise ConfigError("prepare --seq-len", f"{self.seq_len} leaves no target token",
                              "give 2 or more (the model's model.seq_len)")
        if self.shard_size < 1:
            raise ConfigError("prepare --shard-size", f"{self.shard_size} records per shard",
                              "give 1 or more")
        if self.eval_records < 0:
            raise ConfigError("prepare --eval-records", f"{self.eval_records} records",
                              "give 0 (no held-out split) or more")
        if self.format not in ("bin", "npy", "arrayrecord"):
            raise ConfigError("prepare --format", f"{self.format!r} is not bin, npy or "
                              "arrayrecord", "pick one of bin, npy, arrayrecord")


TEXT_FILES = "*.txt or without an extension"
"""What a directory gives when no ``glob`` is set (``--glob`` not passed)."""


@dataclass(frozen=True)
class Inputs:
    """The files prepare reads, and the files in its input directories it leaves out."""

    files: tuple[str, ...]
    left_out: tuple[str, ...] = ()
    """Files under an input directory that the glob does not take (hidden ones aside): named
    in the CLI's warning, so that no file is skipped without a word."""


def find_inputs(inputs: tuple[str, ...], glob: str | None) -> Inputs:
    """The files to read, in a fixed order (sorted within each directory), and those left out.

    ``glob`` None takes ``*.txt`` and extension-less files: a corpus of ``notes``, ``chapter1``
    is plain text as often as ``.txt``. Hidden files and directories (``.git``) are never read
    nor reported."""
    files: list[str] = []
    left_out: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            taken, skipped = _search(pathlib.Path(item), glob)
            if not taken:
                raise DataError("prepare --input", f"directory {item!r} has no "
                                f"file {f'matched by {glob!r}' if glob else TEXT_FILES}"
                                + (f" (it holds {_listing(skipped)})" if skipped else ""),
                                "point --input at the text files, or pass --glob '*' (every "
                                "file) or a pattern of yours")
            files += taken
            left_out += skipped
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise DataError("prepare --input", f"{item!r} does not exist",
                            "give existing local text files or directories")
    return Inputs(files=tuple(files), left_out=tuple(left_out))


def left_out_warning(found: Inputs, glob: str | None, *, show: int = 10) -> str:
    """One paragraph naming the files the glob left out and how to take them."""
    n = len(found.left_out)
    what = f"matched by --glob {glob!r}" if glob else f"{TEXT_FILES} (the default)"
    return (f"warning: {n} file{'s' if n != 1 else ''} in the --input directories "
            f"{'are' if n != 1 else 'is'} left out, not {what}: "
            f"{_listing(found.left_out, show=show)}. To read them, pass --glob '*' (every "
            "file) or a pattern that takes them, or name them in --input.")


def _search(root: pathlib.Path, glob: str | None) -> tuple[list[str], list[str]]:
    """(taken, left out) under ``root``, each sorted; hidden paths are neither."""
    every = sorted((p for p in root.rglob("*")
                    if p.is_file() and not _hidden(p.relative_to(root))), key=str)
    if glob is None:
        taken = {p for p in every if p.suffix in (".txt", "")}
    else:
        taken = set(root.rglob(glob))
    return [str(p) for p in every if p in taken], [str(p) for p in every if p not in taken]


def _hidden(rel: pathlib.PurePath) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _listing(paths: tuple[str, ...] | list[str], *, show: int = 5) -> str:
    """The first ``show`` paths, ``and N more``."""
    more = len(paths) - show
    return ", ".join(paths[:show]) + (f" and {more} more" if more > 0 else "")


def _chunks(path: str) -> Iterator[str]:
    """The file's text in pieces of about 1 MiB, cut after a newline."""
    try:
        with open(path, encoding="utf-8") as f:
            piece: list[str] = []
            size = 0
            for line in f:
                piece.append(line)
                size += len(line)
                if size >= CHUNK_CHARS:
                    yield "".join(piece)
                    piece, size = [], 0
            if piece:
                yield "".join(piece)
    except UnicodeDecodeError as exc:
        raise DataError("prepare --input", f"{path!r} is not UTF-8 text ({exc})",
                        "convert it (iconv -t UTF-8), or leave it out") from exc
    except OSError as exc:
        raise DataError("prepare --input", f"{path!r} cannot be read ({exc})",
                        "check the file and its permissions") from exc


class _ShardWriter:
    """Fills shards of ``shard_size`` records in a local staging directory."""

    def __init__(self, cfg: PrepareConfig, staging: str, dtype: np.dtype, *,
                 hold_records: int = 0, prefix: str = "shard") -> None:
        """``hold_records``: the stream's last records are kept back (``finish`` returns them)."""
        self.cfg, self.staging, self.dtype = cfg, staging, dtype
        self.per_shard = cfg.shard_size * cfg.seq_len
        self.hold = hold_records * cfg.seq_len
        self.prefix = prefix
        self.buf: list[np.ndarray] = []
        self.buffered = 0
        self.shards: list[tuple[str, Shard]] = []

    def add(self, ids: list[int] | np.ndarray) -> None:
        arr = np.asarray(ids, dtype=self.dtype)
        self.buf.append(arr)
        self.buffered += arr.size
        while self.buffered >= self.per_shard + self.hold:
            flat = np.concatenate(self.buf)
            self._write(flat[:self.per_shard])
            rest = flat[self.per_shard:]
            self.buf, self.buffered = [rest], rest.size

    def finish(self) -> tuple[int, np.ndarray]:
        """Write what is left (the last, shorter shard) but the records held back; returns the
        tokens dropped (less than a record, at the stream's end) and the held-back tokens."""
        flat = np.concatenate(self.buf) if self.buf else np.zeros(0, self.dtype)
        whole = flat.size // self.cfg.seq_len * self.cfg.seq_len
        split = max(0, whole - self.hold)
        for start in range(0, split, self.per_shard):
            self._write(flat[start:min(split, start + self.per_shard)])
        return int(flat.size - whole), flat[split:whole]

    def _write(self, tokens: np.ndarray) -> None:
        fmt = self.cfg.format
        ext = {"bin": "bin", "npy": "npy", "arrayrecord": "arrayrecord"}[fmt]
        name = f"{self.prefix}-{len(self.shards):05d}.{ext}"
        path = os.path.join(self.staging, name)
        tokens = tokens.astype(self.dtype.newbyteorder("<"), copy=False)
        if fmt == "bin":
            tokens.tofile(path)
        elif fmt == "npy":
            np.save(path, tokens)
        else:
            from array_record.python.array_record_module import ArrayRecordWriter

            writer = ArrayRecordWriter(path, "group_size:1")
            for rec in tokens.reshape(-1, self.cfg.seq_len):
                writer.write(rec.tobytes())
            writer.close()
        local, _ = fslib.filesystem(path, setting="prepare --out")
        nbytes = os.path.getsize(path)
        shard = Shard(path=name, bytes=nbytes, sha256=fslib.sha256(local, path),
                      edge_sha256=fslib.edge_sha256(local, path, nbytes),
                      records=tokens.size // self.cfg.seq_len, tokens=int(tokens.size))
        self.shards.append((path, shard))


def prepare(cfg: PrepareConfig, *, progress: bool = True,
            inputs: Inputs | None = None) -> Manifest:
    """Tokenize ``cfg.inputs`` into shards under ``cfg.out``; returns the manifest written.
    ``inputs``: ``find_inputs``' answer when the caller already has it (the CLI warns first)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    files = list((inputs or find_inputs(cfg.inputs, cfg.glob)).files)
    out_fs, out_root = fslib.filesystem(cfg.out, setting="prepare --out")
    if out_fs.exists(fslib.join(out_root, MANIFEST)) and not cfg.overwrite:
        raise DataError("prepare --out", f"{cfg.out!r} already holds a prepared dataset",
                        "pick another --out, or pass --overwrite (runs reading the old data "
                        "then stop at verify: new data is a new dataset)")
    total = sum(os.path.getsize(f) for f in files)
    bar = Progress(TextColumn("{task.description:<15}"), BarColumn(),
                   TextColumn("{task.completed:,.0f}/{task.total:,.0f} {task.fields[unit]}"),
                   TimeRemainingColumn(), disable=not progress)
    with bar, tempfile.TemporaryDirectory(prefix="prepare-") as staging:
        if cfg.tokenizer is None:
            task = bar.add_task("training BPE", total=total, unit="bytes")
            tok = toklib.train_bpe(_tracked(files, bar, task), vocab_size=cfg.vocab_size)
            name = f"byte-bpe-{tok.get_vocab_size()}"
        else:
            tok = toklib.load(cfg.tokenizer)
            name = os.path.splitext(os.path.basename(cfg.tokenizer))[0]
        tok_json = toklib.to_json(tok)
        vocab = tok.get_vocab_size()
        eos = tok.token_to_id(toklib.EOS)
        dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
        writer = _ShardWriter(cfg, staging, dtype, hold_records=cfg.eval_records)
        sources = []
        task = bar.add_task("tokenizing", total=total, unit="bytes")
        for i, path in enumerate(files):
            if i:
                writer.add([eos])
            h = hashlib.sha256()
            for ids in toklib.encode_chunks(tok, _tracked([path], bar, task, h)):
                writer.add(ids)
            sources.append({"path": path, "bytes": os.path.getsize(path),
                            "sha256": h.hexdigest()})
        dropped, held = writer.finish()
        if cfg.eval_records and (held.size < cfg.eval_records * cfg.seq_len or
                                 not writer.shards):
            records = (sum(s.records for _, s in writer.shards) +
                       held.size // cfg.seq_len)
            raise DataError("prepare --eval-records", f"the corpus makes {records} records of "
                            f"{cfg.seq_len} tokens; holding out {cfg.eval_records} leaves none "
                            "for training", "hold out fewer records (--eval-records), or give "
                            "more text")
        if not writer.shards:
            raise DataError("prepare --input", f"the corpus has fewer than seq_len "
                            f"{cfg.seq_len} tokens: no record", "give more text, or a smaller "
                            "--seq-len")
        evals = _ShardWriter(cfg, staging, dtype, prefix="eval")
        if held.size:
            evals.add(held)
            evals.finish()
        tok_path = os.path.join(staging, TOKENIZER_FILE)
        with open(tok_path, "w", encoding="utf-8") as f:
            f.write(tok_json)
        shards = tuple(s for _, s in writer.shards)
        eval_shards = tuple(s for _, s in evals.shards)
        manifest = Manifest(
            format=cfg.format, dtype=str(dtype), seq_len=cfg.seq_len, vocab_size=vocab,
            records=sum(s.records for s in shards), tokens=sum(s.tokens for s in shards),
            tokenizer=TokenizerInfo(file=TOKENIZER_FILE, name=name,
                                    sha256=toklib.digest(tok_json), vocab_size=vocab,
                                    eos_id=int(eos)),
            shards=shards, sources=tuple(sources),
            extra={"dropped_tail_tokens": dropped, "documents": len(files)},
            eval_shards=eval_shards, eval_records=sum(s.records for s in eval_shards),
            eval_tokens=sum(s.tokens for s in eval_shards))
        task = bar.add_task("writing", total=len(shards) + len(eval_shards) + 2, unit="files")
        _publish(out_fs, out_root, [(p, s.path) for p, s in writer.shards + evals.shards]
                 + [(tok_path, TOKENIZER_FILE)], manifest, lambda: bar.advance(task))
    return manifest


def _tracked(files: list[str], bar: Any, task: Any, h: Any = None) -> Iterator[str]:
    for path in files:
        for chunk in _chunks(path):
            data = chunk.encode("utf-8")
            if h is not None:
                h.update(data)
            bar.advance(task, len(data))
            yield chunk


def _publish(out_fs, out_root: str, files: list[tuple[str, str]], manifest: Manifest,
             tick) -> None:
    """Move (local) or upload (remote) the staged files, then write the manifest last."""
    out_fs.makedirs(out_root, exist_ok=True)
    stale = fslib.join(out_root, MANIFEST)
    if out_fs.exists(stale):
        out_fs.rm(stale)  # --overwrite: no manifest names half-replaced shards
    for src, name in files:
        dst = fslib.join(out_root, name)
        if fslib.is_local(out_fs):
            shutil.move(src, dst)
        else:
            out_fs.put_file(src, dst)
        tick()
    tmp = fslib.join(out_root, MANIFEST + ".tmp")
    with out_fs.open(tmp, "w") as f:
        f.write(manifest.to_json())
    out_fs.mv(tmp, fslib.join(out_root, MANIFEST))
    tick()
