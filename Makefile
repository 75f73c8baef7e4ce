# mrc-ebpf: `make demo` runs the main job, `make test` the tests.
# Both run `make setup` first, which installs only what is missing.
PY := .venv/bin/python
# compiled datapaths are kept here, not in /var/cache (datapath/build_cache.py)
export MRC_EBPF_CACHE ?= $(CURDIR)/build/bpf-cache

.PHONY: setup demo test test-unit fuzz vm-test bench clean install-unit

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m mrc_ebpf.demo

test: setup
	$(PY) -m pytest -q tests --durations=15

test-unit: setup
	$(PY) -m pytest -q tests -m "not root"

# RX under 1,000,000 fuzzed frames (tests/datapath/test_fuzz.py; `make
# test` runs a short run).  FUZZ_SEED=N for another seed, FUZZ_CASES=N.
fuzz: setup
	MRC_FUZZ_CASES=$(or $(FUZZ_CASES),1000000) MRC_FUZZ_SEED=$(or $(FUZZ_SEED),1) \
		$(PY) -m pytest -q -s tests/datapath/test_fuzz.py

# The kernel-touching tests inside a virtme-ng VM on Debian's 6.1 kernel
# (KERNEL=/path/to/bzImage for another); installs qemu, the kernel image and
# virtme-ng first.  TESTS='pytest args' runs something else in the VM.
vm-test: setup
	@bash vm_tests/setup.sh $(CURDIR)/.venv
	$(PY) vm_tests/run.py $(if $(TESTS),--tests '$(TESTS)') $(if $(KERNEL),--kernel $(KERNEL))

bench: setup
	$(PY) -m mrc_ebpf.cli.mrcctl bench all

# The systemd template unit (mrc-ebpf@DEV: applies /etc/mrc-ebpf/DEV.yaml,
# which `mrcctl save --dev DEV` writes, at boot; docs/ops.md), written by
# `mrcctl install-unit` with the absolute path of this tree's .venv/bin/mrcctl
# (a wheel's user runs `mrcctl install-unit` itself).
UNITDIR ?= /etc/systemd/system
install-unit: setup
	$(PY) -m mrc_ebpf.cli.mrcctl install-unit --dir $(DESTDIR)$(UNITDIR)

clean:
	rm -rf .venv *.egg-info .pytest_cache bench-results vm_tests/out build/bpf-cache
