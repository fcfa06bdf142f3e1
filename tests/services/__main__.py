"""Command line of the test bed: `python -m tests.services up|down|status|reset|logs`."""

from __future__ import annotations

import argparse
import sys
import time

from . import GROUPS, NAMES, ServiceError, Testbed, down, status, up
from ._process import tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.services", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text, default in (
        (
            "up",
            "start servers (idempotent) and wait until they answer",
            "all but faults-connect and spark-cluster",
        ),
        ("down", "stop servers; no process is left behind", "all"),
        ("reset", "stop servers and delete their data (downloaded jars stay cached)", "all"),
    ):
        sub = commands.add_parser(command, help=text)
        sub.add_argument(
            "names",
            nargs="*",
            metavar="NAME",
            help=f"any of {', '.join([*NAMES, *GROUPS])} (default: {default})",
        )
    commands.add_parser("status", help="what runs where")
    logs = commands.add_parser("logs", help="a server's log files and their last lines")
    logs.add_argument("name", choices=NAMES)
    logs.add_argument("-n", "--lines", type=int, default=40)
    args = parser.parse_args(argv)

    testbed = Testbed.create()
    try:
        if args.command == "up":
            started = time.monotonic()
            up(args.names, testbed)
            print(f"test bed up in {time.monotonic() - started:.1f} s")
            _print_status(testbed)
        elif args.command == "down":
            down(args.names, testbed)
            print("test bed down")
        elif args.command == "reset":
            for service in testbed.select(args.names):
                service.reset()
            print("test bed reset: data deleted, servers stopped")
        elif args.command == "status":
            _print_status(testbed)
        elif args.command == "logs":
            service = testbed.select([args.name])[0]
            for log in service.status().logs:
                print(f"== {log}")
                print(tail(log, args.lines))
    except (ServiceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _print_status(testbed: Testbed) -> None:
    print(f"folder {testbed.layout.root}   cache {testbed.layout.cache}")
    for entry in status(testbed):
        print(entry.line())


if __name__ == "__main__":
    sys.exit(main())
