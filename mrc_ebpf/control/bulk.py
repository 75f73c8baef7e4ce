"""Many template peers at once: `path bulk` and a config's peer blocks.

A template's peer is one LPM entry (prefix -> template row, its SID) and
one peer_by_sid entry (SID -> peer id).  131,071 of them one at a time
cost ~85 us each in Python (ipaddress objects, the journal's lookup of
every key before its write, three bpf(2) calls).  Here they are packed
bytes built with integer arithmetic, compared with the maps' contents read
in a few BPF_MAP_LOOKUP_BATCH calls, and written with BPF_MAP_UPDATE_BATCH
(hash maps since Linux 5.6, LPM tries since 5.13; PinnedMap falls back
per element where a kernel has none).  Only what differs is written.

All or nothing stays: before writing, an undo step per map goes on the
attachment's journal (logged to disk first: journal.py) that deletes the
keys that were new and writes back the old values of the keys that were
changed or removed (in batches again).  MRC_FAIL_WRITE counts every element of a batch as a write, and a
failure injected at the Nth writes the N-1 before it for real, so a test
sees a genuine half-written batch rolled back.
"""
from __future__ import annotations

import ctypes
import socket
import struct

from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.journal import InjectedFailure
from mrc_ebpf.datapath.source import C
from mrc_ebpf.errors import MrcError

LAST_HOP = C["MRC_PEER_F_LAST_HOP"]
MAX_PEER_PREFIXES = C["MRC_MAX_PEER_PREFIXES"]
MAX_PEERS = C["MRC_MAX_PEERS"]

# struct mrc_peer_key {u32 prefixlen; u8 addr[16]} and struct mrc_peer
# {u32 peer_id; u16 n_paths; u8 policy; u8 flags; u32 template_id; sid}
# in host order, as layout's ctypes twins (checked against the C) lay them out
KEY = struct.Struct("=I16s")
PEER = struct.Struct("=IHBBI16s")
assert KEY.size == ctypes.sizeof(layout.PeerKey) and PEER.size == ctypes.sizeof(layout.Peer)
assert layout.Peer.template_id.offset == 8 and layout.Peer.sid.offset == 12
ID = struct.Struct("=I")
V4_MAPPED = 0xFFFF << 32
ALL = (1 << 128) - 1


# ---- parsing without ipaddress objects ------------------------------------------

def prefix_int(text: str) -> tuple[int, int]:
    """(prefix length in the trie, address as an int, host bits cleared)
    of an IPv6 or IPv4 prefix (IPv4 as IPv4-mapped IPv6, as paths.peer_key)."""
    addr, slash, plen = text.strip().partition("/")
    try:
        if ":" in addr:
            value = int.from_bytes(socket.inet_pton(socket.AF_INET6, addr), "big")
            length = int(plen) if slash else 128
            if not 0 <= length <= 128:
                raise ValueError
        else:
            value = V4_MAPPED | int.from_bytes(socket.inet_pton(socket.AF_INET, addr), "big")
            length = (int(plen) if slash else 32)
            if not 0 <= length <= 32:
                raise ValueError
            length += 96
    except (OSError, ValueError):
        raise MrcError(f"bad prefix {text!r}: expected e.g. fd00:2::/64 or 198.18.2.0/24")
    return length, value & (ALL ^ (ALL >> length))


def sid_int(text: str) -> int:
    try:
        value = int.from_bytes(socket.inet_pton(socket.AF_INET6, text.strip()), "big")
    except OSError:
        raise MrcError(f"bad SID {text!r}: expected the peer's SID, an IPv6 address")
    check_sid(value, text)
    return value


def check_sid(value: int, text) -> None:
    top = value >> 112
    if value <= 1 or top >> 8 == 0xFF or top & 0xFFC0 == 0xFE80:
        raise MrcError(f"bad SID {text}: must be a unicast SID")


def addr_text(value) -> str:
    """An int or 16 bytes as IPv6 text."""
    raw = value if isinstance(value, bytes) else value.to_bytes(16, "big")
    return socket.inet_ntop(socket.AF_INET6, raw)


