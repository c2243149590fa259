# The two commands users need: `make repro` (whole pipeline) and `make test` (test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: repro test lint clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" || $(PY) -m pip install -q "torch>=2.4"
	$(PY) -m pip install -q -e ".[dev,s3,rlhf]"
	touch $(STAMP)

repro: $(STAMP)
	. $(VENV)/bin/activate && HF_HUB_OFFLINE=1 dvc repro
	@echo ""
	@echo "Results: reports/summary.md, reports/figures/, reports/metrics.json (dvc metrics show)."
	@echo "Runs:    $(VENV)/bin/prefshift ui   (MLflow UI on the default sqlite database)"
	@echo "Model:   $(VENV)/bin/prefshift pull models:/prefshift-reward@champion --out rm/   (see reports/promotion.json)"

test: $(STAMP)
	. $(VENV)/bin/activate && HF_HUB_OFFLINE=1 ruff check src tests bench && HF_HUB_OFFLINE=1 python -m pytest -q -n 2 --dist loadfile --durations=25

clean-venv:
	rm -rf $(VENV)
