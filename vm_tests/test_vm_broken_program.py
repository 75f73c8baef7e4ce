"""The verifier's word must reach the person reading a failed run.

A deliberately broken XDP program (a packet read with no bounds check) must
fail to load, and the verifier's message must be in the output pytest
captured (bcc prints the verifier log to fd 2, so capfd sees it).  A
well-formed program in the same source must load: one compile (a bcc
compile costs about a minute under TCG) gives both the control and the
broken case.

Lives in vm_tests/ (outside `testpaths`), so the host's plain `pytest` does
not collect it; `vm_tests/run.py` runs it in the VM, and it passes on the
host too: `.venv/bin/python -m pytest vm_tests/test_vm_broken_program.py`.
"""
from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.root

SOURCE = r"""
#include <uapi/linux/bpf.h>

int xdp_ok(struct xdp_md *ctx)
{
    unsigned char *data = (unsigned char *)(long)ctx->data;
    unsigned char *end = (unsigned char *)(long)ctx->data_end;
    if (data + 21 > end)
        return XDP_PASS;
    return data[20] == 0x42 ? XDP_DROP : XDP_PASS;
}

/* Broken on purpose: reads byte 20 of the packet without checking
 * data_end first.  Every kernel's verifier rejects it with
 * "invalid access to packet". */
int xdp_broken(struct xdp_md *ctx)
{
    unsigned char *data = (unsigned char *)(long)ctx->data;
    return data[20] == 0x42 ? XDP_DROP : XDP_PASS;
}
"""

VERIFIER_SAYS = re.compile(r"invalid access to packet")


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (BPF_PROG_LOAD)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "needs bcc (Debian's python3-bpfcc)"
    return None


@pytest.fixture(scope="module")
def bpf():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    from bcc import BPF

    b = BPF(text=SOURCE.encode())
    yield b
    b.cleanup()


def test_well_formed_program_loads(bpf):
    from bcc import BPF

    fn = bpf.load_func(b"xdp_ok", BPF.XDP)
    assert fn.fd >= 0


def test_broken_program_is_rejected_with_verifier_message(bpf, capfd):
    from bcc import BPF

    with pytest.raises(Exception) as excinfo:
        bpf.load_func(b"xdp_broken", BPF.XDP)
    out, err = capfd.readouterr()
    log = out + err + str(excinfo.value)
    # Show what was seen, so a failure of this test is readable too.
    print(f"uname -r: {os.uname().release}")
    print(f"exception: {excinfo.value!r}")
    print("captured verifier output:\n" + (out + err))
    assert "xdp_broken" in str(excinfo.value), excinfo.value
    assert VERIFIER_SAYS.search(log), f"no verifier message in: {log!r}"