def prefix_text(length: int, value: int) -> str:
    if length >= 96 and value >> 32 == 0xFFFF:
        return f"{socket.inet_ntop(socket.AF_INET, (value & 0xFFFFFFFF).to_bytes(4, 'big'))}/{length - 96}"
    return f"{addr_text(value)}/{length}"


# ---- what the maps hold ----------------------------------------------------------

class Peers:
    """The peers and peer_by_sid maps' contents, read in batches:
    key bytes -> value bytes, SID bytes -> peer id."""

    def __init__(self, att):
        self.keys, self.values, n = att.maps["peers"].dump()
        ks, vs = KEY.size, PEER.size
        self.peers = {self.keys[i * ks:(i + 1) * ks]: self.values[i * vs:(i + 1) * vs] for i in range(n)}
        self._sid_map = att.maps["peer_by_sid"]
        self._sids = None

    @property
    def sids(self) -> dict[bytes, int]:
        if self._sids is None:
            keys, values, n = self._sid_map.dump()
            self._sids = {keys[i * 16:(i + 1) * 16]: v[0] for i, v in enumerate(ID.iter_unpack(values))}
        return self._sids

    def templated(self) -> dict[bytes, tuple]:
        """key -> (peer_id, n_paths, policy, flags, template_id, sid) of template peers."""
        return {k: t for k, t in zip(self.peers, PEER.iter_unpack(self.values)) if t[3] & LAST_HOP}

    def next_id(self) -> int:
        top = MAX_PEERS - 1
        for peer_id, _, _, flags, _, _ in PEER.iter_unpack(self.values):
            if flags & LAST_HOP and peer_id > top:
                top = peer_id
        return top + 1


def own_peers(att) -> list[tuple[layout.PeerKey, layout.Peer]]:
    """The peers with rows of their own (not a template's), read in batches."""
    out = []
    for k, v in Peers(att).peers.items():
        if not PEER.unpack(v)[3] & LAST_HOP:
            out.append((layout.PeerKey.from_buffer_copy(k), layout.Peer.from_buffer_copy(v)))
    return out


# ---- the write ---------------------------------------------------------------------

