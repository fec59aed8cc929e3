"""docs/architecture.md is the map: it must match the tree and the import contracts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "ridgeline"
DOC = ROOT / "docs" / "architecture.md"


def _layers_table() -> list[list[str]]:
    """The layers table's package column, one list of names per row, highest first."""
    rows = []
    in_table = False
    for line in DOC.read_text().splitlines():
        if line.startswith("| layer | packages"):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            if line.startswith("|---"):
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
            # the packages column: backticked names, independent ones joined by \|
            names = re.findall(r"`([A-Za-z_0-9]+)/?`", cells[1])
            rows.append(names)
    return rows


def _top_level_units() -> set[str]:
    units = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    units |= {p.stem for p in PKG.glob("*.py") if p.stem not in {"__init__", "__main__"}}
    return units


def test_every_top_level_package_and_module_has_one_row_in_the_layers_table() -> None:
    named = [n for row in _layers_table() for n in row]
    assert len(named) == len(set(named)), "a package is named in two layers"
    assert set(named) == _top_level_units()


def test_the_import_contract_declares_the_same_layers_in_the_same_order() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    declared = [sorted(re.split(r"\s*[|:]\s*", layer.strip("()"))) for layer in layers]
    assert declared == [sorted(row) for row in _layers_table()]


def _package_bullets() -> dict[str, set[str]]:
    """Each ``- `pkg/`: ...`` bullet of the map: the modules it names."""
    bullets: dict[str, set[str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        m = re.match(r"- `([a-z_0-9]+)/`", line)
        if m:
            current = m.group(1)
            bullets[current] = set()
        elif not line.startswith("  "):
            current = None
        if current is not None:
            bullets[current] |= set(re.findall(r"`([a-z_0-9]+)\.py`", line))
    return bullets


def test_the_map_names_every_public_module_of_every_package_and_no_other() -> None:
    bullets = _package_bullets()
    packages = {u for u in _top_level_units() if (PKG / u).is_dir()}
    assert set(bullets) == packages
    for package, named in bullets.items():
        modules = {
            p.stem
            for p in (PKG / package).glob("*.py")
            if not p.stem.startswith("_") or p.stem == "__init__"
        } - {"__init__"}
        private = {p.stem for p in (PKG / package).glob("_*.py")} - {"__init__"}
        assert named - modules - private - {"__init__"} == set(), f"{package}/: named but missing"
        assert modules - named == set(), f"{package}/: modules the map does not name"


def _forbidding(key: str, modules: list[str]) -> dict[str, list[str]]:
    """The one "forbidden" import contract whose ``key`` lists exactly ``modules``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = config["contracts"]
    (found,) = [c for c in contracts if c["type"] == "forbidden" and c[key] == modules]
    return dict(found)


def test_nothing_below_the_commands_imports_the_fake_server() -> None:
    forbidden = _forbidding("forbidden_modules", ["ridgeline.fakeserver"])
    sources = {m.removeprefix("ridgeline.") for m in forbidden["source_modules"]}
    assert sources == _top_level_units() - {"_entry", "cli", "fakeserver"}


def test_the_map_names_what_the_fake_server_may_not_import_as_the_contract_does() -> None:
    contract = _forbidding("source_modules", ["ridgeline.fakeserver"])
    pattern = r"^- \*\*the fake stands alone\*\*:(.*?)\n(?! )"
    bullet = re.search(pattern, DOC.read_text(), re.M | re.S)
    assert bullet is not None, "the map's Contracts list names the contract"
    names = bullet.group(1).partition("none of")[2].partition("(")[0]
    named = set(re.findall(r"`([a-z_0-9]+)/?`", names))
    assert {m.removeprefix("ridgeline.") for m in contract["forbidden_modules"]} == named
