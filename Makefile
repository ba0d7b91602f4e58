# The README's two commands are `make up` and `make test`; .ci/run calls `make test`.
.PHONY: up test bootstrap lint typecheck docs pytest bench suffix-decoding

VENV := .venv
BIN := $(VENV)/bin

up: bootstrap
	$(BIN)/tiergate up

test: bootstrap lint typecheck docs pytest

bootstrap:
	bash scripts/bootstrap.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m tiergate.chartschema --check

typecheck:
	$(BIN)/mypy

# The manual (docs/), warnings as errors; the site lands in site/.
docs:
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

pytest:
	$(BIN)/pytest -ra --durations=20

# Opt-in: suffix decoding's drafter (arctic-inference, built from source); see
# docs/fast-tier.md for what it measured and how to make it a tuning candidate.
suffix-decoding: bootstrap
	bash scripts/install-suffix.sh

bench:
	TIERGATE_BENCH_TOOLS=1 bash scripts/bootstrap.sh
	$(BIN)/pip install -q 'matplotlib>=3.8' 'vllm-router==0.1.17' py-spy
	$(BIN)/tiergate bench gateway --out reports --repeat 3 --workers 1,2
	$(BIN)/tiergate bench limits --out reports
	$(BIN)/tiergate tune --force > reports/tier-decision.md
	@echo "tier benchmark: with 'make up' running, $(BIN)/tiergate bench tiers --out reports"
