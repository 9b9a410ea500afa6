"""``python -m orchestrator.data prepare`` end to end on a slice of the shipped corpus: real
tokens of a real tokenizer in every format, a manifest that matches its files, the same shards
when run twice, and the CLI's exit codes."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

from orchestrator.data.manifest import load, verify
from orchestrator.data.prepare import PrepareConfig, find_inputs, prepare
from orchestrator.shared.errors import ConfigError, DataError
from tests.input.conftest import CORPUS, SEQ_LEN, VOCAB, corpus_slice, make_dataset
from workers.input import manifest_records

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fmt", ("bin", "npy", "arrayrecord"))
def test_prepare_writes_shards_a_manifest_and_the_tokenizer(datasets, fmt):
    """Counts add up, every shard's sha256 and size are the file's, the records decode back to
    text of the corpus with the tokenizer saved beside them."""
    data = pathlib.Path(datasets[fmt])
    m = load(str(data))
    assert m.format == fmt and m.seq_len == SEQ_LEN and m.vocab_size == VOCAB
    assert m.dtype == "uint16" and m.records * SEQ_LEN == m.tokens
    assert m.records == sum(s.records for s in m.shards) and len(m.shards) > 1
    for shard in m.shards:
        raw = (data / shard.path).read_bytes()
        assert (len(raw), hashlib.sha256(raw).hexdigest()) == (shard.bytes, shard.sha256)
    tok_text = (data / m.tokenizer.file).read_text()
    assert hashlib.sha256(tok_text.encode()).hexdigest() == m.tokenizer.sha256
    tok = Tokenizer.from_str(tok_text)
    records = manifest_records(str(data), m, seq_len=SEQ_LEN, vocab_size=VOCAB,
                               setting="data.dir")
    text = CORPUS.read_text(encoding="utf-8")
    joined = tok.decode(np.concatenate([records[i] for i in range(40)]).tolist())
    assert joined[:200] in text and len(joined) > 200
    assert verify(str(data), level="full") == m


def test_prepare_is_deterministic_and_formats_hold_the_same_tokens(datasets, tmp_path):
    """A second prepare of the same text gives the same shards; bin, npy and arrayrecord hold
    the same records."""
    again = load(make_dataset(tmp_path, "bin"))
    first = load(datasets["bin"])
    assert [s.sha256 for s in again.shards] == [s.sha256 for s in first.shards]
    assert again.tokenizer.sha256 == first.tokenizer.sha256
    recs = {fmt: manifest_records(d, load(d), seq_len=SEQ_LEN, vocab_size=VOCAB,
                                  setting="data.dir") for fmt, d in datasets.items()}
    for i in (0, 1, 200, len(recs["bin"]) - 1):
        assert np.array_equal(recs["bin"][i], recs["npy"][i])
        assert np.array_equal(recs["bin"][i], recs["arrayrecord"][i])


def test_prepare_with_a_given_tokenizer_names_it(datasets, tmp_path):
    """--tokenizer FILE: its name and sha256 go into the manifest, the file beside the shards."""
    given = tmp_path / "mytok.json"
    given.write_text((pathlib.Path(datasets["bin"]) / "tokenizer.json").read_text())
    out = tmp_path / "out"
    m = prepare(PrepareConfig(inputs=(str(corpus_slice(tmp_path, 8000)),), out=str(out),
                              tokenizer=str(given), seq_len=SEQ_LEN), progress=False)
    assert m.tokenizer.name == "mytok"
    assert m.tokenizer.sha256 == load(datasets["bin"]).tokenizer.sha256


def test_prepare_refuses_what_it_cannot_do(tmp_path):
    """An existing dataset without --overwrite, a missing input, a corpus shorter than a
    record, a non-UTF-8 file and bad options are refused naming the fix."""
    make_dataset(tmp_path, "bin", chars=6000)
    with pytest.raises(DataError, match="--overwrite"):
        make_dataset(tmp_path, "bin", chars=6000)
    with pytest.raises(DataError, match="does not exist"):
        prepare(PrepareConfig(inputs=(str(tmp_path / "nope.txt"),), out=str(tmp_path / "o")))
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a b")
    with pytest.raises(DataError, match="fewer than seq_len"):
        prepare(PrepareConfig(inputs=(str(tiny),), out=str(tmp_path / "o2"), vocab_size=300),
                progress=False)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        prepare(PrepareConfig(inputs=(str(latin),), out=str(tmp_path / "o3"), vocab_size=300),
                progress=False)
    with pytest.raises(ConfigError, match="--seq-len"):
        PrepareConfig(inputs=("x",), out="y", seq_len=1)
    with pytest.raises(ConfigError, match="--vocab-size"):
        PrepareConfig(inputs=("x",), out="y", vocab_size=100)


def test_cli_prepare_then_verify_and_exit_2_on_bad_data(tmp_path):
    """The CLI prepares (exit 0), verifies (exit 0), and exits 2 with the fix once a shard
    is gone."""
    corpus = corpus_slice(tmp_path, 8000)
    out = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "orchestrator.data", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)

    made = cli("prepare", "--input", str(corpus), "--out", str(out), "--seq-len", "32",
               "--vocab-size", "300", "--shard-size", "16", "--format", "arrayrecord",
               "--no-progress")
    assert made.returncode == 0, made.stderr
    assert "arrayrecord shard(s)" in made.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "arrayrecord" and manifest["seq_len"] == 32
    ok = cli("verify", str(out))
    assert ok.returncode == 0 and ok.stdout.startswith("ok:"), ok.stderr
    (out / manifest["shards"][1]["path"]).unlink()
    bad = cli("verify", str(out))
    assert bad.returncode == 2
    assert "missing" in bad.stderr and "Fix:" in bad.stderr


def test_cli_prepare_reads_extension_less_files_and_names_those_left_out(tmp_path, capsys):
    """A folder of extension-less text files is read whole by default; a file the glob leaves
    out is named on stderr and counted in the summary; hidden files are neither; --help
    shows the defaults."""
    from orchestrator.data.__main__ import main

    text = CORPUS.read_text(encoding="utf-8")[:9000]
    corpus = tmp_path / "corpus"
    (corpus / "more").mkdir(parents=True)
    for i, name in enumerate(("chapter1", "chapter2", "more/chapter3")):
        (corpus / name).write_text(text[i * 3000:(i + 1) * 3000], encoding="utf-8")
    (corpus / "notes.md").write_text("# not read\n")
    (corpus / ".git").mkdir()
    (corpus / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    out = tmp_path / "out"
    code = main(["prepare", "--input", str(corpus), "--out", str(out), "--seq-len", "16",
                 "--vocab-size", "300", "--no-progress"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["extra"]["documents"] == 3
    assert [pathlib.Path(s["path"]).name for s in manifest["sources"]] == [
        "chapter1", "chapter2", "chapter3"]
    assert "1 file in the --input directories is left out" in printed.err
    assert "notes.md" in printed.err and "--glob '*'" in printed.err
    assert ".git" not in printed.err
    assert "from 3 file(s), 1 left out:" in printed.out
    with pytest.raises(DataError, match=r"no file matched by '\*\.txt' \(it holds .*chapter1"):
        find_inputs((str(corpus),), "*.txt")
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "default: *.txt or without an extension" in shown and "(default: 128)" in shown


def test_docs_do_not_call_the_supported_eval_split_unsupported():
    """docs/data.md's "Not supported yet" no longer lists the eval split that prepare
    --eval-records, open_heldout and eval.every provide."""
    text = (ROOT / "docs" / "data.md").read_text()
    unsupported = text.split("## Not supported yet", 1)[1]
    assert "eval" not in unsupported.lower()
    assert "--eval-records" in text and "open_heldout" in text
