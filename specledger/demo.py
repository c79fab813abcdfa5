"""The main job: measure the embedded default's multiplier curve here and set it beside the committed one.

On a machine without CUDA it re-measures ``ledgers/cpu-smollm2.json`` on the CPU engine;
with CUDA, ``ledgers/h200-smollm2-copy.json``. The fresh ledger goes to ``--out`` (never over
the committed one), then the table, acceptance lengths, critical concurrencies and the
arms' effective-config differences are printed, with a verdict per point against the
committed figures when there are any.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specledger import compare, report
from specledger.schema import Ledger, load_ledger

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_ledger(root: Path = REPO_ROOT) -> Path:
    """The GPU ledger where CUDA is present, else the CPU one."""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    return root / "ledgers" / ("h200-smollm2-copy.json" if cuda else "cpu-smollm2.json")


def _progress(message: str) -> None:
    print(f"[specledger {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specledger demo", description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=None,
                        help="ledger whose conditions to measure (default: by device, see above)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="where the freshly measured ledger is written (default: out/demo)")
    parser.add_argument("--concurrency", type=int, action="append", default=None,
                        help="measure only these concurrencies (repeatable)")
    args = parser.parse_args(argv)

    from specledger.session import SuiteSession  # imports the engine layer only when measuring

    path = args.ledger or default_ledger()
    committed = load_ledger(path)
    keys = [k for k in committed.grid() if args.concurrency is None or k[2] in args.concurrency]
    if not keys:
        print(f"{path}: nothing to measure (no sweep grid, or no point at the chosen concurrencies)",
              file=sys.stderr)
        return 2
    _progress(f"measuring {len(keys)} points of {committed.id} ({path}); engines start first, this takes minutes")
    session = SuiteSession(root=REPO_ROOT, record=True, out_dir=args.out, progress=_progress,
                           command="specledger demo " + " ".join(argv or []))
    t0 = time.monotonic()
    written: Path | None = None
    try:
        for i, key in enumerate(keys, 1):
            _progress(f"point {i}/{len(keys)}: {key[0]} T={key[1]:g} c={key[2]}")
            written = session.store(committed, session.measure(committed, key))
        summary = session.summary_lines()
    finally:
        session.close()
    fresh = load_ledger(written) if written else committed
    print(f"\nMeasured {len(keys)} points in {time.monotonic() - t0:.0f} s -> {written}\n")
    print(report.format_table(report.points_table([fresh])))
    print()
    print(report.format_table(report.critical_table([fresh])))
    print()
    print("\n".join(summary))
    _verdicts(committed, fresh)
    return 0


def _verdicts(committed: Ledger, fresh: Ledger) -> None:
    """Set the fresh figures against the committed ones, point by point."""
    if not committed.points:
        print(f"\n{committed.id}: no committed figures to compare with yet.")
        return
    print(f"\nAgainst the committed {committed.id}:")
    for point in fresh.points:
        old = committed.find_point(point["workload"], point["temperature"], point["concurrency"])
        if old is None:
            continue
        for arm in committed.speculative_arms():
            result = compare.compare_point(committed, arm["name"], old, point)
            tid = f"{committed.id}-{arm['name']}-{point['workload']}-T{point['temperature']:g}-c{point['concurrency']}"
            print(("PASS " if result.ok else "FAIL ") + result.message(tid).replace("\n", "\n     "))


if __name__ == "__main__":
    sys.exit(main())
