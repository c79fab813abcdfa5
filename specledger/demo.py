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

from specledger.analysis import verdict
from specledger.ledger import Ledger, load_ledger
from specledger.ledger.selection import point_test_id
from specledger.render import tables

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
    line = f"[specledger {time.strftime('%H:%M:%S')}] {message}"
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)  # above the sweep's progress bar, not through it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specledger demo", description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=None,
                        help="ledger whose conditions to measure (default: by device, see above)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="where the freshly measured ledger is written (default: out/demo)")
    parser.add_argument("--concurrency", type=int, action="append", default=None,
                        help="measure only these concurrencies (repeatable)")
    args = parser.parse_args(argv)

    from tqdm import tqdm

    from specledger.measure.session import SuiteSession  # imports the engine layer only when measuring

    path = args.ledger or default_ledger()
    committed = load_ledger(path)
    keys = [k for k in committed.grid() if args.concurrency is None or k[2] in args.concurrency]
    if not keys:
        print(f"{path}: nothing to measure (no sweep grid, or no point at the chosen concurrencies)",
              file=sys.stderr)
        return 2
    if args.out.resolve() == path.resolve().parent:
        print(f"--out {args.out}: that is the committed ledger's folder; the demo never writes over it",
              file=sys.stderr)
        return 2
    _progress(f"measuring {len(keys)} points of {committed.id} ({path}); engines start first, this takes minutes")
    # Fixed repeats (no adaptive additions), so the demo's length is known; its verdicts say when 5 are too few.
    session = SuiteSession(root=REPO_ROOT, record=True, out_dir=args.out, progress=_progress,
                           command="specledger demo " + " ".join(argv or []), adaptive=False, force_busy=True)
    t0 = time.monotonic()
    written: Path | None = None
    try:
        with tqdm(total=len(keys), desc="points", unit="point", file=sys.stderr, dynamic_ncols=True) as bar:
            for key in keys:
                bar.set_postfix_str(f"{key[0]}:{key[1]:g}:{key[2]}")
                written = session.store(committed, session.measure(committed, key))
                bar.update(1)
        summary = session.summary_lines()
        not_comparable = session.not_comparable(committed)
    finally:
        session.close()
    fresh = load_ledger(written) if written else committed
    print(f"\nMeasured {len(keys)} points in {time.monotonic() - t0:.0f} s -> {written}\n")
    print(tables.format_table(tables.points_table([fresh])))
    print()
    print(tables.format_table(tables.critical_table([fresh])))
    print()
    print("\n".join(summary))
    outcomes = _verdicts(committed, fresh, not_comparable)
    changed = [o for o in outcomes if o in ("changed", "failed")]
    if changed:
        print(f"\n{len(changed)} verdict(s) changed or failed against the committed {committed.id}: exit 1")
        return 1
    return 0


def _verdicts(committed: Ledger, fresh: Ledger, not_comparable: str | None) -> list[str]:
    """Set the fresh figures against the committed ones, point by point; the outcomes."""
    if not committed.points:
        print(f"\n{committed.id}: no committed figures to compare with yet.")
        return []
    print(f"\nAgainst the committed {committed.id}:")
    outcomes = []
    for point in fresh.points:
        old = committed.find_point(point["workload"], point["temperature"], point["concurrency"])
        if old is None:
            continue
        for arm in committed.arms:
            result = verdict.compare_point(committed, arm["name"], old, point, not_comparable=not_comparable)
            tid = point_test_id(committed.id, arm["name"], (point["workload"], point["temperature"],
                                                             point["concurrency"]))
            outcomes.append(result.outcome)
            print(f"{result.outcome.upper():>15} " + result.message(tid).replace("\n", "\n" + " " * 16))
    return outcomes


if __name__ == "__main__":
    sys.exit(main())
