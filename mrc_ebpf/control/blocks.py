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


def _step_of(d: int, length: int) -> int | None:
    """The step (bit length) of a delta D between neighbours, if it is one."""
    if d > 0 and d & (d - 1) == 0 and 128 - (d.bit_length() - 1) <= length:
        return 128 - (d.bit_length() - 1)
    return None


def compress(peers: list[tuple[str, int, int, int]]) -> list[Block]:
    """Maximal runs of PEERS (template, length, prefix, SID), sorted first,
    whose prefixes and SIDs step alike by a power of two no finer than
    the prefix: at each peer not yet in a run, the step to the next peer
    starts a run that goes on while the steps stay the same."""
    peers = sorted(peers)
    out = []
    i, n = 0, len(peers)
    while i < n:
        t, length, p, s = peers[i]
        if i + 1 < n:
            t2, l2, p2, s2 = peers[i + 1]
            d = p2 - p
            step = _step_of(d, length) if (t2, l2) == (t, length) and d == s2 - s else None
            if step:
                j = i + 1
                while j + 1 < n:
                    nt, nl, np_, ns = peers[j + 1]
                    if nl != length or nt != t or np_ - peers[j][2] != d or ns - peers[j][3] != d:
                        break
                    j += 1
                out.append(Block(t, length, p, s, j - i + 1, step))
                i = j + 1
                continue
        out.append(Block(t, length, p, s, 1, length))
        i += 1
    return out


def compress_blocks(blocks: list[Block]) -> list[Block]:
    """compress() of the peers of BLOCKS, sorted and not interleaved (each
    block's peers lie between its neighbours'), without listing the peers:
    the same decisions, a whole block's run at a time."""
    blocks = sorted(blocks, key=lambda b: (b.template, b.length, b.prefix))
    n = len(blocks)

    def at(k, i):
        b = blocks[k]
        return b.template, b.length, b.prefix + i * b.inc, b.sid + i * b.inc

    def nxt(k, i):
        return (k, i + 1) if i + 1 < blocks[k].count else (k + 1, 0)

    out = []
    k, i = 0, 0
    while k < n:
        t, length, p, s = at(k, i)
        k2, i2 = nxt(k, i)
        step = None
        if k2 < n:
            t2, l2, p2, s2 = at(k2, i2)
            d = p2 - p
            step = _step_of(d, length) if (t2, l2) == (t, length) and d == s2 - s else None
        if not step:
            out.append(Block(t, length, p, s, 1, length))
            k, i = k2, i2
            continue
        count, ck, ci = 2, k2, i2
        while True:
            b = blocks[ck]
            if ci + 1 < b.count:                 # inside a block: its own step
                if b.inc != d:
                    break
                count += b.count - 1 - ci
                ci = b.count - 1
                continue
            if ck + 1 >= n:
                break
            _, _, pc, sc = at(ck, ci)
            t3, l3, p3, s3 = at(ck + 1, 0)
            if (t3, l3) != (t, length) or p3 - pc != d or s3 - sc != d:
                break
            ck, ci, count = ck + 1, 0, count + 1
        out.append(Block(t, length, p, s, count, step))
        k, i = nxt(ck, ci)
    return out


def _apart(blocks: list[Block], first, last) -> bool:
    """No two BLOCKS share a value: sorted by FIRST, each ends (LAST) before
    the next begins (a block's values rise)."""
    ordered = sorted(blocks, key=first)
    return all(last(a) < first(b) for a, b in zip(ordered, ordered[1:]))


def canonical(blocks: list[Block], own: set[str], lines: dict) -> list[dict]:
    """Check BLOCKS as a whole and give their canonical form (a list of dicts)."""
    total = sum(b.count for b in blocks)
    if total > MAX_PEERS:
        raise BlockError(blocks[-1].line, f"{total} peers in peer_blocks: the peers map holds {MAX_PEERS}")
    if blocks:
        lines[("peer_blocks",)] = blocks[0].line
    # blocks that do not overlap (the usual: one per leaf) are checked and
    # compressed as blocks; others peer by peer, to name the peer given twice
    disjoint = all(_apart([b for b in blocks if b.length == length], lambda b: b.prefix,
                          lambda b: b.prefix + (b.count - 1) * b.inc) for length in {b.length for b in blocks}) \
        and _apart(blocks, lambda b: b.sid, lambda b: b.sid + (b.count - 1) * b.inc)
    if disjoint:
        for text in own:
            try:
                length, p = bulk.prefix_int(text)
            except MrcError:
                continue
            for b in blocks:
                if b.length == length and p >= b.prefix and (p - b.prefix) % b.inc == 0 and \
                        (p - b.prefix) // b.inc < b.count:
                    raise BlockError(b.line, f"peer {text} is in peers: with paths of its own and in a block")
        return [b.dict() for b in compress_blocks(blocks)]
    peers = expand(blocks)
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
    return [b.dict() for b in compress([p[:4] for p in peers])]


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
