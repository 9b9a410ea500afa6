"""Every option of ``data verify`` and ``report`` says what it does in ``--help`` (issue 53,
item 11: they had no help text)."""

from __future__ import annotations

import pytest


def help_text(capsys, main, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_data_verify_help_explains_each_option(capsys):
    from orchestrator.data.__main__ import main

    text = help_text(capsys, main, ["verify", "--help"])
    assert "a prepared directory (local or gs://) holding manifest.json" in text
    assert "quick: sizes and the hashes of each shard's first and last 64 KiB" in text
    assert "(default: full)" in text
    assert "another tokenizer" in text


def test_report_help_explains_the_rolling_window(capsys):
    from orchestrator.report import main

    text = help_text(capsys, main, ["--help"])
    assert "seconds of the window the rolling goodput is taken over" in text
    assert "(default: 300.0)" in text and "works on a running run" in text
