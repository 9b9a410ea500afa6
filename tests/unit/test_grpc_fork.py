"""gRPC's fork handlers stay off, so a raylet forked beside live gRPC clients is not aborted.

Ray starts every node's raylet with ``subprocess.Popen(preexec_fn=...)``, i.e. a plain fork. With a
gRPC server or channel live in the forking process, grpcio's fork handlers (on by default) abort
1–2 % of such children before they exec (SIGABRT: 22 of 1,500 forks, and 18 and 7 of this
test's 400, without the import). Importing ``orchestrator`` turns them off
(``orchestrator/__init__.py``). Each check runs in a fresh interpreter, because the setting
counts only before the first ``import grpc``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VAR = "GRPC_ENABLE_FORK_SUPPORT"

FORKS = textwrap.dedent("""
    import orchestrator  # first, as in every entry point: before anything imports grpc
    import os, signal, subprocess, threading, time
    from concurrent import futures
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.T", {"Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    echo = channel.unary_unary("/t.T/Echo")

    def calls():
        while True:
            echo(b"x" * 100)

    for _ in range(2):
        threading.Thread(target=calls, daemon=True).start()
    time.sleep(0.3)

    def preexec():  # what Ray's start_ray_process runs in the child
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    died = hung = 0
    for _ in range(400):
        child = subprocess.Popen(["/bin/true"], preexec_fn=preexec, stderr=subprocess.DEVNULL)
        try:
            died += child.wait(timeout=10) != 0
        except subprocess.TimeoutExpired:  # stuck before its exec: a failure, not a hung test
            child.kill()
            child.wait()
            hung += 1
    print(died, hung, flush=True)
    os._exit(0)  # the calling threads never end; no orderly gRPC shutdown is needed
""")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != VAR}
    env.update(extra, PYTHONPATH=str(ROOT))
    return env


def _setting(env: dict[str, str]) -> str:
    code = f"import orchestrator, os; print(os.environ['{VAR}'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip()


def test_importing_orchestrator_turns_grpcs_fork_handlers_off_unless_set() -> None:
    assert _setting(_env()) == "false"
    assert _setting(_env(**{VAR: "true"})) == "true"  # a user's own choice is kept


def test_forks_beside_a_live_grpc_channel_are_never_aborted() -> None:
    """400 forks: with the handlers on, 1–2 % abort, so this fails with P > 99 %."""
    out = subprocess.run([sys.executable, "-c", FORKS], env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    died, hung = map(int, out.stdout.split())
    assert (died, hung) == (0, 0), f"of 400 children, {died} died and {hung} hung before exec"
