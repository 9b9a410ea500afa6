"""The workers' own output at the driver (issue 53 items 3, 4), without Ray: Ray's batches are
dicts of the shape its log thread hands ``WorkerOutput``.

A host's warning (a line ``orchestrator.shared.worker_log`` marked) becomes a driver record:
at a terminal a line above the progress bar, piped a JSON record, and in driver.log.jsonl
either way, once for all hosts. Gloo's and XLA's lines go to RUN_DIR/workers.log without colour
codes, onto the terminal only with ``logs.verbose``, never after the summary.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pty
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from structlog.testing import capture_logs

from orchestrator.driver import logs
from orchestrator.driver.worker_output import WORKERS_LOG, WorkerOutput, must_show, strip_ansi
from orchestrator.shared import worker_log

REPO = Path(__file__).resolve().parents[2]
SHORT = ("data train: 60 records, the run reads 160 (20 steps × 8): the data is shorter than "
         "the run and is read 3 times, each epoch shuffled anew")
GLOO = ("\x1b[36m[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected "
        "peer ranks is : 1\x1b[0m")
CPP = "W1129 12:00:00.000000  4242 pjrt_client.cc:123] Something C++ says"


def marked(message: str, logger: str = "workers.input.source",
           level: int = logging.WARNING) -> str:
    """The line a host writes for one log record (``worker_log.RecordHandler``)."""
    return worker_log.format_record(logging.LogRecord(logger, level, __file__, 1, message,
                                                      None, None))


def batch(*lines: str, pid: int = 4242, is_err: bool = True) -> dict:
    return {"lines": list(lines), "pid": pid, "ip": "127.0.0.1", "localhost": "127.0.0.1",
            "actor_name": "HostActor", "is_err": is_err, "job": "01000000"}


def test_a_host_records_its_warnings_as_marked_lines(capsys):
    """A host's warning leaves the process as one marked line the driver parses back."""
    logger = logging.Logger("tests.worker_output.host")  # outside the hierarchy: no root
    handler = worker_log.install(logger)
    assert worker_log.install(logger) is handler  # a rejoin installs it again: still one
    logger.warning("the data %s is read %d times", "train", 3)
    logger.info("not a warning")
    lines = capsys.readouterr().err.splitlines()
    assert [worker_log.parse(ln) for ln in lines] == [
        {"level": "WARNING", "logger": "tests.worker_output.host",
         "message": "the data train is read 3 times"}]
    assert worker_log.parse(CPP) is None and worker_log.parse(GLOO) is None


@contextlib.contextmanager
def handlers_added() -> Iterator[list]:
    """The root logger's handlers added inside the block (one an earlier test in this process
    installed is taken off first, and everything is put back after)."""
    root = logging.getLogger()
    earlier = list(root.handlers)
    for h in earlier:
        if isinstance(h, worker_log.RecordHandler):
            root.removeHandler(h)
    before, added = list(root.handlers), []
    try:
        yield added
        added.extend(h for h in root.handlers if h not in before)
    finally:
        for h in root.handlers[:]:
            if h not in before:
                root.removeHandler(h)
        for h in earlier:
            if h not in root.handlers:
                root.addHandler(h)


def test_a_host_marks_its_warnings_from_its_start():
    """``apply_env`` (the first thing a host actor runs, and a rejoin's) installs the handler."""
    from workers.host.warm import apply_env

    with handlers_added() as added:
        apply_env({}, environ={})
        apply_env({}, environ={})
    assert [type(h) for h in added] == [worker_log.RecordHandler]


def test_a_ram_holder_marks_its_warnings():
    """A RAM holder is a process of its own (one a node): a refused copy or a failed durable
    save reaches the driver's terminal, not only workers.log."""
    from workers.ram.holder import RamHolder

    with handlers_added() as added:
        RamHolder(token="t" * 32)
    assert [type(h) for h in added] == [worker_log.RecordHandler]


