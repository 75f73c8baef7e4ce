"""The registry of Python definitions of C layouts ("mirrors").

Python reads C's constants and enums from the sources (source.py), but a
struct it reads or writes through a map, or decodes off the wire, needs a
Python twin: a ctypes type, or a scapy layer.  Each twin is registered
here with the C type it mirrors and the file that defines it;
tests/test_layout.py compiles every such file with bcc, compares each
twin field by field (name, offset, size) with what the compiler laid out,
and fails on a ctypes struct or scapy layer anywhere in mrc_ebpf that is
not registered.  So a second definition cannot drift, and a new one cannot
be added unchecked.

How a twin is compared (`kind`):
  struct  the whole C type, field for field (the project's own structs);
  prefix  the leading fields of a kernel struct that may grow at the end
          (struct bpf_prog_info: Python reads the head it needs);
  libbpf  a struct of libbpf's API (an *_opts struct): its fields' offsets
          and sizes against the installed libbpf's bpf/bpf.h (libbpf-dev),
          compiled by the host's C compiler;
  scapy   a scapy layer: field names and sizes in order against a
          registered ctypes twin of the same C type (`of`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from mrc_ebpf.datapath.source import COMMON_HEADER

KERNEL_BPF_H = "uapi/linux/bpf.h"   # an angle-bracket include: the kernel's UAPI
LIBBPF_BPF_H = "bpf/bpf.h"          # libbpf's API (libbpf-dev), for kind "libbpf"


@dataclasses.dataclass(frozen=True)
class Mirror:
    py: type
    c_type: str             # "struct mrc_tlv", "struct bpf_map_create_opts"
    source: Path | str      # a file of the tree, or a kernel header (KERNEL_BPF_H)
    kind: str = "struct"
    of: type | None = None  # kind "scapy": the ctypes twin its fields follow


REGISTRY: list[Mirror] = []
KINDS = ("struct", "prefix", "libbpf", "scapy")


def register(py: type, c_type: str, source: Path | str = COMMON_HEADER, kind: str = "struct",
             of: type | None = None) -> type:
    if kind not in KINDS:
        raise ValueError(f"mirror kind {kind!r}: one of {KINDS}")
    REGISTRY.append(Mirror(py, c_type, source, kind, of))
    return py


def mirror(c_type: str, source: Path | str = COMMON_HEADER, kind: str = "struct"):
    """Class decorator: `@mirror("struct mrc_peer")` over its ctypes twin."""
    def decorate(cls: type) -> type:
        return register(cls, c_type, source, kind)
    return decorate
