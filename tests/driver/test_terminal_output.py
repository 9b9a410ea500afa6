"""What the driver prints at a terminal and off one (issue 32 item 7).

At a TTY: one human line per state change, a live bar, no JSON records (they go to
RUN_DIR/driver.log.jsonl). Off a TTY (``ray job logs``, Cloud Logging): JSON records and progress
lines, as always. The pty tests run the driver's own output path (``logs.choose_output``,
``logs.configure``, ``build_sinks``) in a child at a real pseudo-terminal, without Ray.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.driver import logs
from orchestrator.shared.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PROGRESS = r"step\s+\d+ \| loss\s+[\d.]+ \| step"  # tests/production/test_try_locally.py

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import structlog
    from orchestrator.config import load_config
    from orchestrator.driver import logs
    from orchestrator.metrics.pipeline import build_sinks
    from orchestrator.metrics.identity import ResourceIdentity
    from tests.metrics.synthetic import step_record, tr

    fmt, run_dir = sys.argv[1], Path(sys.argv[2])
    cfg = load_config(None, ["run.total_steps=20", "metrics.tensorboard=false",
                             "metrics.ray_metrics=false", "metrics.jsonl=false"])
    out = logs.choose_output(None if fmt == "-" else fmt, tty=sys.stdout.isatty())
    logs.configure(json_logs=out.json)
    logs.attach_run_dir(run_dir)
    log = structlog.get_logger("orchestrator.lifecycle")
    [sink] = build_sinks(cfg.metrics, run_dir=run_dir, identity=None,
                         live_total=20 if out.live else None)
    moves = [("PLANNING", None), ("FORMING", "PLANNING"), ("RUNNING", "FORMING")]
    for seq, (state, prev) in enumerate(moves):
        log.info("transition", **{"from": prev}, to=state)
        sink.on_transition(tr(seq, state, prev, 1000.0 + seq, slices=["s0"]))
    for k in range(1, 21):
        sink.on_step(step_record(k, 1003.0 + k, inc=0, slices=1))
    log.info("transition", **{"from": "RUNNING"}, to="SUCCEEDED")
    sink.on_transition(tr(3, "SUCCEEDED", "RUNNING", 1030.0, slices=["s0"], step=20))
    sink.close()
    print("summary: SUCCEEDED")
""")


def _env() -> dict[str, str]:
    return {**os.environ, "TERM": "xterm", "COLUMNS": "160", "PYTHONPATH": str(REPO)}


def run_at_pty(fmt: str, run_dir: Path) -> str:
    """The child's stdout and stderr as a terminal shows them."""
    parent, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, fmt, str(run_dir)], cwd=REPO,
                            stdin=child, stdout=child, stderr=child, env=_env())
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(parent, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(parent)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def run_piped(fmt: str, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, fmt, str(run_dir)], cwd=REPO,
                          capture_output=True, text=True, env=_env(), timeout=60, check=True)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_at_a_tty_one_human_line_per_state_change_and_no_json(tmp_path):
    text = run_at_pty("-", tmp_path)
    assert '{"' not in text, text
    for move in ("None -> PLANNING", "PLANNING -> FORMING", "FORMING -> RUNNING",
                 "RUNNING -> SUCCEEDED"):
        assert text.count(f"state {move} ") == 1, text
    assert "20/20" in text and "loss" in text and "MFU" in text and "goodput" in text
    assert "summary: SUCCEEDED" in text
    # the records the terminal hid are in the run directory, as JSON lines
    records = json_lines((tmp_path / logs.LOG_FILE).read_text())
    assert [r["to"] for r in records if r["message"] == "transition"] == [
        "PLANNING", "FORMING", "RUNNING", "SUCCEEDED"]


def test_off_a_tty_json_records_and_progress_lines_as_before(tmp_path):
    proc = run_piped("-", tmp_path)
    assert len([r for r in json_lines(proc.stderr) if r["message"] == "transition"]) == 4
    assert len([ln for ln in proc.stdout.splitlines() if re.search(PROGRESS, ln)])
    assert "state FORMING -> RUNNING" in proc.stdout and "-> RUNNING" in proc.stdout


def test_json_asked_for_at_a_tty_prints_json(tmp_path):
    text = run_at_pty("json", tmp_path)
    assert len([r for r in json_lines(text) if r.get("message") == "transition"]) == 4
    assert "state FORMING -> RUNNING" in text


@pytest.mark.parametrize(("fmt", "tty", "verbose", "want"), [
    (None, True, None, logs.Output(json=False, live=True, worker_logs=False)),
    ("auto", False, None, logs.Output(json=True, live=False, worker_logs=False)),
    ("json", True, None, logs.Output(json=True, live=False, worker_logs=False)),
    ("console", False, None, logs.Output(json=False, live=False, worker_logs=False)),
    ("auto", False, True, logs.Output(json=True, live=False, worker_logs=True)),
    ("auto", True, True, logs.Output(json=False, live=True, worker_logs=True)),
    ("auto", False, False, logs.Output(json=True, live=False, worker_logs=False)),
])
def test_output_chooser(fmt, tty, verbose, want):
    """The workers' own lines reach the terminal only with logs.verbose (issue 53 item 4),
    piped or not (RUN_DIR/workers.log keeps them)."""
    assert logs.choose_output(fmt, tty=tty, verbose=verbose) == want


def test_logs_settings_are_validated_and_not_part_of_the_digest():
    assert load_config(None, []).logs.format == "auto"
    with pytest.raises(ConfigError, match=r"logs\.format"):
        load_config(None, ["logs.format=xml"])
    with pytest.raises(ConfigError, match=r"logs\.verbose"):
        load_config(None, ["logs.verbose=maybe"])
    assert (load_config(None, ["logs.format=json", "logs.verbose=true"]).digest()
            == load_config(None, []).digest())
