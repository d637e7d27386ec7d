# Quick start:  make run   (set up, fetch the default models, complete an edit of given code:
#                          the stats line ends with the measured speedup over plain decoding)
#               make test  (set up, fetch the test models, run the whole suite)
# make run PROMPT="..." completes your own prompt instead of scripts/first_run_prompt.txt.
PROMPT ?=
ES := .venv/bin/edgespec

.PHONY: setup models run test test-fast clean

setup:
	@bash scripts/setup.sh

models: setup
	$(ES) models pull default tiny

run: setup
	$(ES) models pull default
	$(if $(PROMPT),$(ES) complete "$(PROMPT)" --stats,$(ES) complete --stats < scripts/first_run_prompt.txt)

test: models
	.venv/bin/python -m pytest

# Unit tests only (no real model): seconds.
test-fast: setup
	.venv/bin/python -m pytest -m "not real"

clean:
	rm -rf .venv .pytest_cache build *.egg-info edgespec/core/_rows.*.so
