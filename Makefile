# Quick start:  make run   (set up, fetch the default models, complete a prompt)
#               make test  (set up, fetch the test models, run the whole suite)
PROMPT ?= Write a Python function that reverses a linked list
ES := .venv/bin/edgespec

.PHONY: setup models run test test-fast clean

setup:
	@bash scripts/setup.sh

models: setup
	$(ES) models pull default tiny

run: setup
	$(ES) models pull default
	$(ES) complete "$(PROMPT)" --stats

test: models
	.venv/bin/python -m pytest

# Unit tests only (no real model): seconds.
test-fast: setup
	.venv/bin/python -m pytest -m "not real"

clean:
	rm -rf .venv .pytest_cache build *.egg-info edgespec/core/_rows.*.so