def test_a_host_warning_becomes_one_driver_record_and_chatter_does_not():
    out = WorkerOutput(echo=False, stream=lambda err: io.StringIO())
    with capture_logs() as records:
        out(batch(GLOO, CPP, marked(SHORT), pid=1))
        out(batch(marked(SHORT), pid=2))  # every host of the group says it
        out(batch(marked("platform note", logger="jax._src.xla_bridge"), pid=1))
    assert [(r["event"], r["text"], r["origin"], r["host"]) for r in records] == [
        ("worker_warning", SHORT, "workers.input.source", "HostActor pid=1")]
    assert records[0]["log_level"] == "warning"


def test_a_host_error_is_an_error_record():
    with capture_logs() as records:
        WorkerOutput(echo=False)(batch(marked("boom", level=logging.ERROR)))
    assert [(r["event"], r["log_level"]) for r in records] == [("worker_error", "error")]


def test_what_a_user_must_see():
    assert must_show({"level": "WARNING", "logger": "workers.input.source", "message": "m"})
    assert must_show({"level": "ERROR", "logger": "examples.text_lm.task", "message": "m"})
    assert not must_show({"level": "INFO", "logger": "workers.input.source", "message": "m"})
    assert not must_show({"level": "WARNING", "logger": "orbax.checkpoint", "message": "m"})
    assert not must_show({"level": "NOPE", "logger": "workers", "message": "m"})


def test_every_line_is_kept_in_workers_log_without_colour_codes(tmp_path):
    out = WorkerOutput(echo=False)
    out(batch(GLOO))  # before the run directory is known: kept, then written
    out.attach(tmp_path / WORKERS_LOG)
    out(batch(CPP, pid=7, is_err=False))
    out.close()
    text = (tmp_path / WORKERS_LOG).read_text()
    assert text.splitlines() == [f"(HostActor pid=4242) {strip_ansi(GLOO)}",
                                 f"(HostActor pid=7) {CPP}"]
    assert "\x1b" not in text
    assert out.note() == f"Workers' own output (Gloo, XLA, JAX, prints): {tmp_path / WORKERS_LOG}"


def test_lines_reach_the_terminal_only_when_verbose_and_never_after_quiet():
    streams = {True: io.StringIO(), False: io.StringIO()}
    quiet = WorkerOutput(echo=False, stream=streams.__getitem__)
    quiet(batch(GLOO, CPP))
    assert streams[True].getvalue() == streams[False].getvalue() == ""
    verbose = WorkerOutput(echo=True, stream=streams.__getitem__)
    verbose(batch(GLOO))
    verbose(batch("a print", is_err=False))
    verbose.quiet()  # the summary follows
    verbose(batch("[Gloo] after the summary"))
    assert streams[True].getvalue() == f"(HostActor pid=4242) {strip_ansi(GLOO)}\n"
    assert streams[False].getvalue() == "(HostActor pid=4242) a print\n"


def test_the_driver_takes_the_workers_lines_from_rays_printer(monkeypatch):
    """``ray.init`` always forwards the lines (at a terminal too: the warnings must arrive), and
    ``WorkerOutput`` replaces Ray's printer on its dispatcher (no colour codes, no dedup
    notes on the driver's stdout)."""
    import ray
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from orchestrator.main import _ray_init
    from orchestrator.raygroup import ray_private

    printed, routed, asked = [], [], {}

    def fake_init(**kw):  # what ray.init(log_to_driver=True) does to the dispatcher
        asked.update(kw)
        dispatcher.add_handler(ray_private.RAY_PRINTER, printed.append)

    monkeypatch.setattr(ray, "init", fake_init)
    route = WorkerOutput(echo=False)
    monkeypatch.setattr(route, "_batch", routed.append)
    _ray_init(route, verbose=False)(address="127.0.0.1:1", log_to_driver=False)
    try:
        dispatcher.emit(batch(GLOO))
    finally:
        ray_private.unroute_worker_output()
    assert asked["log_to_driver"] is True and asked["logging_level"] == logging.ERROR
    assert printed == [] and routed == [batch(GLOO)]


def test_a_broken_batch_never_ends_rays_log_thread():
    WorkerOutput(echo=True)({"lines": 5, "pid": 1})  # not a list: dropped, no exception


