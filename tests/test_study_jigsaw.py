"""The JigsawServe study on a tiny spec and a small table: the laws the switches obey
(more features never serve less; the whole-graph floor never serves more; a switch
that is off keeps its options out of every plan), the ranges it runs, the document it
writes and the command that writes it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ridgeline.report.jigsaw import (
    HEADLINE,
    INPUTS,
    RANGES,
    SETTINGS_BLOCK,
    blocks,
    served_markdown,
    update_document,
)
from ridgeline.study.jigsaw import SETTINGS, JigsawConfig, features, fit_error, run_jigsaw
from ridgeline.study.jigsaw_result import JigsawResult, SettingRow
from ridgeline.study.jigsaw_served import ARRIVALS, REL, kept_line, load_kept, run_served

pytestmark = pytest.mark.timeout(120)

TINY = """\
name: tiny
slo_ms: 300
accuracy_floor: 0.9
demand_rps: 50
tasks:
  detect:
    variants:
      - {name: det-s, accuracy: 40, gflops: 5}
      - {name: det-l, accuracy: 44, gflops: 60}
  classify:
    variants:
      - {name: cls-s, accuracy: 75, gflops: 2}
      - {name: cls-l, accuracy: 80, gflops: 20}
edges:
  - {source: detect, target: classify, factor: 1.5}
