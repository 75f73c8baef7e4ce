"""Numbers as iperf3 users type and read them.

Rates take decimal suffixes (100M = 100,000,000 bit/s) and sizes binary
ones (128K = 131072 bytes), as iperf3 does; output uses the same units
(MBytes are 2^20 bytes, Mbits/sec are 10^6 bit/s).
"""
from __future__ import annotations

import re

from mrc_ebpf.errors import MrcError

_NUMBER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)\s*$")
_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def _parse(text: str, base: int, what: str, example: str) -> float:
    match = _NUMBER.match(str(text))
    if not match:
        raise MrcError(f"bad {what} {text!r}: expected a number with an optional K/M/G/T suffix, "
                       f"e.g. {example}")
    return float(match.group(1)) * base ** _POWER[match.group(2).lower()]


def parse_rate(text: str) -> int:
    """Bits per second; 0 means unlimited."""
    return int(_parse(text, 1000, "bitrate", "100M"))


def parse_size(text: str, what: str = "length") -> int:
    return int(_parse(text, 1024, what, "128K"))


def _scaled(value: float, base: int, units: list[str]) -> str:
    i = 0
    while value >= base and i < len(units) - 1:
        value /= base
        i += 1
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return f"{value:.{digits}f} {units[i]}"


def fmt_bytes(n: float) -> str:
    return _scaled(float(n), 1024, ["Bytes", "KBytes", "MBytes", "GBytes", "TBytes"])


_BIT_UNITS = ["bits/sec", "Kbits/sec", "Mbits/sec", "Gbits/sec", "Tbits/sec"]
_BYTE_UNITS = ["Bytes/sec", "KBytes/sec", "MBytes/sec", "GBytes/sec", "TBytes/sec"]
UNITS = "kmgtKMGT"


def fmt_rate(bps: float, unit: str | None = None) -> str:
    """iperf3's rate column; `unit` is -f's letter: k/m/g/t bits, K/M/G/T
    bytes per second (bytes in powers of 1024, as iperf3), None adaptive."""
    if not unit:
        return _scaled(float(bps), 1000, _BIT_UNITS)
    power = "kmgt".index(unit.lower()) + 1
    if unit.islower():
        value, name = bps / 1000 ** power, _BIT_UNITS[power]
    else:
        value, name = bps / 8 / 1024 ** power, _BYTE_UNITS[power]
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return f"{value:.{digits}f} {name}"
