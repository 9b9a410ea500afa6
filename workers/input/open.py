"""From ``DataSettings`` to a checked ``TokenSource``: verify the directory against its
manifest, refuse data the model cannot take, then build the records and the source; and the
held-out split (``open_heldout``) as a task's ``eval_data``."""

from __future__ import annotations

import dataclasses

from orchestrator.data import fs as fslib
from orchestrator.data.manifest import Manifest, check_model, load, verify
from orchestrator.data.settings import SETTING, DataSettings
from orchestrator.shared.errors import DataError
from workers.input.heldout import HeldOut
from workers.input.records import ArrayRecordTokens, FlatTokens, ShardSpec
from workers.input.source import TokenSource


def open_source(settings: DataSettings, *, seq_len: int, vocab_size: int, global_batch: int,
                total_steps: int | None = None, model_setting: str = "model",
                setting: str = SETTING) -> TokenSource:
    """The source of ``settings.dir`` for a model of ``seq_len`` and ``vocab_size``. Raises
    ``DataError`` (bad input: exit 2 when raised in the driver's task check) for a missing or
    changed shard, another tokenizer, or a sequence length or vocabulary the model refuses."""
    where = f"{setting}.dir"
    if settings.verify == "off":
        m = load(settings.dir, setting=where)
        if settings.tokenizer_sha256 not in (None, m.tokenizer.sha256):
            raise DataError(where, f"{settings.dir!r} was tokenized with "
                            f"{m.tokenizer.name!r}, not the tokenizer this run expects",
                            "prepare the data with the run's tokenizer, or fix "
                            f"{setting}.tokenizer_sha256")
    else:
        m = verify(settings.dir, level=settings.verify,
                   tokenizer_sha256=settings.tokenizer_sha256, setting=where)
    check_model(m, seq_len=seq_len, vocab_size=vocab_size, setting=where,
                model_setting=model_setting)
    records = manifest_records(settings.dir, m, seq_len=seq_len, vocab_size=vocab_size,
                               setting=where)
    return TokenSource(records, global_batch=global_batch, seq_len=seq_len,
                       shuffle=settings.shuffle, prefetch_steps=settings.prefetch_steps,
                       read_threads=settings.read_threads,
                       read_timeout_s=settings.read_timeout_s, total_steps=total_steps,
                       trace_dir=settings.trace_dir, name=settings.dir, setting=setting)


def manifest_records(data_dir: str, m: Manifest, *, seq_len: int, vocab_size: int,
                     setting: str) -> FlatTokens | ArrayRecordTokens:
    """The records of a manifest's shards, cut to ``seq_len`` (flat files) or as written."""
    paths = [fslib.join(data_dir, s.path) for s in m.shards]
    if m.format == "arrayrecord":
        specs = [ShardSpec(p, s.records, s.tokens) for p, s in zip(paths, m.shards, strict=True)]
        return ArrayRecordTokens(specs, dtype=m.dtype, seq_len=seq_len, vocab_size=vocab_size,
                                 setting=setting)
    if m.format == "npy":
        return FlatTokens.from_files(paths, seq_len=seq_len, dtype=m.dtype,
                                     vocab_size=vocab_size, setting=setting)
    specs = [ShardSpec(p, s.tokens // seq_len, s.tokens) for p, s in zip(paths, m.shards,
                                                                           strict=True)]
    return FlatTokens(specs, dtype=m.dtype, seq_len=seq_len, vocab_size=vocab_size,
                      setting=setting)


def open_heldout(settings: DataSettings, *, seq_len: int, vocab_size: int, global_batch: int,
                 model_setting: str = "model", setting: str = SETTING) -> HeldOut | None:
    """The held-out split of ``settings.dir`` (``prepare --eval-records``) as ``eval_data``,
    or None when the data has none. Checks its shards against the manifest (``settings.verify``;
    ``open_source`` checks the training shards) and the model against the data, as
    ``open_source`` does."""
    where = f"{setting}.dir"
    if settings.verify == "off":
        m = load(settings.dir, setting=where)
    else:
        m = verify(settings.dir, level=settings.verify,
                   tokenizer_sha256=settings.tokenizer_sha256, setting=where, split="eval")
    if not m.eval_shards:
        return None
    check_model(m, seq_len=seq_len, vocab_size=vocab_size, setting=where,
                model_setting=model_setting)
    held = dataclasses.replace(m, shards=m.eval_shards)
    if m.format != "arrayrecord" and seq_len > max(s.tokens for s in held.shards):
        raise DataError(f"{model_setting}.seq_len", f"seq_len {seq_len} is longer than the "
                        f"held-out split of {where} ({max(s.tokens for s in held.shards)} "
                        "tokens): no eval record fits", f"lower {model_setting}.seq_len, or "
                        "prepare with a larger --eval-records")
    records = manifest_records(settings.dir, held, seq_len=seq_len, vocab_size=vocab_size,
                               setting=where)
    return HeldOut(records, global_batch=global_batch, seq_len=seq_len, name=settings.dir,
                   setting=setting)
