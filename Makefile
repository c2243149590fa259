# The two commands users need: `make repro` (whole pipeline) and `make test` (ruff, the import
# layers (lint-imports), the strict docs build, the test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: repro test lint clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile "$(TORCH_SPEC)" || $(PY) -m pip install -q --no-compile "torch>=2.4"
	$(PY) -m pip install -q --no-compile -e ".[dev,s3,rlhf,docs]"
	@# Test-only packages without their dependencies (pyproject.toml, [tool.prefshift] test-no-deps).
	$(PY) -m pip install -q --no-compile --no-deps $$($(PY) scripts/test_no_deps.py)
	@# Bytecode on every core (pip compiles on one: 118 s CPU, half the install on a 2-core machine).
	@# It must be there: with PYTHONDONTWRITEBYTECODE set, imports would recompile every time
	@# (torch, transformers and mlflow: 27 s per process instead of 11). The few files that are
	@# not Python 3 (templates in some packages) fail here as pip skips them, hence the `|| true`.
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

repro: $(STAMP)
	. $(VENV)/bin/activate && HF_HUB_OFFLINE=1 dvc repro
	@echo ""
	@echo "Results: reports/summary.md, reports/figures/, reports/metrics.json (dvc metrics show)."
	@echo "Runs:    $(VENV)/bin/prefshift ui   (MLflow UI on the default sqlite database)"
	@echo "Model:   reports/promotion.json says which student (if any) is champion; then $(VENV)/bin/prefshift pull models:/prefshift-reward@champion --out rm/"

test: $(STAMP)
	. $(VENV)/bin/activate && HF_HUB_OFFLINE=1 ruff check . && lint-imports && scripts/check_docs.sh && HF_HUB_OFFLINE=1 python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25

clean-venv:
	rm -rf $(VENV)
