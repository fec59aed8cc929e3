# Two commands set up a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-busy test-readme bench lint typecheck clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# exit status 3 is INCONCLUSIVE (the host was too busy to measure): said, not an error
demo: $(STAMP)
	$(BIN)/ridgeline demo || [ $$? -eq 3 ]

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q

# the suite with one busy-loop process beside it (a loaded host); the loop ends with the suite
test-busy: $(STAMP)
	$(BIN)/python -c "while True: pass" & pid=$$!; trap "kill $$pid" EXIT; \
	$(BIN)/ruff check src tests benchmarks && $(BIN)/mypy && $(BIN)/lint-imports && $(BIN)/pytest -q

# the README's two long flows as written (a 10-minute budgeted probe; profile, plan,
# serve, probe and calibrate): about 30 minutes of load, so not in every `make test`
test-readme: $(STAMP)
	RIDGELINE_README_LONG=1 $(BIN)/pytest -q tests/test_readme.py

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null 2>&1 || echo "wrk not installed: its rows will say n/a"
	$(BIN)/python benchmarks/loadgen.py
	$(BIN)/python benchmarks/search.py
	$(BIN)/python benchmarks/realtime.py
	$(BIN)/python benchmarks/realtime_budget.py
	$(BIN)/python benchmarks/serve.py
	$(BIN)/python benchmarks/planner.py
	$(BIN)/python benchmarks/plan_check.py
	$(BIN)/python benchmarks/drop_rule.py
	$(BIN)/python benchmarks/budget_bank.py
	$(BIN)/python benchmarks/probe_cost.py
	$(BIN)/python benchmarks/resolution.py
	$(BIN)/python benchmarks/plan_real.py
	bash benchmarks/readme_probe.sh
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/plansim.py
	$(BIN)/python benchmarks/llm.py
	$(BIN)/python benchmarks/llm_capacity.py --loopback --speed 4 --kv 16384
	$(BIN)/python benchmarks/llm_capacity.py --cost
	$(BIN)/python benchmarks/llm_capacity.py --budget 900
	$(BIN)/python benchmarks/llm_goodput.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .bench-venv build *.egg-info src/*.egg-info
