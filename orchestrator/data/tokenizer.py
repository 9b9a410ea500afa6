"""The tokenizer prepare uses: a Hugging Face ``tokenizers`` file given by the user, or a
byte-level BPE trained on the corpus itself (nothing is downloaded: no hub, no network).

Byte-level, so every input byte has a token and no text is ever unknown; one special token,
``<|endoftext|>`` (id 0 when trained here), separates documents. Training is deterministic for
the same files and vocabulary size (tested), so a corpus prepared twice gives the same shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from orchestrator.shared.errors import DataError

EOS = "<|endoftext|>"
MIN_VOCAB = 256 + 1
"""Every byte, plus the end-of-text token."""


def train_bpe(texts: Iterable[str], *, vocab_size: int, length: int | None = None) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return tok


def load(path: str, *, setting: str = "prepare --tokenizer") -> Any:
    """A ``tokenizers`` JSON file (``Tokenizer.save``) from a local path."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises plain Exception for unreadable files
        raise DataError(setting, f"{path!r} is not a readable tokenizers JSON file "
                        f"({type(exc).__name__}: {exc})",
                        "give a file written by tokenizers' Tokenizer.save, or leave "
                        "--tokenizer out to train a BPE on the corpus") from exc
    if tok.token_to_id(EOS) is None:
        raise DataError(setting, f"{path!r} has no {EOS!r} token to separate documents",
                        f"add {EOS!r} as a special token, or leave --tokenizer out")
    return tok


def to_json(tok: Any) -> str:
    return tok.to_str()


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def encode_chunks(tok: Any, chunks: Iterable[str]) -> Iterator[list[int]]:
    """Token ids of each chunk, in order (``encode_batch`` over a few chunks at a time)."""
    batch: list[str] = []
    for chunk in chunks:
        batch.append(chunk)
        if len(batch) == 16:
            yield from (e.ids for e in tok.encode_batch(batch, add_special_tokens=False))
            batch = []
    if batch:
        yield from (e.ids for e in tok.encode_batch(batch, add_special_tokens=False))
