"""``gpushare share-capacity``: ``gpushare.io/milligpu`` advertised on every GPU node.

Once (``--once``: one pass over every node, what changed printed) or for as long as the
process runs (the in-cluster Deployment, deploy/share-capacity: a watch on Nodes with a full
pass every ``--resync`` seconds, JSON log lines on stderr, until SIGTERM). Parsing and wiring
only; the work is ``webhook.quota``'s.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from webhook.cli.cluster_client import api_client, require_cluster_client
from webhook.cli.command_tree import Commands
from webhook.cli.exit_codes import EXIT_FAILED, EXIT_OK
from webhook.cli.options import add_kubeconfig_option
from webhook.constants import GFD_COUNT_LABEL, MILLI_GPUS_PER_GPU, SHARE_RESOURCE

if TYPE_CHECKING:
    from webhook.quota import ShareCapacity

# After SIGTERM, how long the loop may take to finish the call it is in before the process
# exits anyway (a watch can wait for its server's timeout; every write is idempotent).
STOP_GRACE_S = 5.0


def add_share_capacity_command(subparsers: Commands) -> None:
    command = subparsers.add_parser(
        "share-capacity",
        help=f"advertise {SHARE_RESOURCE} on every GPU node, for quota on GPU share",
        description=(
            f"A policy with quota.shareResource puts {SHARE_RESOURCE} (thousandths of one "
            "GPU) on every pod it admits, so that a ResourceQuota counts GPU share; the "
            "scheduler places such a pod only on a node that advertises the resource. This "
            f"sets each node's {SHARE_RESOURCE} capacity and allocatable to "
            f"{MILLI_GPUS_PER_GPU} per GPU of its {GFD_COUNT_LABEL} label (GPU Feature "
            "Discovery's) and removes it from nodes without a valid label: once with --once, "
            "or watching nodes until SIGTERM (the in-cluster Deployment)."
        ),
    )
    add_kubeconfig_option(command)
    command.add_argument(
        "--once",
        action="store_true",
        help="one pass over every node, print what changed, and exit (1 if a call failed)",
    )
    command.add_argument(
        "--resync",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a full pass over every node this often, putting back a value someone reset "
        "(default: 300)",
    )
    command.set_defaults(func=run_share_capacity, parser=command.parser)


def run_share_capacity(args: argparse.Namespace) -> int:
    if args.resync <= 0:
        args.parser.error(f"--resync {args.resync:g}: give a positive number of seconds")
    require_cluster_client("gpushare share-capacity")
    from webhook.quota import KubeNodeApi, ShareCapacity, configure_logging

    controller = ShareCapacity(KubeNodeApi(api_client(args.kubeconfig, "share-capacity")))
    if not args.once:
        return _keep(controller, args.resync)
    configure_logging(level=logging.WARNING)  # why a node was skipped, as JSON lines
    _, result = controller.resync()
    for line in result.advertised:
        print(f"advertised {line}")
    for name in result.removed:
        print(f"removed {name}")
    for line in result.errors:
        print(f"error: {line}", file=sys.stderr)
    print(result.summary(), file=sys.stderr)
    return EXIT_FAILED if result.errors else EXIT_OK


def _keep(controller: ShareCapacity, resync_s: float) -> int:
    """The loop in a thread of its own, so that SIGTERM ends the process within
    STOP_GRACE_S even while a watch waits for its next event."""
    from webhook.quota import configure_logging, run

    configure_logging()
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("gpushare.quota").info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    worker = threading.Thread(
        target=run, args=(controller, stop), kwargs={"resync_s": resync_s}, daemon=True
    )
    worker.start()
    while worker.is_alive() and not stop.is_set():
        stop.wait(1.0)
    if not stop.is_set():  # the loop itself failed (its traceback is on stderr)
        return EXIT_FAILED
    worker.join(STOP_GRACE_S)
    return EXIT_OK
