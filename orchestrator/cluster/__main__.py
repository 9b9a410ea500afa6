"""``python -m orchestrator.cluster up|down|status|env``: a local TPU-like Ray cluster.

``up`` starts a real Ray head (job API on 127.0.0.1:8265, or a free port if that is taken) and
one worker node per emulated TPU host, token auth on, and prints the address and the exact
``ray job submit`` line. ``env`` prints the exports a shell needs (``eval "$(... env)"``).
``down`` stops everything ``up`` started. Exit codes: 0 ok, 2 bad input or a failed start.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from pathlib import Path

from orchestrator.cluster.local import (
    ClusterState,
    LocalClusterError,
    alive_hosts,
    default_state_dir,
    down,
    load_state,
    up,
)
from orchestrator.cluster.nodes import Shape


def submit_line(state: ClusterState) -> str:
    """The ``ray job submit`` a user runs against this cluster (after sourcing ``env``)."""
    shape = Shape(**state.shape)
    return ("ray job submit --working-dir . -- python -m orchestrator.main "
            f"run.name=my-run run.run_dir=$PWD/runs/my-run "
            f"cluster.emulate.hosts_per_slice={shape.hosts_per_slice} "
            f"cluster.emulate.devices_per_host={shape.devices_per_host}")


def exports(state: ClusterState) -> str:
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in state.env().items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.cluster",
                                description="A local Ray cluster whose nodes look like TPU hosts.")
    p.add_argument("--state-dir", type=Path, default=None,
                   help=f"where the cluster's state and token live (default {default_state_dir()})")
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start the head and the emulated TPU hosts")
    u.add_argument("--slices", type=int, default=2)
    u.add_argument("--hosts-per-slice", type=int, default=2)
    u.add_argument("--devices-per-host", type=int, default=2)
    u.add_argument("--dashboard-port", type=int, default=8265,
                   help="job API / dashboard port (a free one if taken)")
    u.add_argument("--no-auth", action="store_true",
                   help="RAY_AUTH_MODE=disabled (token auth is on by default)")
    sub.add_parser("down", help="stop everything `up` started")
    sub.add_parser("status", help="address and alive TPU hosts")
    sub.add_parser("env", help="print the exports for a shell: eval \"$(... env)\"")
    args = p.parse_args(argv)
    state_dir = args.state_dir or default_state_dir()
    try:
        if args.command == "up":
            shape = Shape(slices=args.slices, hosts_per_slice=args.hosts_per_slice,
                          devices_per_host=args.devices_per_host)
            state = up(shape, state_dir=state_dir, dashboard_port=args.dashboard_port,
                       auth=not args.no_auth)
            hosts = alive_hosts(state)
            print(f"Local TPU-like Ray cluster up: {len(hosts)} hosts "
                  f"({shape.slices} slices x {shape.hosts_per_slice} hosts x "
                  f"{shape.devices_per_host} devices), token auth "
                  f"{'on' if state.auth else 'off'}.\n"
                  f"  dashboard / job API: {state.url}\n"
                  f"  GCS address:         {state.gcs_address}\n"
                  f"  token file:          {state.token_path if state.auth else '-'}\n"
                  f"In your shell:\n  eval \"$(python -m orchestrator.cluster env)\"   # or: "
                  f"{exports(state)}\n  {submit_line(state)}\n"
                  f"Stop it with: python -m orchestrator.cluster down", flush=True)
            return 0
        if args.command == "down":
            print(down(state_dir), flush=True)
            return 0
        state = load_state(state_dir)
        if state is None:
            print(f"no local cluster recorded in {state_dir}; start one with "
                  "`python -m orchestrator.cluster up`", file=sys.stderr)
            return 2
        if args.command == "env":
            print(exports(state))
            return 0
        hosts = alive_hosts(state)
        print(f"{state.url} ({'token auth' if state.auth else 'no auth'}); alive TPU hosts "
              f"{len(hosts)}: {', '.join(hosts) or 'none (head down?)'}")
        return 0 if hosts else 1
    except (LocalClusterError, ValueError) as exc:
        print(textwrap.fill(f"Local cluster: {exc}", width=100), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