def sync(att, wanted: list[tuple[bytes, bytes, layout.Peer]], remove_missing: bool = False,
         name=None) -> dict:
    """Make the template peers WANTED ((key bytes, SID bytes, template) each)
    be in the maps: new ones added, changed ones (template, its path count
    or policy, SID) rewritten keeping their peer id, equal ones left
    alone; with REMOVE_MISSING every other template peer is removed.  All
    or nothing (the attachment's journal).  NAME(key bytes) gives a
    prefix's text for messages.  Returns the counts and the keys written."""
    name = name or (lambda k: prefix_text(*KEY.unpack(k)))
    have = Peers(att)
    if len(wanted) > MAX_PEER_PREFIXES:
        raise MrcError(f"{len(wanted)} peers: the peers map holds {MAX_PEER_PREFIXES} prefixes")
    keys = [w[0] for w in wanted]
    if len(set(keys)) != len(keys):
        seen = set()
        dup = next(k for k in keys if k in seen or seen.add(k))
        raise MrcError(f"{name(dup)} is given twice")
    sids = [w[1] for w in wanted]
    if len(set(sids)) != len(sids):
        seen = set()
        dup = next(s for s in sids if s in seen or seen.add(s))
        raise MrcError(f"SID {addr_text(dup)} is given twice")

    templated = have.templated()
    keyset = set(keys)
    removed = [k for k in templated if k not in keyset] if remove_missing else []
    gone_ids = {templated[k][0] for k in removed}
    next_id = have.next_id()
    new_peers, changed, unchanged = [], [], 0      # (key, value bytes)
    new_sids, old_sids = [], []                     # sids to write / to delete
    pack = PEER.pack
    if not have.peers and not have.sids:
        return _fresh(att, wanted, keys, sids, next_id)
    peers_get, sids_get = have.peers.get, have.sids.get
    for key, sid, tpl in wanted:
        old = peers_get(key)
        if old is not None:
            peer_id, n_paths, policy, flags, template_id, old_sid = PEER.unpack(old)
            if not flags & LAST_HOP:
                raise MrcError(f"{name(key)} has paths of its own: `mrcctl path del {name(key)}` first")
            if (n_paths, policy, template_id, old_sid) == (tpl.n_paths, tpl.policy, tpl.template_id, sid):
                unchanged += 1
                continue
        else:
            peer_id = None
        owner = sids_get(sid)
        if owner is not None and owner != peer_id and owner not in gone_ids:
            raise MrcError(f"{name(key)}: SID {addr_text(sid)} is another peer's already")
        if peer_id is None:
            peer_id, next_id = next_id, next_id + 1
            new_peers.append((key, pack(peer_id, tpl.n_paths, tpl.policy, LAST_HOP, tpl.template_id, sid)))
            new_sids.append((sid, peer_id))
        else:
            changed.append((key, pack(peer_id, tpl.n_paths, tpl.policy, LAST_HOP, tpl.template_id, sid)))
            if old_sid != sid:
                old_sids.append(old_sid)
                new_sids.append((sid, peer_id))
    if len(have.peers) - len(removed) + len(new_peers) > MAX_PEER_PREFIXES:
        raise MrcError(f"the peers map holds {MAX_PEER_PREFIXES} prefixes; {len(have.peers) - len(removed)} "
                       f"+ {len(new_peers)} would not fit")
    removed_sids = [templated[k][5] for k in removed]
    if not (new_peers or changed or removed):
        return {"added": 0, "updated": 0, "removed": 0, "unchanged": unchanged, "written": []}

    peers_map, sid_map, state_map = att.maps["peers"], att.maps["peer_by_sid"], att.maps["peer_state"]
    # learnt state of the peers changed or removed (their template or SID
    # changed: their per-path state means other paths now), kept for undo
    forget_ids = {PEER.unpack(v)[0] for _, v in changed} | gone_ids
    saved_state = []
    if forget_ids:
        skeys, svalues, n = state_map.dump(chunk=64)
        ss = ctypes.sizeof(layout.PeerState)
        for i in range(n):
            k = skeys[i * 4:(i + 1) * 4]
            if ID.unpack(k)[0] in forget_ids:
                saved_state.append((k, svalues[i * ss:(i + 1) * ss]))

    have_sids = have.sids
    undo_peers_new = b"".join(k for k, _ in new_peers)
    undo_peers_old = [(k, have.peers[k]) for k, _ in changed] + [(k, have.peers[k]) for k in removed]
    sid_old_entries = [(s, have_sids[s]) for s in old_sids + removed_sids if s in have_sids]
    written_sids = {s for s, _ in new_sids}
    undo_sids_new = b"".join(s for s in written_sids if s not in have_sids)
    undo_sids_old = [(s, ID.pack(have_sids[s])) for s in written_sids if s in have_sids] + \
        [(s, ID.pack(i)) for s, i in sid_old_entries if s not in written_sids]

    journal = att.journal
    if journal is not None:     # logged (journal.py) before the first write
        journal.record_map(peers_map.path, undo_peers_new, *_packed(undo_peers_old))
        journal.record_map(sid_map.path, undo_sids_new, *_packed(undo_sids_old))
        journal.record_map(state_map.path, b"", *_packed(saved_state))
    # removed peers leave the trie before their SID stops being filed; new
    # SIDs are filed before their peers can send (so feedback finds them)
    step = _Step(journal)
    step.delete(peers_map, b"".join(removed), len(removed), "delete peers")
    dead_sids = [s for s in old_sids + removed_sids if s not in written_sids]
    step.delete(sid_map, b"".join(dead_sids), len(dead_sids), "delete peer_by_sid")
    step.delete(state_map, b"".join(k for k, _ in saved_state), len(saved_state), "delete peer_state")
    step.update(sid_map, [(s, ID.pack(i)) for s, i in new_sids], "update peer_by_sid")
    step.update(peers_map, new_peers + changed, "update peers")
    return {"added": len(new_peers), "updated": len(changed), "removed": len(removed), "unchanged": unchanged,
            "written": [k for k, _ in new_peers + changed]}


