"""tpu-orchestrator: the driver, controller, events and metrics (README.md, docs/ARCHITECTURE.md).

One process-wide default is set here, because it must precede the first ``import grpc``:
``GRPC_ENABLE_FORK_SUPPORT=false``. grpcio is built with gRPC's fork handlers on, and with a gRPC
channel or server live (Pub/Sub, Cloud Monitoring), they abort 1 to 2 in 100 children forked
with a ``preexec_fn``, which is how Ray starts a node's raylet. The raylet then dies before it
runs, and Ray waits its fixed 30 s for the node and fails (docs/CONTRACTS.md, "Emulated
cluster"). Nothing here uses gRPC in a forked child: every child exec's. A value you set
yourself is kept.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