"""
GPUS = "2xA100-80GB"
LARGER = "3xA100-80GB"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jigsaw") / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def result(tiny: Path) -> JigsawResult:
    """Every variant and both scopes on two GPUs, the central inputs on three; 2,000
    simulated requests a plan (about 8 s)."""
    cfg = JigsawConfig(
        specs=(tiny,),
        gpus=(GPUS,),
        central_gpus=(LARGER,),
        batches=(1, 4, 16),
        requests=2_000,
        jobs=1,
    )
    return run_jigsaw(cfg)


def _groups(result: JigsawResult) -> dict[tuple[str, str, str], dict[str, SettingRow]]:
    out: dict[tuple[str, str, str], dict[str, SettingRow]] = {}
    for r in result.rows:
        out.setdefault((r.gpus, r.variant, r.scope), {})[r.setting] = r
    return out


def _subset(a: str, b: str) -> bool:
    return all(x <= y for x, y in zip(features(a).as_tuple(), features(b).as_tuple(), strict=True))


def test_it_runs_every_setting_under_every_variant_and_the_graph_floor_under_a(
    result: JigsawResult,
) -> None:
    e = fit_error()
    assert result.latency_error == e == 0.2191
    assert result.variants == [
        "central",
        f"latency ×{math.exp(-e):.2f}",
        f"latency ×{math.exp(e):.2f}",
        "SLO ×0.5",
        "SLO ×2",
    ]
    groups = _groups(result)
    assert {v for g, v, _ in groups if g == GPUS} == set(result.variants)
    assert {(v, s) for g, v, s in groups if g == LARGER} == {
        ("central", "path"),
        ("central", "graph"),
    }
    for (gpus, variant, scope), rows in groups.items():
        expected = SETTINGS if scope == "path" else tuple(s for s in SETTINGS if "A" in s)
        assert tuple(rows) == expected, (gpus, variant, scope)
    assert {s for _, v, s in groups if v != "central"} == {"path"}
    assert result.gpus == [GPUS, LARGER]
    assert result.row("tiny", GPUS, "none", "SLO ×0.5").slo_ms == 150.0


def test_more_features_never_serve_less(result: JigsawResult) -> None:
    """A superset of features keeps every option of its subset (A: more variants, S:
    more segments, T: the equal budgets imply the path bound), so its feasible demands
    contain the subset's, and ``max_demand``'s bisection, the same points tried until
    the two part, can only end higher. Held on every variant and both scopes."""
    for key, rows in _groups(result).items():
        for a, b in ((a, b) for a in rows for b in rows if _subset(a, b)):
            assert rows[b].max_demand_rps >= rows[a].max_demand_rps, (key, a, b)
    central = _groups(result)[GPUS, "central", "path"]
    assert central["A+S+T"].max_demand_rps > central["none"].max_demand_rps > 0


def test_the_whole_graph_floor_never_serves_more_than_the_per_path_one(
    result: JigsawResult,
) -> None:
    for s in (s for s in SETTINGS if "A" in s):
        graph = result.row("tiny", GPUS, s, scope="graph")
        path = result.row("tiny", GPUS, s)
        assert graph.max_demand_rps <= path.max_demand_rps
        assert graph.graph_accuracy is not None and graph.graph_accuracy >= 0.9


def test_a_switch_that_is_off_keeps_its_options_out_of_every_plan(
    result: JigsawResult,
) -> None:
    """None: whole GPUs with MIG off and the most accurate variants; T off: every task
    within its equal share of the SLO."""
    app = result.apps[0]
    for r in result.rows:
        if not r.tasks:
            continue
        f = features(r.setting)
        if not f.spatial:
            assert {t.segment for t in r.tasks} == {"gpu"}, r
        if not f.accuracy_scaling:
            assert all(t.best for t in r.tasks) and r.accuracy == 1.0, r
        if not f.graph_budgets:
            budget = app.equal_budget_ms * r.slo_scale
            assert all(t.fill_ms + t.wait_ms + t.exec_ms <= budget + 1e-9 for t in r.tasks), r
    none = result.row("tiny", GPUS, "none")
    assert [(t.variant, t.segment) for t in none.tasks] == [("det-l", "gpu"), ("cls-l", "gpu")]
    assert app.equal_budget_ms == 135.0  # 90 % of 300 ms over two tasks


def test_every_setting_serves_none_s_demand_for_no_more_than_none_costs(
    result: JigsawResult,
) -> None:
    """Every setting holds none's options, so at none's max demand its least cost is no
    more than none's (within the MILP's 1 % gap)."""
    none = result.row("tiny", GPUS, "none")
    assert none.cost is not None
    for s in SETTINGS:
        r = result.row("tiny", GPUS, s)
        assert r.cost_at_none_max is not None and r.cost_at_none_max <= none.cost * 1.01, s
        assert r.at_none_max is not None and r.at_none_max.demand_rps == none.max_demand_rps


def test_the_central_plans_are_simulated_at_their_own_max_and_no_others(
    result: JigsawResult,
) -> None:
    for r in result.rows:
        central = r.variant == "central" and r.scope == "path"
        assert (r.at_max is not None) == central, r
        if r.at_max is not None:
            assert r.at_max.demand_rps == r.max_demand_rps
            assert 1_800 < r.at_max.requests < 2_200  # Poisson, 2,000 expected
            assert (
                round(r.at_max.violation_rate * r.at_max.requests)
                == r.at_max.dropped + r.at_max.late
            )


def test_a_ratio_is_its_central_value_within_its_range(result: JigsawResult) -> None:
    r = result.ratio("tiny", GPUS, "A+S+T", "none")
    assert r.central is not None and r.low is not None and r.high is not None
    assert r.low <= r.central <= r.high and r.central > 1
    assert sorted(r.values) == sorted(result.variants) and r.undefined == []
    graph = result.ratio("tiny", GPUS, "A+S+T", "A+T", scope="graph")
    assert list(graph.values) == ["central"] and graph.undefined == []
    larger = result.ratio("tiny", LARGER, "A+S+T", "none")
    assert list(larger.values) == ["central"] and larger.low == larger.central


def test_the_report_writes_its_blocks_between_markers_and_replaces_them(
    result: JigsawResult, tmp_path: Path
) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\nbefore\n\n<!-- jigsaw:headline:start -->\nold\n"
        "<!-- jigsaw:headline:end -->\n\nafter\n"
    )
    generated = blocks(result, command="ridgeline study jigsaw --quick", commit="abc1234")
    update_document(doc, generated)
    once = doc.read_text()
    update_document(doc, generated)
    assert doc.read_text() == once
    assert "old" not in once and once.startswith("# Title\n\nbefore\n\n<!-- jigsaw:headline:start")
    for name in generated:
        assert once.count(f"<!-- jigsaw:{name}:start -->") == 1
    assert generated[INPUTS].startswith(
        "Generated by `ridgeline study jigsaw --quick` on "
        f"{result.started_at:%Y-%m-%d} at commit `abc1234`"
    )
    headline = generated[HEADLINE].splitlines()
    assert headline[0] == "| max demand | paper | GPUs | tiny |"
    assert headline[2].startswith(f"| A+S+T ÷ none | 21.6× | {GPUS} | ")
    assert headline[2].endswith("] |")  # central [min, max]
    assert headline[3].startswith(f"| A+S+T ÷ none | 21.6× | {LARGER} | ")
    assert "[" not in headline[3]  # the central inputs only
    ranges = generated[RANGES]
    assert GPUS in ranges and LARGER not in ranges
    sections = generated[SETTINGS_BLOCK].split("##### ")[1:]
    assert [s.splitlines()[0] for s in sections] == [f"tiny on {GPUS}", f"tiny on {LARGER}"]
    for section in sections:
        table = [line for line in section.splitlines() if line.startswith("| ")]
        assert [line.split(" | ")[0].strip("| ") for line in table[1:]] == list(SETTINGS)


def test_the_command_quick_on_a_small_case_writes_the_document(tiny: Path, tmp_path: Path) -> None:
    """Written, by default, into the user's ``ridgeline-runs/`` (created), never into the
    project's committed ``docs/`` page unless ``--out`` names it (issue 33, fault 22)."""
    out, raw = tmp_path / "ridgeline-runs" / "reproduction-jigsawserve.md", tmp_path / "j.json"
    run = subprocess.run(
        [sys.executable, "-m", "ridgeline", "study", "jigsaw", "--quick", "--spec", str(tiny),
         "--gpus", GPUS, "--requests", "1000", "--time-limit", "30", "--jobs", "1",
         "--json", str(raw), "--kept", str(tmp_path / "kept.jsonl")],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )  # fmt: skip
    assert not (tmp_path / "docs").exists()
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert text.startswith("# The JigsawServe reproduction\n")
    assert f"`ridgeline study jigsaw --quick --gpus {GPUS} --spec {tiny}" in text
    assert "--time-limit 30" in text  # HiGHS's limit, as given, in the command written
    assert "<!-- jigsaw:settings:end -->" in text
    written = JigsawResult.model_validate(json.loads(raw.read_text()))
    assert written.variants == ["central"] and written.requests == 1_000
    assert "[ 2/2] tiny" in run.stderr and "tables written to" in run.stderr


