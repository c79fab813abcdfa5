"""The `specledger` command line: a thin layer over the library, never through pytest.

Each subcommand is one function registered with `@command`, which also declares its
arguments; `main` builds the parser from the registry and dispatches. Adding a subcommand
(plot, report, policy...) is one decorated function. Exit codes: 0 fine, 1 the ledgers have
problems, 2 usage (bad arguments, a path that does not exist). vLLM is never imported here.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specledger import __version__
from specledger.schema import LedgerError, iter_ledger_paths, load_ledger

__all__ = ["COMMANDS", "Command", "command", "main"]

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class Command:
    """A subcommand: its arguments and the function that runs it (returns the exit code)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def command(
    name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as subcommand `name`."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = Command(name, help, add_arguments, run)
        return run

    return register


class _UsageError(Exception):
    """Bad input from the command line (exit 2), e.g. a path that does not exist."""


def _ledger_paths(paths: Sequence[str]) -> list[Path]:
    """Expand PATH arguments (directories to their *.json); a missing path is a usage error."""
    try:
        found = iter_ledger_paths(paths)
    except FileNotFoundError as e:
        raise _UsageError(str(e)) from None
    if not found:
        raise _UsageError(f"no ledger files (*.json) under {' '.join(paths)}")
    return found


def _paths_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="ledger files or directories of *.json")


# --------------------------------------------------------------------------------------------
# subcommands
# --------------------------------------------------------------------------------------------


@command("validate", "check ledgers against the schema and the format's rules", _paths_argument)
def cmd_validate(args: argparse.Namespace) -> int:
    invalid = 0
    for path in _ledger_paths(args.paths):
        try:
            ledger = load_ledger(path)
        except LedgerError as e:
            invalid += 1
            for problem in e.problems:
                print(problem)
            continue
        print(f"{path}: ok ({ledger.id}, {ledger.status}, {len(ledger.points)} points)")
    if invalid:
        print(f"{invalid} invalid ledger(s)")
    return EXIT_PROBLEMS if invalid else EXIT_OK


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    _paths_argument(parser)
    parser.add_argument(
        "--min-severity",
        choices=("info", "warning", "error"),
        default="info",
        help="show findings at or above this severity (default: info, which includes roundings that hold)",
    )


@command(
    "audit", "check that each ledger's figures agree with each other at the stated rounding", _audit_arguments
)
def cmd_audit(args: argparse.Namespace) -> int:
    from specledger.audit import SEVERITIES, at_least, audit_ledger

    counts = dict.fromkeys(SEVERITIES, 0)
    load_problems = 0
    paths = _ledger_paths(args.paths)
    for path in paths:
        print(path)
        try:
            ledger = load_ledger(path)
        except LedgerError as e:
            load_problems += len(e.problems)
            for problem in e.problems:
                print(f"  invalid: {problem.json_path}: {problem.message}")
            continue
        findings = audit_ledger(ledger)
        for finding in findings:
            counts[finding.severity] += 1
        shown = at_least(findings, args.min_severity)
        for finding in shown:
            print(f"  {finding.severity}: {finding.json_path}: {finding.message} [{finding.code}]")
        if not shown:
            print(f"  no findings at or above {args.min_severity}")
    print(
        f"audited {len(paths)} ledger(s): {counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['info']} info, {load_problems} load problem(s)"
    )
    return EXIT_PROBLEMS if counts["error"] or load_problems else EXIT_OK


@command("show", "print the points and critical-concurrency tables", _paths_argument)
def cmd_show(args: argparse.Namespace) -> int:
    from specledger.report import critical_table, format_table, points_table

    ledgers, invalid = [], 0
    for path in _ledger_paths(args.paths):
        try:
            ledgers.append(load_ledger(path))
        except LedgerError as e:
            invalid += 1
            for problem in e.problems:
                print(problem, file=sys.stderr)
    print("Points")
    print(format_table(points_table(ledgers)))
    print()
    print("Critical concurrency (multiplier first below 1.0)")
    print(format_table(critical_table(ledgers)))
    return EXIT_PROBLEMS if invalid else EXIT_OK


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "demo_args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to specledger.demo"
    )


@command("demo", "run the demo (arguments after 'demo' go to it unchanged)", _demo_arguments)
def cmd_demo(args: argparse.Namespace) -> int:
    return _run_demo(list(args.demo_args))


def _run_demo(argv: list[str]) -> int:
    """Hand over to specledger.demo.main, imported only now (it may pull in heavy dependencies)."""
    try:
        demo = importlib.import_module("specledger.demo")
    except ModuleNotFoundError as e:
        if e.name != "specledger.demo":
            raise
        print("specledger demo: this install has no specledger.demo module", file=sys.stderr)
        return EXIT_PROBLEMS
    return int(demo.main(argv) or 0)


# --------------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specledger", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"specledger {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS.values():
        sub = subparsers.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(sub)
        sub.set_defaults(run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit code (0 ok, 1 problems found, 2 usage)."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list[:1] == ["demo"]:
        # Everything after `demo` is the demo's, including --help; argparse would eat that.
        return _run_demo(args_list[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as e:  # --help, --version, or a usage error (argparse exits 2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        return args.run(args)
    except _UsageError as e:
        print(f"specledger {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
