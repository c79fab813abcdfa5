"""Plots: real PNGs with the right names, the numbers of the tables, crossings where theory puts them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from repo_paths import ROOT
from repo_paths import SMALL as SMALL_PATH

from specledger.analysis import theory
from specledger.cli import main
from specledger.ledger import Ledger, figures, load_ledger, parse_ledger
from specledger.render.plots import (
    NothingToPlot,
    acceptance_figure,
    multiplier_figure,
    throughput_figure,
    write_plots,
)

SMALL = load_ledger(SMALL_PATH)
H200 = load_ledger(ROOT / "tests" / "data" / "h200-smollm2.json")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _planned(tmp_path: Path) -> Path:
    data = json.loads(SMALL_PATH.read_text())
    data.update(status="planned", points=[], id="planned-small")
    for key in ("provenance", "critical_concurrency", "claims"):
        data.pop(key)
    path = tmp_path / "planned.json"
    path.write_text(json.dumps(data))
    return path


def _crossing_markers(fig: Figure) -> dict[str, tuple[float, float]]:
    return {
        line.get_gid(): (float(line.get_xdata()[0]), float(line.get_ydata()[0]))
        for ax in fig.axes
        for line in ax.get_lines()
        if (line.get_gid() or "").startswith("crossing|")
    }


def _legend_labels(fig: Figure) -> list[str]:
    return [text.get_text() for ax in fig.axes if ax.get_legend() for text in ax.get_legend().get_texts()]


@pytest.fixture(scope="module")
def h200_pngs(tmp_path_factory) -> list[Path]:
    return write_plots(H200, tmp_path_factory.mktemp("plots"))


def test_h200_writes_three_readable_pngs(h200_pngs):
    assert [p.name for p in h200_pngs] == [
        "h200-smollm2-multiplier.png",
        "h200-smollm2-throughput.png",
        "h200-smollm2-acceptance.png",
    ]
    for path in h200_pngs:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert image.std() > 0.01  # not a blank canvas


def test_planned_ledger_raises_instead_of_empty_images(tmp_path):
    planned = load_ledger(_planned(tmp_path))
    out = tmp_path / "out"
    with pytest.raises(NothingToPlot, match=r"planned-small: nothing to plot: no measured points \(status planned\)"):
        write_plots(planned, out)
    assert not out.exists()
    with pytest.raises(NothingToPlot, match="no multiplier plot"):
        multiplier_figure(planned)


def test_crossing_marker_sits_at_theory_value_on_the_one_line():
    fig = multiplier_figure(SMALL)
    expected = theory.critical_concurrency([1, 4, 16], [1.8, 1.3, 0.8])
    assert expected.kind == "crosses"
    markers = _crossing_markers(fig)
    assert set(markers) == {"crossing|eagle|copy|0"}
    x, y = markers["crossing|eagle|copy|0"]
    assert x == pytest.approx(expected.value, rel=1e-12)
    assert y == 1.0
    assert any("crosses 1.0 at c=9.19 (between 4 and 16)" in label for label in _legend_labels(fig))


def test_reference_crossing_and_null_concurrency_points():
    int4 = load_ledger(ROOT / "ledgers" / "reference-b200-int4.json")
    (x, _), *_ = _crossing_markers(multiplier_figure(int4)).values()
    assert x == pytest.approx(theory.critical_concurrency([1, 2, 4, 8], [1.43, 1.23, 1.06, 0.82]).value)
    # points without a concurrency are skipped: only the c=8 figures are drawn
    workloads = load_ledger(ROOT / "ledgers" / "reference-b200-workloads.json")
    fig = multiplier_figure(workloads)
    drawn = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("dflash2")]
    assert sorted(list(line.get_xdata()) for line in drawn) == [[8], [8]]
    assert any("does not cross (only c=8)" in label for label in _legend_labels(fig))
    assert any("below from c=8" in label for label in _legend_labels(fig))
    # a ledger whose points all lack a concurrency has nothing to draw
    with pytest.raises(NothingToPlot, match="reference-b200-lookup-math: nothing to plot"):
        write_plots(load_ledger(ROOT / "ledgers" / "reference-b200-lookup-math.json"), "/nonexistent/never-made")


def test_h200_multiplier_lines_follow_the_ledger():
    fig = multiplier_figure(H200)
    ngram = fig.axes[0]
    assert ngram.get_xscale() == "log"
    assert list(ngram.get_xticks()) == [1, 2, 4, 8, 16, 64]
    line = next(li for li in ngram.get_lines() if li.get_label().startswith("ngram copy T=0"))
    assert list(line.get_xdata()) == [1, 2, 4, 8, 16, 64]
    assert list(line.get_ydata()) == [0.925, 0.762, 1.159, 0.591, 0.698, 0.598]
    assert line.get_label() == "ngram copy T=0: below from c=1 (>= 1.0 again at c=4)"
    assert any(li.get_ydata()[0] == 1.0 and li.get_ydata()[-1] == 1.0 for li in ngram.get_lines())  # break-even
    assert not _crossing_markers(fig)  # every h200 curve starts below 1.0
    assert "vllm 0.26.0" in fig.get_suptitle() and "NVIDIA H200" in fig.get_suptitle()


def test_spread_bars_are_paired_repeat_ratios():
    fig = multiplier_figure(SMALL)
    bars = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    ranges = sorted((seg[0][1], seg[1][1]) for bar in bars for seg in bar.get_segments())
    ratios = [178.0 / 99.0, 180.0 / 100.0, 183.0 / 101.5]  # c=1 spec and baseline repeats, paired
    assert ranges[-1] == pytest.approx((min(ratios), max(ratios)))


def test_v3_bars_are_the_multipliers_95ci_and_the_legend_brackets_the_crossing():
    """A v3 point states its paired-bootstrap CI: that is the bar, and the legend says where the
    crossing can lie once the CIs count, and where the curve comes back above 1.0."""
    v3 = load_ledger(ROOT / "ledgers" / "h200-smollm2-copy.json")
    fig = multiplier_figure(v3)
    ngram = fig.axes[0]
    bars = sorted((seg[0][1], seg[1][1]) for c in ngram.collections if isinstance(c, LineCollection)
                  for seg in c.get_segments())
    assert bars == sorted(tuple(p["arms"]["ngram"]["multiplier_ci95"]) for p in v3.points)  # every T, every c
    label = next(li.get_label() for li in ngram.get_lines() if li.get_label().startswith("ngram copy T=0"))
    t0 = [p for p in v3.points if p["temperature"] == 0.0]
    lows = {p["concurrency"]: p["arms"]["ngram"]["multiplier_ci95"][0] for p in t0}
    highs = {p["concurrency"]: p["arms"]["ngram"]["multiplier_ci95"][1] for p in t0}
    cs = sorted(lows)
    win, loss = theory.loss_bracket(cs, [lows[c] for c in cs], [highs[c] for c in cs])
    assert f"with the CIs between {win} and {loss}" in label
    assert ">= 1.0 again at c=" in label
    assert figures.CI_BAR == "95% CI (paired bootstrap over the windows of one engine start)"
    assert f"bars: {figures.CI_BAR}" in ngram.get_legend().get_title().get_text()


def test_throughput_panels_and_arms():
    fig = throughput_figure(H200)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in panels) == ["copy T=0", "copy T=1", "free-form T=0", "free-form T=1"]
    copy_t0 = next(ax for ax in panels if ax.get_title() == "copy T=0")
    assert {li.get_label() for li in copy_t0.get_lines()} == {"baseline", "matched-baseline", "ngram", "draft-self"}
    baseline = next(li for li in copy_t0.get_lines() if li.get_label() == "baseline")
    assert list(baseline.get_ydata())[:2] == [551.5, 604.5]
    assert copy_t0.get_yscale() == "log"
    assert len(copy_t0.collections) == 4  # one min..max band per arm


def test_acceptance_points_sit_on_the_theory_curve():
    fig = acceptance_figure(H200)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["ngram, k=7", "draft-self, k=4"]
    for ax, k in zip(fig.axes, (7, 4), strict=True):
        offsets = [xy for c in ax.collections if isinstance(c, PathCollection) for xy in c.get_offsets()]
        assert len(offsets) == 22
        for alpha, length in offsets:
            assert theory.expected_tokens_per_step(float(alpha), k) == pytest.approx(float(length), abs=1e-9)


def test_acceptance_needs_k(tmp_path):
    data = json.loads(SMALL_PATH.read_text())
    data["arms"][2]["speculative_config"].pop("num_speculative_tokens")
    ledger = parse_ledger(json.dumps(data), "no-k.json")
    with pytest.raises(NothingToPlot, match="no acceptance plot"):
        acceptance_figure(ledger)
    skipped: list[str] = []
    paths = write_plots(ledger, tmp_path, on_skip=skipped.append)
    assert [p.name for p in paths] == ["test-small-multiplier.png", "test-small-throughput.png"]
    assert skipped == [
        "test-small: no acceptance plot: no speculative arm has both num_speculative_tokens and an acceptance length"
    ]


def test_cli_plot(tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["plot", str(SMALL_PATH), "-o", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / f"test-small-{kind}.png") for kind in ("multiplier", "throughput", "acceptance")]
    assert main(["plot", str(_planned(tmp_path)), "-o", str(out)]) == 1
    assert "planned-small: nothing to plot" in capsys.readouterr().out
    assert main(["plot", str(SMALL_PATH), "-o", str(SMALL_PATH)]) == 2
    assert main(["plot", str(SMALL_PATH)]) == 2  # -o is required


def test_ledger_is_not_mutated():
    before = json.dumps(SMALL.data)
    multiplier_figure(SMALL)
    assert json.dumps(SMALL.data) == before
    assert isinstance(SMALL, Ledger)


def test_each_engine_start_of_a_point_is_drawn_at_its_bar():
    """A point of two starts shows both starts' multipliers (from the windows of each), and the legend says so;
    a ledger of one start each draws none."""
    h100 = load_ledger(ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b.json")
    fig = multiplier_figure(h100)
    drawn = {line.get_gid(): sorted(float(y) for y in line.get_ydata())
             for ax in fig.axes for line in ax.get_lines() if (line.get_gid() or "").startswith("starts|")}
    for point in h100.points:
        for arm in ("ngram", "draft-0.5b"):
            result, base = point["arms"][arm], point["arms"]["baseline"]
            starts = result["window"]["start"]
            expected = []
            for start in sorted(set(starts)):
                mine = [i for i, s in enumerate(starts) if s == start]
                expected.append(sum(result["output_tokens_per_s"]["repeats"][i] for i in mine)
                                / sum(base["output_tokens_per_s"]["repeats"][i] for i in mine))
            gid = f"starts|{arm}|{point['workload']}|0|{point['concurrency']}"
            assert drawn[gid] == pytest.approx(sorted(expected))
    assert "o: each engine start's multiplier" in fig.axes[0].get_legend().get_title().get_text()
    one_start = multiplier_figure(load_ledger(ROOT / "ledgers" / "h200-smollm2-copy.json"))
    assert not any((line.get_gid() or "").startswith("starts|") for ax in one_start.axes for line in ax.get_lines())


def test_bars_over_engine_starts_say_their_degrees_of_freedom():
    """With few starts t is large and every bar of the arm wide: the legend says how many degrees of freedom the
    ledger's pooled between-start spread has; a ledger that pools none says nothing of them."""
    for name in ("h100-qwen2.5-coder-1.5b.json", "h100-qwen2.5-coder-1.5b-fp8.json"):
        ledger = load_ledger(ROOT / "ledgers" / name)
        df = figures.start_spread(ledger.data, "ngram", "multiplier").df
        titles = [ax.get_legend().get_title().get_text() for ax in multiplier_figure(ledger).axes
                  if ax.get_legend() and "ngram" in ax.get_title()]
        assert titles and all(f"t with {df} degree{'s' if df != 1 else ''} of freedom" in t for t in titles), titles
    one_start = multiplier_figure(load_ledger(ROOT / "ledgers" / "h200-smollm2-copy.json"))
    assert not any("degree" in (ax.get_legend().get_title().get_text() if ax.get_legend() else "")
                   for ax in one_start.axes)
