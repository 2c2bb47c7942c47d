# The README's two commands: `make run` and `make test`. Both set up .venv first.
.PHONY: setup setup-dev test-deps run test test-fast lint bench

# Setup takes seconds even with nothing to do (pip resolves every requirement), so it runs only
# when .venv is missing or older than what it is made from: each stamp file records a finished
# setup. Remove .venv (or the stamp) to force one.
SETUP := .venv/.setup-done
SETUP_DEV := .venv/.setup-dev-done

$(SETUP): pyproject.toml scripts/setup
	./scripts/setup
	touch $@

# The dev extra holds the base install, so it satisfies a plain setup too.
$(SETUP_DEV): pyproject.toml scripts/setup
	./scripts/setup dev
	touch $@ $(SETUP)

setup: $(SETUP)

setup-dev: $(SETUP_DEV)

# The daemon on its embedded default: all GPUs, or gloo with 2 CPU ranks; metrics on
# http://127.0.0.1:19464/metrics. Extra flags: make run ARGS="--config my.yaml".
run: $(SETUP)
	.venv/bin/netmon serve $(ARGS)

lint: $(SETUP_DEV)
	.venv/bin/ruff check netmon tests bench grafana deploy
	.venv/bin/ruff format --check netmon tests bench grafana deploy
	.venv/bin/mypy

# What the tests use (Prometheus, promtool, amtool, iproute2, kubectl...), when missing.
test-deps:
	./scripts/test-deps

# Every tier: what waits two at a time, then what measures alone (scripts/test-suite); ARGS
# given, one pytest run of what they select.
test: test-deps lint
	./scripts/test-suite $(ARGS)

# After each edit: the pure tier (no process started; tests/README.md), in minutes. `make test`
# runs every tier and is what CI and a change's last check run.
test-fast: $(SETUP_DEV)
	.venv/bin/python -m pytest -m pure -q $(ARGS)

bench: $(SETUP_DEV)
	.venv/bin/python bench/probe_vs_loop.py
