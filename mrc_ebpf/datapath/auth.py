"""Keys and epochs of authenticated feedback (bpf/lib/auth.h).

A key file holds one 128-bit secret shared by the hosts of a fabric: 32
hex digits on a line of their own (blank lines and `#` comments
allowed), e.g. made with `head -c16 /dev/urandom | xxd -p`.  A key's id,
sent in every TLV it signs, is derived from the key, so hosts agree on it
without being told.  `siphash24` is SipHash-2-4 in Python, for tests and
tools that check MACs on captured packets.
"""
from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import os
import re
import struct
import time
from pathlib import Path

from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.source import C
from mrc_ebpf.errors import MrcError

KEY_BYTES = 16
MAC_OFF, FB_OFF, EPOCH_OFF = C["MRC_TLV_MAC_OFF"], C["MRC_TLV_FB_OFF"], C["MRC_TLV_EPOCH_OFF"]
_MASK = (1 << 64) - 1


def read_key(path: str | Path) -> bytes:
    """The key in PATH, or MrcError with one line saying what is wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or "not a text file"
        raise MrcError(f"key file {path}: {reason}")
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if len(lines) != 1:
        raise MrcError(f"key file {path}: expected one line of {2 * KEY_BYTES} hex digits, "
                       f"found {len(lines)} lines")
    if not re.fullmatch(r"[0-9a-fA-F]{%d}" % (2 * KEY_BYTES), lines[0]):
        raise MrcError(f"key file {path}: expected {2 * KEY_BYTES} hex digits (a 128-bit key), "
                       f"e.g. from `head -c16 /dev/urandom | xxd -p`")
    key = bytes.fromhex(lines[0])
    if key == bytes(KEY_BYTES):
        raise MrcError(f"key file {path}: the key is all zeros")
    return key


def new_key_file(path: str | Path) -> Path:
    """PATH, holding a new random key (mode 0600) if it did not exist; a
    key file already there is checked and kept, so every host configured
    from it gets the same key.  MrcError, one line, if it cannot be."""
    path = Path(path).resolve()
    key = os.urandom(KEY_BYTES)
    while key == bytes(KEY_BYTES):
        key = os.urandom(KEY_BYTES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        read_key(path)
        return path
    except OSError as e:
        raise MrcError(f"cannot make key file {path}: {e.strerror or e}")
    with os.fdopen(fd, "w") as f:
        f.write(f"# mrc-ebpf fabric key (id {key_id(key)}): every host of the fabric needs this file\n"
                f"{key.hex()}\n")
    return path


def key_id(key: bytes) -> int:
    """1..255, the same on every host for the same key."""
    return hashlib.blake2b(key, digest_size=1, person=b"mrc-key-id").digest()[0] % 255 + 1


def new_epoch() -> int:
    """CLOCK_REALTIME in 2^-10 s, modulo 2^32: later attaches get later
    epochs (compared modulo 2^32, valid for 24 days apart)."""
    return (time.time_ns() >> 20) & 0xFFFFFFFF


def auth_key(key: bytes) -> layout.AuthKey:
    k0, k1 = struct.unpack("<QQ", key)
    return layout.AuthKey(k0=k0, k1=k1, id=key_id(key))


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of DATA under a 16-byte KEY, as a 64-bit integer."""
    k0, k1 = struct.unpack("<QQ", key)
    v = [0x736f6d6570736575 ^ k0, 0x646f72616e646f6d ^ k1, 0x6c7967656e657261 ^ k0, 0x7465646279746573 ^ k1]

    def rounds(n):
        for _ in range(n):
            v[0] = (v[0] + v[1]) & _MASK; v[1] = _rotl(v[1], 13) ^ v[0]; v[0] = _rotl(v[0], 32)  # noqa: E702
            v[2] = (v[2] + v[3]) & _MASK; v[3] = _rotl(v[3], 16) ^ v[2]  # noqa: E702
            v[0] = (v[0] + v[3]) & _MASK; v[3] = _rotl(v[3], 21) ^ v[0]  # noqa: E702
            v[2] = (v[2] + v[1]) & _MASK; v[1] = _rotl(v[1], 17) ^ v[2]; v[2] = _rotl(v[2], 32)  # noqa: E702

    tail = len(data) % 8
    words = [struct.unpack_from("<Q", data, i)[0] for i in range(0, len(data) - tail, 8)]
    words.append(int.from_bytes(data[len(data) - tail:], "little") | ((len(data) & 0xFF) << 56))
    for m in words:
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def mac_message(src: str, dst: str, tlv: bytes) -> bytes:
    """What the MAC of a TLV covers, in this order (bpf/lib/auth.h): final
    destination (the peer's SID), outer source, the TLV's epoch word, its
    bytes 8..23, its feedback words when its flags say it carries
    feedback, its bytes 3..7."""
    tlv = bytes(tlv)
    data = (ipaddress.IPv6Address(dst).packed + ipaddress.IPv6Address(src).packed
            + tlv[EPOCH_OFF:MAC_OFF] + tlv[8:FB_OFF])
    if tlv[layout.MrcTlv.flags.offset] & C["MRC_F_FEEDBACK"]:
        data += tlv[FB_OFF:EPOCH_OFF]
    return data + tlv[3:8]


