"""Some cells of `ridgeline study jigsaw --served`, rerun on the current code: the ones a
change is about, when the whole study (some two hours on 2 cores since plans are checked
in six 20,000-request windows) does not fit. Not a test, not in `make bench`.

    .venv/bin/python benchmarks/jigsaw_cells.py social-media/8xH100-80GB/1.0/none ...

Each argument is APP/GPUS/SLO_FACTOR/SETTING (the spec's SLO × the factor: 1.0 or 0.5);
each is one job of the study (its three arrival processes), two at a time. Prints the
study's progress line and one markdown row per cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ridgeline.report.jigsaw import served_line
from ridgeline.study._pool import as_finished
from ridgeline.study.jigsaw_served import _cells, _Job

SPECS = Path(__file__).resolve().parent.parent / "examples" / "specs"


def main() -> None:
    jobs = []
    for arg in sys.argv[1:]:
        app, gpus, factor, setting = arg.split("/")
        jobs.append(_Job(SPECS / f"{app}.yaml", gpus, float(factor), setting, 20_000, 7,
                         (1, 2, 4, 8, 16, 32)))  # fmt: skip
    for cells in as_finished(_cells, jobs, 2):
        print(served_line(cells), flush=True)
        for c in cells:
            late = "no plan" if not c.requests else f"{c.violation_rate:.2%}"
            print(
                f"| {c.app} | {c.gpus} | {c.slo_ms:g} | {c.setting} | {c.arrivals} | "
                f"{c.plain_max_rps:.1f} | {c.max_rps:.1f} | "
                f"{(c.sized_for_rps or 0) / c.max_rps if c.max_rps else 0:.2f}× | {late} | "
                f"{c.violation_rate_no_drop:.2%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
