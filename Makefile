# The README's two commands: `make run` and `make test`. Both set up .venv first.
.PHONY: setup setup-dev test-deps run test lint bench

setup:
	./scripts/setup

setup-dev:
	./scripts/setup dev

# The daemon on its embedded default: all GPUs, or gloo with 2 CPU ranks; metrics on
# http://127.0.0.1:19464/metrics. Extra flags: make run ARGS="--config my.yaml".
run: setup
	.venv/bin/netmon serve $(ARGS)

lint: setup-dev
	.venv/bin/ruff check netmon tests bench grafana deploy
	.venv/bin/ruff format --check netmon tests bench grafana deploy
	.venv/bin/mypy

# Debian packages the tests use (Prometheus, promtool, amtool, iproute2...), when missing.
test-deps:
	./scripts/test-deps

test: test-deps lint
	.venv/bin/python -m pytest $(ARGS)

bench: setup-dev
	.venv/bin/python bench/probe_vs_loop.py
