"""The `specledger` command line: a thin layer over the library, never through pytest.

Each subcommand is one function registered with `@command`, which also declares its
arguments; `main` builds the parser from the registry and dispatches. Adding a subcommand
(plot, report, policy...) is one decorated function. Exit codes: 0 fine, 1 the ledgers have
problems, 2 usage (bad arguments, a path that does not exist). vLLM is never imported here.

Over 500 lines on purpose: it is the command table. Each command is its argument function and a handler of
10-60 lines that parses, calls one library function and prints; one file is the `--help` a user reads, and a
handler that grew logic of its own would belong in the library instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger import __version__
from specledger.ledger import Ledger, LedgerError, iter_ledger_paths, load_ledger

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


class _LedgerProblems(Exception):
    """A ledger a one-ledger subcommand needs does not load (exit 1, problems on stderr)."""

    def __init__(self, error: LedgerError) -> None:
        super().__init__(str(error))
        self.problems = error.problems


def _load_one(path_argument: str) -> tuple[Path, Ledger]:
    """The single ledger named on the command line, or _LedgerProblems (see main)."""
    path = _ledger_paths([path_argument])[0]
    try:
        return path, load_ledger(path)
    except LedgerError as e:
        raise _LedgerProblems(e) from None


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
    from specledger.analysis.audit import SEVERITIES, at_least, audit_ledger

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


@command("show", "print the points and critical-concurrency tables, and each engine start's figures with its host "
         "state where a point was measured in several", _paths_argument)
def cmd_show(args: argparse.Namespace) -> int:
    from specledger.render.tables import critical_table, format_table, points_table, starts_table

    ledgers, invalid = _load_valid_ledgers(args.paths)
    print("Points")
    print(format_table(points_table(ledgers)))
    print()
    print("Critical concurrency (multiplier first below 1.0)")
    print(format_table(critical_table(ledgers)))
    starts = starts_table(ledgers)
    if not starts.empty:
        print()
        print("Engine starts (points measured in two or more; host slice: median ms of a fixed Python loop "
              "around the windows)")
        print(format_table(starts))
    return EXIT_PROBLEMS if invalid else EXIT_OK


def _estimate_arguments(parser: argparse.ArgumentParser) -> None:
    _paths_argument(parser)
    parser.add_argument("--points", metavar="W:T:C,...", help="only these points, as --ledger-points selects them")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--only-missing", action="store_true",
                       help="only the points each ledger has not recorded (--ledger-record --ledger-only-missing)")
    which.add_argument("--verify", action="store_true",
                       help="only the points each ledger has recorded (what a verification measures)")
    parser.add_argument("--times-from", metavar="LEDGER",
                        help="where a ledger's own runs kept no times (a planned ledger never run), take this "
                             "ledger's, scaled by the ratio of arm counts (e.g. the measured ledger it was replanned "
                             "from)")
    parser.add_argument("--budget-s", type=float, metavar="S",
                        help="also say which points a run with --ledger-budget-s S measures and which it leaves out "
                             "(the session's budget rule, with the times above)")


@command("estimate", "how long a record or verification of the ledgers' points will take, from the seconds their "
         "earlier runs kept (model build, engine starts, each point): a --ledger-budget-s to give each run",
         _estimate_arguments)
def cmd_estimate(args: argparse.Namespace) -> int:
    from specledger.ledger.selection import SelectionError, parse_point_selection
    from specledger.measure.visit_time import estimate_run

    try:
        selectors = parse_point_selection(args.points)
    except SelectionError as e:
        raise _UsageError(str(e)) from None
    ledgers, invalid = _load_valid_ledgers(args.paths)
    times_from = None
    if args.times_from:
        sources, bad = _load_valid_ledgers([args.times_from])
        if bad or not sources:
            return EXIT_PROBLEMS
        times_from = sources[0]

    def seconds(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.0f} s"

    totals: list[float | None] = []
    longest: list[float | None] = []
    for ledger in ledgers:
        run = estimate_run(ledger, selectors, only_missing=args.only_missing, verify=args.verify,
                           times_from=times_from)
        totals.append(run.total_s)
        longest.append(run.up_to_s)
        build = ("none timed: add the model's build if this run is the visit's first" if run.model_build_s is None
                 else seconds(run.model_build_s))
        longer = "" if run.up_to_s == run.total_s else f", up to {seconds(run.up_to_s)}"
        print(f"{ledger.id}: {seconds(run.total_s)}{longer} ({len(run.points)} point(s); engine starts "
              f"{seconds(run.engine_starts_s)}; model build {build})")
        for point in run.points:
            print(f"  {point.label}: {seconds(point.seconds)} ({point.source})")
        if args.budget_s is not None:
            budget = f"  --ledger-budget-s {args.budget_s:.0f}"
            likely, slow = run.within_budget(args.budget_s), run.within_budget(args.budget_s, slowest=True)
            if likely is None or slow is None:
                print(f"{budget} at these times: unknown (a time above is unknown)")
            else:
                # the second plan only where every point as slow as the slowest changes it
                plans = [("at these times", likely)] + ([("if every point is as slow as the slowest", slow)]
                                                        if slow != likely else [])
                for how, plan in plans:
                    print(f"{budget} {how}: measures {', '.join(plan.measured) or 'nothing'} (ends about "
                          f"{plan.ends_s:.0f} s)" + (f"; leaves out {', '.join(plan.left_out)}" if plan.left_out
                                                     else ""))
    if len(ledgers) > 1:
        known = [t for t in totals if t is not None]
        up_to = sum(t for t in longest if t is not None)
        print(f"one after another: {sum(known):.0f} s, up to {up_to:.0f} s" + ("" if len(known) == len(totals) else
              f" for the {len(known)} ledger(s) whose times are known") +
              " (a model built by an earlier run of the same visit is not built again)")
    return EXIT_PROBLEMS if invalid else EXIT_OK


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reference", metavar="REFERENCE", help="the ledger to compare against (e.g. the bf16 one)")
    parser.add_argument("other", metavar="OTHER", help="the ledger with the condition under test (e.g. fp8 weights)")
    parser.add_argument("--plot", metavar="PNG", help="also draw each change with its CI against the tolerance band")


@command("compare", "each figure of OTHER against REFERENCE at the points both measured, with the CI of the change "
         "(over engine starts with REFERENCE's between-start spread where it pools one) and the conditions that "
         "differ; exit 1 when they share no point", _compare_arguments)
def cmd_compare(args: argparse.Namespace) -> int:
    from specledger.analysis.compare import compare_acceptance, compare_ledgers, condition_differences
    from specledger.render.tables import format_table

    (_, reference), (_, other) = _load_one(args.reference), _load_one(args.other)
    differences = condition_differences(reference, other)
    print(f"{other.id} against {reference.id}: conditions that differ"
          + ("" if differences else ": none (the same conditions: a re-run)"))
    for path, (mine, theirs) in differences.items():
        print(f"  {path}: {mine!r} -> {theirs!r}")
    table = compare_ledgers(reference, other)
    print()
    print(format_table(table))
    acceptance = compare_acceptance(reference, other)
    if not acceptance.empty:
        bar = reference.tolerances["acceptance_length_abs"]
        print(f"\nAcceptance length (tokens per step; the bar is REFERENCE's ±{bar:g})")
        print(format_table(acceptance))
    if table.empty:
        return EXIT_PROBLEMS
    if args.plot:
        from specledger.render.compare_plots import write_change_plot

        print(write_change_plot(table, f"{other.id} against {reference.id}", args.plot, acceptance))
    return EXIT_OK


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


def _audit_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", nargs="+", metavar="REPORT.md", help="Markdown files with claim marks")
    parser.add_argument("--ledgers", action="append", default=None, metavar="PATH",
                        help="a folder of ledgers, or one ledger file (repeatable; default: ledgers)")
    parser.add_argument("--strict", action="store_true",
                        help="unaudited numbers fail the run too (a number that differs from its claim always does)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only what fails and the summary")


@command(
    "audit-report",
    "check the numeric claims marked in Markdown reports against the ledgers",
    _audit_report_arguments,
)
def cmd_audit_report(args: argparse.Namespace) -> int:
    from specledger.analysis.claims import LedgerSet, audit_report, summary_line

    missing = [r for r in args.reports if not Path(r).exists()]  # a FIFO or device exists: refused on reading
    if missing:
        raise _UsageError(f"no such report: {' '.join(missing)}")
    try:
        ledgers = LedgerSet.load(args.ledgers or ["ledgers"])
    except FileNotFoundError as e:
        raise _UsageError(str(e)) from None
    for problem in ledgers.problems:
        print(f"warning: ledger does not load: {problem}")
    audits, unreadable = [], 0
    for report in args.reports:
        try:
            audits.append(audit_report(report, ledgers))
        except LedgerError as e:  # one unreadable report fails the run, the others are still audited
            unreadable += 1
            for problem in e.problems:
                print(f"error: {problem}")
    for audit in audits:
        for verdict in audit.verdicts:
            if verdict.status != "holds" or not args.quiet:
                print(verdict)
        for number in audit.unaudited:
            print(number)
    print(summary_line(audits))
    # a shown number that differs from its own claim is an error, not an unaudited-number warning
    failed = unreadable or any(
        a.count("fails") or a.count("unresolved") or any(n.mismatch for n in a.unaudited) for a in audits
    )
    return EXIT_PROBLEMS if failed or (args.strict and any(a.unaudited for a in audits)) else EXIT_OK


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ledger", metavar="LEDGER", help="a measured ledger")
    parser.add_argument("--workload", help="only this workload (default: every measured one)")
    parser.add_argument("--temperature", type=float, help="only this temperature (default: every measured one)")
    parser.add_argument("--drafter", help="only this drafter (a method, e.g. ngram; default: every one)")
    parser.add_argument("--engine", metavar="VERSION", help="also judge engine support for this vLLM version")
    parser.add_argument("--platform", choices=("cuda", "cpu"), default="cuda", help="platform of --engine")
    parser.add_argument("--json", action="store_true", help="print the policies as JSON")


@command(
    "policy",
    "derive a batch-size speculation schedule (and routing advice) from a ledger's measured curve",
    _policy_arguments,
)
def cmd_policy(args: argparse.Namespace) -> int:
    import json

    from specledger.analysis.policy import derive_policies, drafter_groups, policy_document, render_policy
    from specledger.analysis.schedule_support import engine_verdicts

    path, ledger = _load_one(args.ledger)
    if args.workload is not None and args.workload not in {w["name"] for w in ledger.workloads}:
        raise _UsageError(f"{path}: no workload {args.workload!r}")
    if args.drafter is not None and args.drafter not in drafter_groups(ledger):
        raise _UsageError(f"{path}: no drafter {args.drafter!r} (drafters: {', '.join(drafter_groups(ledger))})")
    policies = derive_policies(ledger, args.workload, args.temperature, args.drafter)
    if not policies:
        print(f"{path}: no measured points (with a concurrency) for these conditions", file=sys.stderr)
        return EXIT_PROBLEMS
    extra = [("vllm", args.engine, args.platform)] if args.engine else []
    docs = []
    for i, policy in enumerate(policies):
        method = str(next(iter(policy.configs.values()))["method"])
        verdicts = engine_verdicts(ledger, method, extra)
        if args.json:
            docs.append(policy_document(policy, verdicts))
        else:
            print(("\n" if i else "") + render_policy(policy, verdicts))
    if args.json:
        print(json.dumps(docs, indent=2))
    return EXIT_OK


def _load_valid_ledgers(paths: Sequence[str], load: Callable[[Path], Any] = load_ledger) -> tuple[list, int]:
    """(what `load` made of each ledger that loads, number that do not); problems go to stderr, the rest still run."""
    ledgers, invalid = [], 0
    for path in _ledger_paths(paths):
        try:
            ledgers.append(load(path))
        except LedgerError as e:
            invalid += 1
            for problem in e.problems:
                print(problem, file=sys.stderr)
    return ledgers, invalid


def _plot_arguments(parser: argparse.ArgumentParser) -> None:
    _paths_argument(parser)
    parser.add_argument("-o", "--out", required=True, metavar="DIR", help="folder for the PNGs (created if missing)")


@command(
    "plot",
    "draw <id>-multiplier/-throughput/-acceptance.png per ledger (exit 1 if nothing could be drawn)",
    _plot_arguments,
)
def cmd_plot(args: argparse.Namespace) -> int:
    from specledger.render.plots import NothingToPlot, write_plots

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise _UsageError(f"-o {args.out}: exists and is not a directory")
    ledgers, invalid = _load_valid_ledgers(args.paths)
    written = 0
    for ledger in ledgers:
        try:
            paths = write_plots(ledger, args.out, on_skip=lambda message: print(f"skipped: {message}"))
        except NothingToPlot as e:
            print(f"skipped: {e}")
            continue
        for path in paths:
            print(path)
        written += len(paths)
    if not written:
        print("no plots written", file=sys.stderr)
    return EXIT_PROBLEMS if invalid or not written else EXIT_OK


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    _paths_argument(parser)
    parser.add_argument(
        "-o", "--out", required=True, metavar="REPORT.md", help="the Markdown file; plots go to REPORT_files/ beside it"
    )


@command("report", "write a Markdown report: conditions, tables, notes and plots of each ledger", _report_arguments)
def cmd_report(args: argparse.Namespace) -> int:
    from specledger.render.markdown import write_report

    if Path(args.out).is_dir():
        raise _UsageError(f"-o {args.out}: is a directory, expected a Markdown file name")
    ledgers, invalid = _load_valid_ledgers(args.paths)
    if not ledgers:
        print("no ledger loads; no report written", file=sys.stderr)
        return EXIT_PROBLEMS
    print(write_report(ledgers, args.out))
    return EXIT_PROBLEMS if invalid else EXIT_OK


def _mix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ledger", metavar="LEDGER", help="a ledger with points for several workloads")
    parser.add_argument(
        "--weights",
        metavar="W=SHARE,...",
        help="share of generated tokens per workload, summing to 1, e.g. free-form=0.935,copy=0.065 "
        "(default: the ledger's workload_mix by generated tokens)",
    )
    parser.add_argument("--arm", help="only this speculative arm (default: every one)")
    parser.add_argument("--temperature", type=float, help="only this temperature (default: every measured one)")


@command(
    "mix",
    "fleet multiplier per concurrency of a workload mix (time-weighted) and its critical concurrency",
    _mix_arguments,
)
def cmd_mix(args: argparse.Namespace) -> int:
    from specledger.analysis.mix import (
        MixError,
        check_weights,
        default_weights,
        fleet_curve,
        mix_arms,
        mix_temperatures,
        parse_weights,
        render_fleet,
    )

    path, ledger = _load_one(args.ledger)
    try:
        weights = parse_weights(args.weights) if args.weights is not None else default_weights(ledger)
        if weights is None:
            raise MixError(f"{path}: --weights is needed (the ledger has no workload_mix by generated tokens)")
        check_weights(ledger, weights)
        arms = mix_arms(ledger, args.arm)
        if not ledger.points:
            print(f"{path}: no measured points (status {ledger.status})", file=sys.stderr)
            return EXIT_PROBLEMS
        conditions = [(arm, t) for arm in arms for t in mix_temperatures(ledger, arm, args.temperature)]
    except MixError as e:
        raise _UsageError(str(e)) from None
    curves = [fleet_curve(ledger, weights, arm, temperature) for arm, temperature in conditions]
    print("\n\n".join(render_fleet(curve) for curve in curves) or f"{path}: no multiplier at a known concurrency")
    return EXIT_OK if any(not curve.empty for curve in curves) else EXIT_PROBLEMS


def _import_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="RESULT.json",
                        help="vllm bench serve --save-result files, one per arm and concurrency (arm: its --label)")
    parser.add_argument("--id", required=True, dest="ledger_id", help="the ledger's id (lower case, digits, . _ -)")
    parser.add_argument("-o", "--out", required=True, metavar="LEDGER.json",
                        help="where to write the ledger: a file name in an existing folder (the folder is not "
                        "created, so a mistyped path writes nothing)")
    parser.add_argument("--force", action="store_true",
                        help="replace LEDGER.json if it exists (a file, never a folder)")
    parser.add_argument("--baseline-label", default="baseline", metavar="LABEL",
                        help="the --label of the baseline runs (default: baseline)")
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=FILE",
                        help="file FILE under arm NAME instead of its label (repeatable)")
    parser.add_argument("--spec-config", action="append", default=[], metavar="NAME=JSON",
                        help="speculative_config of arm NAME where the files do not record it (repeatable)")
    parser.add_argument("--temperature", type=float, help="the runs' temperature where the files do not record it")
    parser.add_argument("--workload", help="workload name (default: the files' metadata, else 'bench')")
    parser.add_argument("--workload-kind", choices=("free-form", "copy", "math", "code", "mixed", "other"))
    parser.add_argument("--engine", metavar="NAME=VERSION", help="engine where the files do not say, e.g. vllm=0.26.0")
    parser.add_argument("--accelerator", metavar="KIND[:NAME]", help="where the files do not say: cpu, cuda:H200")
    parser.add_argument("--target-name", help="short target name for test ids (default: from the model folder)")
    parser.add_argument("--target-model", help="target.model to state, e.g. embedded:smollm2 (default: model_id)")
    parser.add_argument("--title", help="ledger title")


def _pairs(values: Sequence[str], flag: str) -> list[tuple[str, str]]:
    """NAME=VALUE arguments as pairs; a missing '=' is a usage error."""
    pairs = [tuple(v.split("=", 1)) for v in values]
    bad = [v for v, p in zip(values, pairs, strict=True) if len(p) != 2 or not p[0]]
    if bad:
        raise _UsageError(f"{flag} {bad[0]!r}: expected NAME=VALUE")
    return [(p[0], p[1]) for p in pairs]


@command("import-bench", "turn vllm bench serve result files into a ledger (measured, with provenance)",
         _import_bench_arguments)
def cmd_import_bench(args: argparse.Namespace) -> int:
    import json

    from specledger.importers.vllm_bench import BenchImportError, import_bench
    from specledger.ledger import write_ledger

    missing = [f for f in args.files if not Path(f).exists()]  # a FIFO or device exists: refused on reading
    if missing:
        raise _UsageError(f"no such result file: {' '.join(missing)}")
    out = Path(args.out)
    unusable = None  # an output path that cannot take a ledger: bad input (exit 1), refused before any read
    if out.is_dir():
        unusable = f"-o {args.out}: is a directory, expected a ledger file name (--force never replaces one)"
    elif not out.parent.is_dir():
        what = "is not a directory" if out.parent.exists() else "no such directory (create it first)"
        unusable = f"-o {args.out}: {out.parent} {what}"
    if unusable:
        print(f"specledger import-bench: error: {unusable}", file=sys.stderr)
        return EXIT_PROBLEMS
    configs = {}
    for name, text in _pairs(args.spec_config, "--spec-config"):
        try:
            configs[name] = json.loads(text)
        except json.JSONDecodeError as e:
            raise _UsageError(f"--spec-config {name}: not JSON: {e}") from None
    engine = dict(zip(("name", "version"), _pairs([args.engine], "--engine")[0], strict=True)) if args.engine else None
    accelerator = None
    if args.accelerator:
        kind, _, accel_name = args.accelerator.partition(":")
        accelerator = {"kind": kind, **({"name": accel_name} if accel_name else {})}
    # What the importer was told rather than read from the files goes into provenance.command.
    given = [f"--{flag.replace('_', '-')} {value}"
             for flag in ("temperature", "engine", "accelerator", "workload", "spec_config", "arm")
             for value in (getattr(args, flag) if isinstance(getattr(args, flag), list) else [getattr(args, flag)])
             if value is not None]
    try:
        data = import_bench(
            args.files, ledger_id=args.ledger_id, baseline_label=args.baseline_label,
            arm_of={file: name for name, file in _pairs(args.arm, "--arm")}, speculative_configs=configs,
            temperature=args.temperature, workload=args.workload, workload_kind=args.workload_kind, engine=engine,
            accelerator=accelerator, target_name=args.target_name, target_model=args.target_model, title=args.title,
            command=" ".join(["specledger import-bench", *given]) if given else None,
        )
        write_ledger(args.out, data, overwrite=args.force)
    except (BenchImportError, LedgerError) as e:
        print(e, file=sys.stderr)
        return EXIT_PROBLEMS
    except FileExistsError as e:
        raise _UsageError(f"{args.out} exists (use --force to replace it)") from e
    except OSError as e:  # e.g. no permission to write there
        raise _UsageError(f"-o {args.out}: cannot write: {e.strerror or e}") from None
    arms = ", ".join(a["name"] for a in data["arms"])
    print(f"{args.out}: {len(data['points'])} point(s), arms {arms}, from {len(args.files)} file(s)")
    return EXIT_OK


def _rename_benchmark_ids_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="saved pytest-benchmark runs: JSON files, or folders such as .benchmarks")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the files in place (atomically); without it, only say what would change")


@command("rename-benchmark-ids", "rename saved pytest-benchmark runs to the point grammar's test ids "
         "(copy-T0-c1 -> copy:0:1), so that compare lines old runs up with new ones",
         _rename_benchmark_ids_arguments)
def cmd_rename_benchmark_ids(args: argparse.Namespace) -> int:
    from specledger.importers.benchmark_history import BenchmarkHistoryError, rename_history
    from specledger.ledger import LedgerError

    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        raise _UsageError(f"no such file or folder: {' '.join(missing)}")
    try:
        renamed = rename_history(args.paths, write=args.write)
    except (BenchmarkHistoryError, LedgerError) as e:
        print(f"specledger rename-benchmark-ids: error: {e}", file=sys.stderr)
        return EXIT_PROBLEMS
    for r in renamed:
        verb = "renamed" if r.written else "would rename"
        print(f"{r.path}: {verb} {r.fields} id field(s)" if r.fields else f"{r.path}: nothing to rename")
    pending = sum(r.fields for r in renamed if not r.written)
    if pending:
        print(f"{pending} id field(s) in {sum(1 for r in renamed if r.fields)} file(s) to rename: "
              "run again with --write")
    return EXIT_OK


EXIT_DRIFT, EXIT_CANNOT_WATCH = 1, 3


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-url", required=True, metavar="URL",
                        help="the speculative server's /metrics (or its root, http://host:port)")
    parser.add_argument("--ledger", required=True, metavar="PATH", help="the ledger the endpoint was verified with")
    parser.add_argument("--arm", help="the ledger arm the server runs (default: the ledger's only drafting arm)")
    parser.add_argument("--workload", help="the workload the endpoint was validated on (default: the only one)")
    parser.add_argument("--temperature", type=float, help="only ledger points at this temperature")
    parser.add_argument("--window-s", type=float, default=60.0, help="sliding window (default 60 s)")
    parser.add_argument("--interval-s", type=float, default=5.0, help="seconds between reads (default 5)")
    parser.add_argument("--min-drafts", type=int, default=50,
                        help="judge a window only once it holds this many drafts (default 50)")
    parser.add_argument("--duration-s", type=float, help="stop after this long (default: until drift)")
    parser.add_argument("--length-tolerance", type=float,
                        help="acceptance-length tolerance (default: the ledger's acceptance_length_abs)")
    parser.add_argument("--rate-tolerance", type=float,
                        help="acceptance-rate tolerance (default: the length tolerance / k)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="a served model name that counts as the ledger's model (e.g. --served-model-name)")


@command("watch", "watch a live server's acceptance over a sliding window; exit 1 when it drifts from the ledger "
         "(3: cannot watch: unreachable, no spec metrics, another model)", _watch_arguments)
def cmd_watch(args: argparse.Namespace) -> int:
    from specledger.measure import watch
    from specledger.measure.http.server_metrics import EndpointError

    if args.window_s <= 0 or args.interval_s <= 0 or args.min_drafts < 1:
        raise _UsageError("--window-s and --interval-s must be > 0, --min-drafts >= 1")
    path, ledger = _load_one(args.ledger)
    try:
        expected = watch.expected_acceptance(ledger, arm=args.arm, workload=args.workload,
                                             temperature=args.temperature, length_tolerance=args.length_tolerance,
                                             rate_tolerance=args.rate_tolerance)
    except ValueError as e:
        raise _UsageError(str(e)) from None
    models = [ledger.data["target"]["model"], *args.model, ledger.data["target"].get("name") or ""]
    try:
        from specledger.models import resolve_model

        models.insert(1, resolve_model(ledger.data["target"]["model"]))
    except Exception:  # noqa: BLE001 - a watch host need not be able to build the model; names still match
        pass

    def progress(line: str) -> None:
        print(line, flush=True)

    try:
        verdict = watch.watch(args.metrics_url, expected, models, window_s=args.window_s,
                              interval_s=args.interval_s, min_drafts=args.min_drafts, duration_s=args.duration_s,
                              progress=progress)
    except EndpointError as e:
        print(f"specledger watch: cannot watch: {e}", file=sys.stderr)
        return EXIT_CANNOT_WATCH
    except watch.Drift as e:
        print(f"specledger watch: DRIFT: {e}", file=sys.stderr)
        return EXIT_DRIFT
    except KeyboardInterrupt:
        return EXIT_OK
    if verdict is None:
        print(f"specledger watch: {path}: no window held {args.min_drafts} drafts; nothing judged")
    else:
        print(f"specledger watch: within tolerance: {verdict.message}")
    return EXIT_OK


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    _paths_argument(parser)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--in-place", action="store_true", help="rewrite each ledger where it is")
    where.add_argument("-o", "--out", metavar="DIR", help="write the migrated ledgers into DIR (an existing folder)")
    parser.add_argument("--force", action="store_true", help="with -o: replace ledgers that already exist in DIR")


def _replan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ledger", metavar="LEDGER", help="the ledger whose conditions to plan again")
    parser.add_argument("-o", "--out", required=True, metavar="FILE", help="the planned ledger to write")
    parser.add_argument("--protocol", metavar="JSON", default=None,
                        help='protocol v3 settings over the source ledger\'s own (a v3 source) or the defaults, '
                             'e.g. \'{"window": {"min_s": 2.5}}\'')
    parser.add_argument("--note", default=None, help="the planned ledger's note (default: where it came from)")
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists")


@command(
    "replan",
    "write a planned ledger with another ledger's conditions (arms, workloads, grid, tolerances, accelerator) "
    "and no figure, to record it again with protocol v3",
    _replan_arguments,
)
def cmd_replan(args: argparse.Namespace) -> int:
    import json

    from specledger.ledger import write_ledger
    from specledger.ledger.migrate import replan_data

    try:
        protocol = json.loads(args.protocol) if args.protocol else None
    except json.JSONDecodeError as e:
        raise _UsageError(f"--protocol: not JSON: {e}") from None
    if protocol is not None and not isinstance(protocol, dict):
        raise _UsageError("--protocol: expected a JSON object of protocol sections")
    _, source = _load_one(args.ledger)
    try:
        data = replan_data(source.data, protocol, note=args.note)
    except ValueError as e:
        raise _UsageError(f"--protocol: {e}") from None
    try:  # validated before it is written: a --protocol value the schema refuses is named at its path
        write_ledger(Path(args.out), data, overwrite=args.force)
    except FileExistsError:
        raise _UsageError(f"-o {args.out}: exists; pass --force to replace it") from None
    except LedgerError as e:
        raise _LedgerProblems(e) from None
    grid = list(Ledger(Path(args.out), data).grid())
    print(f"{args.out}: planned {data['id']} ({len(data['arms'])} arms, {len(grid)} grid points, protocol v3)")
    return EXIT_OK


def _pool_starts_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ledger", metavar="LEDGER", help="a measured ledger whose points have engine starts")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("-o", "--out", metavar="FILE", help="write the ledger here")
    where.add_argument("--in-place", action="store_true", help="rewrite LEDGER itself")
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists")


@command(
    "pool-starts",
    "pool each arm's between-engine-start spread over the ledger's points and take every interval with it "
    "(derived figures only: no measured figure changes; a recording does the same whenever it stores a point)",
    _pool_starts_arguments,
)
def cmd_pool_starts(args: argparse.Namespace) -> int:
    from specledger.ledger import figures, write_ledger
    from specledger.measure.replication import pool_start_intervals

    path, working = _load_one(args.ledger)
    pool_start_intervals(working)
    target = Path(path) if args.in_place else Path(args.out)
    try:
        write_ledger(target, working.data, overwrite=args.in_place or args.force)
    except FileExistsError:
        raise _UsageError(f"-o {args.out}: exists; pass --force to replace it") from None
    except LedgerError as e:
        raise _LedgerProblems(e) from None
    spread = working.data.get("start_spread") or {}
    alike = figures.start_spread_homogeneity(working)
    for arm, by_figure in spread.items():
        for figure, s in by_figure.items():
            test = alike.get(arm, {}).get(figure)
            said = (f"; alike across points? Bartlett p {test.p_value:.3f}" if test is not None
                    else "; alike across points: not testable")
            print(f"{target}: {arm} {figure}: between-start sd {s['log_sd']:.4f} in logs, "
                  f"{s['df']} degrees of freedom over {s['points']} points{said}")
    if not spread:
        print(f"{target}: no point has two engine starts; intervals left as measured")
    return EXIT_OK


@command(
    "migrate",
    "rewrite schema version 1 ledgers as version 2 (points marked protocol_version 1, no figure changed); "
    "without --in-place or -o, print the one ledger given",
    _migrate_arguments,
)
def cmd_migrate(args: argparse.Namespace) -> int:
    from specledger.ledger import write_ledger
    from specledger.ledger.migrate import migrate_file

    to_stdout = not args.in_place and args.out is None
    if args.force and args.out is None:
        raise _UsageError("--force applies to -o DIR only")
    out = Path(args.out) if args.out is not None else None
    if out is not None and not out.is_dir():
        what = "is not a directory" if out.exists() else "no such directory (create it first)"
        raise _UsageError(f"-o {args.out}: {what}")
    paths = _ledger_paths(args.paths)
    if to_stdout and len(paths) != 1:
        raise _UsageError(f"printing takes one ledger, got {len(paths)}: use --in-place or -o DIR for several")
    # every ledger migrates in memory first, so one that does not load stops all writes
    migrations, invalid = _load_valid_ledgers([str(p) for p in paths], load=migrate_file)
    if invalid:
        print(f"{invalid} ledger(s) do not load; nothing written", file=sys.stderr)
        return EXIT_PROBLEMS
    if to_stdout:
        (migration,) = migrations
        if migration.already_current:
            print(f"{migration.path}: already v2", file=sys.stderr)
            sys.stdout.write(migration.path.read_text(encoding="utf-8"))
        else:
            sys.stdout.write(migration.text())
        return EXIT_OK
    targets = {m.path: (out / m.path.name if out is not None else m.path) for m in migrations}
    pending = [m for m in migrations if not m.already_current]
    if out is not None:
        names = [targets[m.path].name for m in pending]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _UsageError(f"-o {args.out}: several ledgers would be written as {', '.join(twice)}")
        existing = [str(targets[m.path]) for m in pending if targets[m.path].exists()]
        if existing and not args.force:
            raise _UsageError(f"{', '.join(existing)} exist(s) (use --force to replace)")
    created: list[Path] = []
    try:
        for migration in pending:
            target = targets[migration.path]
            existed = target.exists()
            write_ledger(target, migration.data or {}, overwrite=args.in_place or args.force)
            if not existed:
                created.append(target)
    except OSError as e:
        for path in created:  # -o creates all of its files or none
            path.unlink(missing_ok=True)
        raise _UsageError(f"cannot write {target}: {e.strerror or e}") from None
    for migration in migrations:
        target = targets[migration.path]
        if migration.already_current:
            print(f"{migration.path}: already v2" + ("" if out is None else " (not written)"))
        else:
            arrow = "" if out is None else f" -> {target}"
            print(f"{migration.path}{arrow}: migrated to v2 ({migration.points_marked} point(s) "
                  "marked protocol_version 1)")
    return EXIT_OK


def _crosscheck_arguments(parser: argparse.ArgumentParser) -> None:
    from specledger.measure import crosscheck

    crosscheck.add_arguments(parser)


@command("crosscheck", "the suite's multiplier against `vllm bench serve` on the same two servers, with both CIs",
         _crosscheck_arguments)
def cmd_crosscheck(args: argparse.Namespace) -> int:
    from specledger.measure import crosscheck

    return crosscheck.run(args)


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
    except _LedgerProblems as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return EXIT_PROBLEMS
    except BrokenPipeError:
        # The reader left early (`specledger show L | head`): what it read is what it asked for. Point stdout at
        # devnull so the interpreter's final flush does not raise again, and exit as a process SIGPIPE ended would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
