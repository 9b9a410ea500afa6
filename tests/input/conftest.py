"""Small prepared datasets from a slice of the shipped corpus (examples/data), one per format."""

from __future__ import annotations

import pathlib

import pytest

from orchestrator.data.prepare import PrepareConfig, prepare

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "data" / "sqlite3-api.txt"
SLICE_CHARS = 40_000
SEQ_LEN = 16
VOCAB = 512


def corpus_slice(tmp: pathlib.Path, chars: int = SLICE_CHARS) -> pathlib.Path:
    """The corpus's first ``chars`` characters, cut after a line, as ``tmp/corpus/part.txt``."""
    text = CORPUS.read_text(encoding="utf-8")[:chars]
    text = text[: text.rfind("\n") + 1]
    out = tmp / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    (out / "part.txt").write_text(text, encoding="utf-8")
    return out


def make_dataset(tmp: pathlib.Path, fmt: str, *, chars: int = SLICE_CHARS,
                 shard_size: int = 128, seq_len: int = SEQ_LEN, name: str = "") -> str:
    out = tmp / (name or f"data-{fmt}")
    prepare(PrepareConfig(inputs=(str(corpus_slice(tmp, chars)),), out=str(out),
                          vocab_size=VOCAB, seq_len=seq_len, shard_size=shard_size,
                          format=fmt), progress=False)
    return str(out)


@pytest.fixture(scope="session")
def datasets(tmp_path_factory) -> dict[str, str]:
    """``{format: prepared dir}``: the same slice as bin, npy and arrayrecord (read-only)."""
    tmp = tmp_path_factory.mktemp("input-data")
    return {fmt: make_dataset(tmp, fmt) for fmt in ("bin", "npy", "arrayrecord")}
