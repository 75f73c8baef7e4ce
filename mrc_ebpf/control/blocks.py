"""Peer blocks: a host config's template peers as runs of the address plan.

In a two-tier plane the hosts behind one leaf have consecutive prefixes
and SIDs in the fabric's address plan, so a config names them as a block
(a template, the first peer's prefix and SID, a count, and the bit length
of the step between peers: `step: 48` puts each next peer one /48
further, in its prefix and its SID alike) instead of one entry each: the
131,072-NIC config is a few hundred lines, not 1.45 GB.

The canonical form is what `compress` makes of the expanded peers, sorted
by template and prefix, maximal runs first: a file and `show-config` of
what it applied give the same blocks, however the file split them.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.control import bulk
from mrc_ebpf.errors import MrcError

MAX_PEERS = bulk.MAX_PEER_PREFIXES
ALL = (1 << 128) - 1


class BlockError(MrcError):
    def __init__(self, line: int | None, reason: str):
        super().__init__(reason)
        self.line = line or 1


def prefix_value(text: str) -> tuple[int, int]:
    length, value = bulk.prefix_int(text)
    if length > 128 or value >> 32 == 0xFFFF and length >= 96:
        raise MrcError(f"bad prefix {text!r}: a peer block's prefixes are IPv6 "
                       f"(IPv4 peers go in peers:)")
    return length, value


def sid_value(text: str) -> int:
    return bulk.sid_int(text)


@dataclasses.dataclass
class Block:
    template: str
    length: int         # prefix length
    prefix: int         # the first prefix, as an int
    sid: int            # the first SID
    count: int = 1
    step: int = 0       # bit length of the step; 0: the prefix length
    line: int | None = None

    def __post_init__(self):
        if not self.step:
            self.step = self.length
        if not 1 <= self.step <= self.length:
            raise MrcError(f"step {self.step}: 1..{self.length} (the prefix length, or coarser)")
        inc = self.inc
        if self.prefix + (self.count - 1) * inc > ALL:
            raise MrcError(f"{self.count} prefixes from {bulk.prefix_text(self.length, self.prefix)} "
                           f"one /{self.step} apart run past the end of the address space")
        last_sid = self.sid + (self.count - 1) * inc
        if last_sid > ALL:
            raise MrcError(f"{self.count} SIDs from {bulk.addr_text(self.sid)} one /{self.step} apart "
                           f"run past the end of the address space")
        bulk.check_sid(last_sid, bulk.addr_text(last_sid))

    @property
    def inc(self) -> int:
        return 1 << (128 - self.step)

    def dict(self) -> dict:
        out = {"template": self.template, "prefix": bulk.prefix_text(self.length, self.prefix),
               "sid": bulk.addr_text(self.sid)}
        if self.count != 1:
            out["count"] = self.count
        if self.step != self.length:
            out["step"] = self.step
        return out

    @classmethod
    def of(cls, d: dict) -> "Block":
        length, value = prefix_value(d["prefix"])
        return cls(d["template"], length, value, sid_value(d["sid"]), d.get("count", 1), d.get("step", 0))


def expand(blocks: list[Block]) -> list[tuple[str, int, int, int, int | None]]:
    """(template, prefix length, prefix, SID, line) of every peer."""
    out = []
    for b in blocks:
        inc = b.inc
        out += [(b.template, b.length, b.prefix + i * inc, b.sid + i * inc, b.line) for i in range(b.count)]
    return out


def compress(peers: list[tuple[str, int, int, int]]) -> list[Block]:
    """Maximal runs of PEERS (template, length, prefix, SID), sorted first,
    whose prefixes and SIDs step alike by a power of two no finer than
    the prefix."""
    peers = sorted(peers, key=lambda p: (p[0], p[1], p[2]))
    out = []
    i, n = 0, len(peers)
    while i < n:
        t, length, p, s = peers[i][:4]
        j = i
        step = length
        if i + 1 < n:
            t2, l2, p2, s2 = peers[i + 1][:4]
            d = p2 - p
            if (t2, l2) == (t, length) and d > 0 and d == s2 - s and d & (d - 1) == 0 \
                    and 128 - (d.bit_length() - 1) <= length:
                step = 128 - (d.bit_length() - 1)
                j = i + 1
                while j + 1 < n and peers[j + 1][0] == t and peers[j + 1][1] == length and \
                        peers[j + 1][2] - peers[j][2] == d and peers[j + 1][3] - peers[j][3] == d:
                    j += 1
        out.append(Block(t, length, p, s, j - i + 1, step))
        i = j + 1
    return out


def canonical(blocks: list[Block], own: set[str], lines: dict) -> list[dict]:
    """Check BLOCKS as a whole and give their canonical form (a list of dicts)."""
    peers = expand(blocks)
    if len(peers) > MAX_PEERS:
        raise BlockError(blocks[-1].line, f"{len(peers)} peers in peer_blocks: the peers map holds {MAX_PEERS}")
    keys = {}
    for t, length, p, s, line in peers:
        k = (length, p)
        if k in keys:
            raise BlockError(line, f"peer {bulk.prefix_text(length, p)} is in two blocks "
                                   f"(first at line {keys[k]})")
        keys[k] = line
    sids = {}
    for t, length, p, s, line in peers:
        if s in sids:
            raise BlockError(line, f"SID {bulk.addr_text(s)} is in two blocks (first at line {sids[s]})")
        sids[s] = line
    for text in own:
        try:
            k = bulk.prefix_int(text)
        except MrcError:
            continue
        if k in keys:
            raise BlockError(keys[k], f"peer {text} is in peers: with paths of its own and in a block")
    if blocks:
        lines[("peer_blocks",)] = blocks[0].line
    return [b.dict() for b in compress(peers)]


def wanted(block_dicts: list[dict]) -> list[tuple[bytes, bytes, str]]:
    """(peers map key, SID bytes, template name) of every peer of canonical blocks."""
    key = bulk.KEY.pack
    out = []
    for d in block_dicts:
        b = Block.of(d)
        inc, length, t = b.inc, b.length, b.template
        out += [(key(length, (b.prefix + i * inc).to_bytes(16, "big")), (b.sid + i * inc).to_bytes(16, "big"), t)
                for i in range(b.count)]
    return out


def running(att, names: dict[int, str]) -> list[dict]:
    """The attachment's template peers as canonical blocks (NAMES: row ->
    template name)."""
    peers = []
    for k, t in bulk.Peers(att).templated().items():
        length, addr = bulk.KEY.unpack(k)
        peers.append((names.get(t[4], f"row{t[4]}"), length, int.from_bytes(addr, "big"),
                      int.from_bytes(t[5], "big")))
    return [b.dict() for b in compress(peers)]