# --- --served: plans sized for their traffic, served with dropping on and off -------------


def test_plans_sized_for_their_traffic_are_served_and_dropping_never_misses_more(
    tiny: Path,
) -> None:
    """Issue 32: each plan is sized until it holds under one arrival process, at the most
    demand the GPUs then serve (no more than the plain maximum), and served afresh under
    that process (another seed than the check's) with dropping on and off; on the same
    arrivals dropping misses no more. The report marks a cell where it did."""
    cells = run_served(
        (tiny,), (GPUS,), requests=2_000, seed=7, jobs=1, batches=(1, 4, 16),
        settings=("none", "A+S+T"), slo_factors=(1.0,),
    )  # fmt: skip
    assert [(c.setting, c.arrivals) for c in cells] == [
        (s, a) for s in ("none", "A+S+T") for a in ARRIVALS
    ]
    for c in cells:
        assert 0 < c.max_rps <= c.plain_max_rps * (1 + REL), c
        assert c.sized_for_rps is not None and c.sized_for_rps >= c.max_rps, c
        assert c.requests > 1_000 and c.drop_helps, c
    bursty = {c.setting: c for c in cells if c.arrivals == "gamma:cv=3"}
    plain = {c.setting: c for c in cells if c.arrivals == "poisson"}
    assert all(bursty[s].max_rps <= plain[s].plain_max_rps for s in bursty)

    # kept as it went (--kept): a second run serves none of them again, and a line cut
    # short, or kept for another --requests, is not taken
    lines = [kept_line([c for c in cells if c.setting == s], 2_000, 7) for s in ("none", "A+S+T")]
    kept = load_kept("".join(lines) + '{"requests": 2000, "seed": 7, "ce', 2_000, 7)
    assert kept == cells and load_kept("".join(lines), 5_000, 7) == []
    ran: list[object] = []
    again = run_served(
        (tiny,), (GPUS,), requests=2_000, seed=7, jobs=1, batches=(1, 4, 16),
        settings=("none", "A+S+T"), slo_factors=(1.0,), kept=kept, on_done=ran.append,
    )  # fmt: skip
    assert again == cells and ran == []

    worse = cells[0].model_copy(update={"violation_rate": 0.02, "violation_rate_no_drop": 0.01})
    result = JigsawResult.model_validate(
        {**_empty_result(), "served": [c.model_dump() for c in (*cells, worse)]}
    )
    text = served_markdown(result, command="ridgeline study jigsaw --served", commit="abc")
    assert f"Of the {len(cells) + 1} served:" in text
    assert f"**{len(cells)}** with dropping on missing no more than with it off" in text
    assert text.count(" ✗ |") == 1 and "**2.00 %** (" in text


def _empty_result() -> dict[str, object]:
    return {
        "started_at": "2026-12-05T00:00:00Z", "wall_s": 1.0, "jobs": 1, "cpus": 2,
        "latency_error": 0.2, "saturation_gflop_per_sm": None, "requests": 2_000, "seed": 7,
        "rel": 0.01, "time_limit_s": 60.0, "batches": [1], "gpus": [GPUS],
        "variants": ["central"], "apps": [], "gpu_types": [], "occupancy": [], "rows": [],
    }  # fmt: skip