def _fresh(att, wanted, keys: list[bytes], sids: list[bytes], first_id: int) -> dict:
    """sync() into maps with no peers yet (a host's first apply): every
    peer new, written from packed bytes, undone by deleting them all."""
    n = len(wanted)
    pack = PEER.pack
    key_blob, sid_blob = b"".join(keys), b"".join(sids)
    values = b"".join([pack(first_id + i, t.n_paths, t.policy, LAST_HOP, t.template_id, sid)
                       for i, (_, sid, t) in enumerate(wanted)])
    ids = struct.pack(f"={n}I", *range(first_id, first_id + n))
    peers_map, sid_map = att.maps["peers"], att.maps["peer_by_sid"]
    journal = att.journal
    if journal is not None:     # logged (journal.py) before the first write
        journal.record_map(peers_map.path, key_blob)
        journal.record_map(sid_map.path, sid_blob)
    step = _Step(journal)
    step.update_raw(sid_map, sid_blob, ids, n, "update peer_by_sid")
    step.update_raw(peers_map, key_blob, values, n, "update peers")
    return {"added": n, "updated": 0, "removed": 0, "unchanged": 0, "written": keys}


def _packed(items: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """(keys, values) of ITEMS, each packed one after the other."""
    return b"".join(k for k, _ in items), b"".join(v for _, v in items)


def _write(m, items: list[tuple[bytes, bytes]]) -> None:
    if items:
        m.update_batch(b"".join(k for k, _ in items), b"".join(v for _, v in items), len(items))


class _Step:
    """Batch writes that count against MRC_FAIL_WRITE element by element."""

    def __init__(self, journal):
        self.journal = journal

    def _fail_at(self, count: int, what: str) -> int | None:
        at = self.journal.reserve(count, what) if self.journal is not None else None
        # the write that fails, named before the ones before it are made
        # (writing the peers bumps peers_gen, itself a counted write)
        self.failing = self.journal.writes if at is not None else 0
        return at

    def update(self, m, items: list[tuple[bytes, bytes]], what: str) -> None:
        at = self._fail_at(len(items), what)
        if at is not None:
            _write(m, items[:at])
            raise InjectedFailure(f"failure injected at write {self.failing} ({what}, "
                                  f"element {at + 1} of {len(items)}) by MRC_FAIL_WRITE")
        _write(m, items)

    def update_raw(self, m, keys: bytes, values: bytes, count: int, what: str) -> None:
        at = self._fail_at(count, what)
        if at is not None:
            ks, vs = len(keys) // count, len(values) // count
            m.update_batch(keys[:at * ks], values[:at * vs], at)
            raise InjectedFailure(f"failure injected at write {self.failing} ({what}, "
                                  f"element {at + 1} of {count}) by MRC_FAIL_WRITE")
        m.update_batch(keys, values, count)

    def delete(self, m, keys: bytes, count: int, what: str) -> None:
        at = self._fail_at(count, what)
        size = len(keys) // count if count else 0
        if at is not None:
            m.delete_batch(keys[:at * size], at)
            raise InjectedFailure(f"failure injected at write {self.failing} ({what}, "
                                  f"element {at + 1} of {count}) by MRC_FAIL_WRITE")
        m.delete_batch(keys, count)


def refresh(att, tpl: layout.Peer) -> int:
    """The template's peers carry its path count and policy: rewrite those
    that differ (after a template's paths or policy changed)."""
    have = Peers(att)
    items = []
    for k, (peer_id, n_paths, policy, flags, template_id, sid) in have.templated().items():
        if template_id == tpl.template_id and (n_paths, policy) != (tpl.n_paths, tpl.policy):
            items.append((k, PEER.pack(peer_id, tpl.n_paths, tpl.policy, flags, template_id, sid),
                          have.peers[k]))
    if items and att.journal is not None:
        att.journal.record_map(att.maps["peers"].path, b"", *_packed([(k, v) for k, _, v in items]))
    _Step(att.journal).update(att.maps["peers"], [(k, v) for k, v, _ in items], "update peers")
    return len(items)
