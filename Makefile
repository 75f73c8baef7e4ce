# mrc-ebpf: `make demo` runs the main job, `make test` the tests.
# Both run `make setup` first, which installs only what is missing.
PY := .venv/bin/python

.PHONY: setup demo test test-unit vm-test clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m mrc_ebpf.demo

test: setup
	$(PY) -m pytest -q tests

test-unit: setup
	$(PY) -m pytest -q tests -m "not root"

vm-test: setup
	@bash vm_tests/setup.sh $(CURDIR)/.venv
	$(PY) vm_tests/run.py $(if $(KERNEL),--kernel $(KERNEL))

clean:
	rm -rf .venv *.egg-info .pytest_cache bench-results vm_tests/out