def tlv_mac(key: bytes, src: str, dst: str, tlv: bytes) -> bytes:
    """The MAC a TLV carries, from outer source SRC to final destination
    DST (bpf/lib/auth.h), as the 8 bytes of its mac field."""
    return struct.pack("<Q", siphash24(key, mac_message(src, dst, tlv)))


# ---- the pinned `auth` map of an attachment --------------------------------

def read(att) -> layout.Auth:
    return att.maps["auth"].lookup(layout.Index(0)) or layout.Auth()


def write(att, value: layout.Auth) -> None:
    att.maps["auth"].update(layout.Index(0), value)


def describe(value: layout.Auth) -> dict:
    slots = []
    for i, k in enumerate(value.keys):
        if k.id:
            slots.append({"slot": i, "key_id": k.id, "signs": value.tx_slot == i + 1})
    return {"epoch": value.epoch, "keys": slots, "authenticated": bool(slots)}


def _slot_of(value: layout.Auth, key: bytes) -> int | None:
    want = auth_key(key)
    for i, k in enumerate(value.keys):
        if k.id and (k.k0, k.k1) == (want.k0, want.k1):
            return i
    return None


def initial(key: bytes | None) -> layout.Auth:
    """What attach writes: a new epoch, and KEY alone, signing."""
    value = layout.Auth(epoch=new_epoch())
    if key is not None:
        value.keys[0] = auth_key(key)
        value.tx_slot = 1
    return value


def add(value: layout.Auth, key: bytes, sign: bool) -> layout.Auth:
    """KEY accepted besides the key we sign with (and signing with it when
    SIGN).  Step one of a roll-over: every host accepts the new key before
    any signs with it."""
    new = layout.Auth.from_buffer_copy(bytes(value))
    slot = _slot_of(new, key)
    if slot is None:
        free = [i for i, k in enumerate(new.keys) if not k.id]
        if not free:
            raise MrcError("two keys are installed already: `mrcctl key retire` the one not signing first")
        slot = free[0]
        candidate = auth_key(key)
        for i, k in enumerate(new.keys):
            if k.id and k.id == candidate.id:
                raise MrcError(f"the new key's id {k.id} is that of the installed key: "
                               f"make another key")
        new.keys[slot] = candidate
    if sign:
        new.tx_slot = slot + 1
    return new


def retire(value: layout.Auth) -> tuple[layout.Auth, int]:
    """Drop the key we do not sign with; returns the new value and the id
    dropped (0: none)."""
    new = layout.Auth.from_buffer_copy(bytes(value))
    dropped = 0
    for i, k in enumerate(new.keys):
        if k.id and new.tx_slot != i + 1:
            dropped = k.id
            ctypes.memset(ctypes.addressof(new.keys[i]), 0, ctypes.sizeof(layout.AuthKey))
    return new, dropped


def clear(value: layout.Auth) -> layout.Auth:
    """No keys: unsigned TLVs out, every TLV filed (as without --key-file)."""
    return layout.Auth(epoch=value.epoch)