# ---- the driver's own output path, in a child at a pty and piped ---------------------------

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from orchestrator.config import load_config
    from orchestrator.driver import logs
    from orchestrator.driver.worker_output import WORKERS_LOG, WorkerOutput
    from orchestrator.metrics.pipeline import build_sinks
    from tests.driver.test_worker_output import GLOO, CPP, SHORT, batch, marked
    from tests.metrics.synthetic import step_record, tr

    run_dir = Path(sys.argv[1])
    cfg = load_config(None, ["run.total_steps=20", "metrics.tensorboard=false",
                             "metrics.ray_metrics=false", "metrics.jsonl=false"])
    out = logs.choose_output(None, tty=sys.stdout.isatty(), verbose=cfg.logs.verbose)
    logs.configure(json_logs=out.json)
    logs.attach_run_dir(run_dir)
    workers = WorkerOutput(echo=out.worker_logs)
    workers.attach(run_dir / WORKERS_LOG)
    [sink] = build_sinks(cfg.metrics, run_dir=run_dir, identity=None,
                         live_total=20 if out.live else None)
    sink.on_transition(tr(0, "RUNNING", None, 1000.0, slices=["s0"]))
    for k in range(1, 11):
        sink.on_step(step_record(k, 1003.0 + k, inc=0, slices=1))
    workers(batch(GLOO, CPP, marked(SHORT)))  # Ray's log thread, mid-run
    for k in range(11, 21):
        sink.on_step(step_record(k, 1003.0 + k, inc=0, slices=1))
    sink.on_transition(tr(1, "SUCCEEDED", "RUNNING", 1030.0, slices=["s0"], step=20))
    sink.close()
    workers.quiet()
    print(workers.note())
    print("Run SUCCEEDED: done")
    workers(batch(GLOO))  # teardown chatter after the summary
    workers.close()
""")


def _env() -> dict[str, str]:
    return {**os.environ, "TERM": "xterm", "COLUMNS": "160", "PYTHONPATH": str(REPO)}


def _at_pty(run_dir: Path) -> str:
    parent, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir)], cwd=REPO, stdin=child,
                            stdout=child, stderr=child, env=_env())
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
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert proc.wait(timeout=60) == 0, text[-3000:]
    return text


def _logged_warnings(run_dir: Path) -> list[dict]:
    records = [json.loads(ln) for ln in (run_dir / logs.LOG_FILE).read_text().splitlines()]
    return [r for r in records if r["message"] == "worker_warning"]


def test_at_a_terminal_a_host_warning_is_shown_and_logged(tmp_path):
    """Issue 53 item 3: at a TTY the warning was nowhere; now a line above the bar, and in
    driver.log.jsonl."""
    text = _at_pty(tmp_path)
    assert "shorter than the run and is read 3 times" in text, text
    assert "[Gloo]" not in text and "pjrt_client" not in text, text
    assert [r["text"] for r in _logged_warnings(tmp_path)] == [SHORT]


def test_piped_stdout_is_clean_and_ends_with_the_summary(tmp_path):
    """Issue 53 item 4: no colour codes, no Gloo or C++ lines, the summary last; the warning a
    JSON record on stderr and in driver.log.jsonl; the chatter in workers.log."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, env=_env(), timeout=60, check=True)
    assert "\x1b" not in proc.stdout and "[Gloo]" not in proc.stdout, proc.stdout
    assert "pjrt_client" not in proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "Run SUCCEEDED: done"
    warned = [json.loads(ln) for ln in proc.stderr.splitlines() if ln.startswith("{")]
    assert [r["text"] for r in warned if r["message"] == "worker_warning"] == [SHORT]
    assert [r["text"] for r in _logged_warnings(tmp_path)] == [SHORT]
    kept = (tmp_path / WORKERS_LOG).read_text()
    assert kept.count("[Gloo]") == 2 and "pjrt_client" in kept and "\x1b" not in kept
    assert f"(HostActor pid=4242) WARNING workers.input.source: {SHORT}" in kept
