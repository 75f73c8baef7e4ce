"""Per-packet cost (BPF_PROG_TEST_RUN) and throughput over one veth pair.

    mrcctl bench cost [--short]          (the scenario)
    python -m mrc_ebpf.bench.cost [--runs N] [-j]   (the test-run part alone)
    python -m mrc_ebpf.bench.cost --key-cost 60 [-j]   (what a key costs alone)

Part 1, per-packet cost by BPF_PROG_TEST_RUN:
Loads the datapath without attaching it, gives one peer 1, 16 and 256
paths, and times mrc_tx on an IPv6/UDP packet for that peer and mrc_rx on
what mrc_tx produced.  Each test run is a single run (repeat=1): both
programs change the packet, so repeating on the kernel's copy would time
the pass-through path from the second run on.  The kernel times each run;
the table shows percentiles over N runs.  Numbers are for comparing
with each other on one machine, not absolute.  What a key costs
(authenticated TLVs, lib/auth.h) is measured apart, paired batch by batch
with the same packets unkeyed (measure_key_cost): only a ratio taken
within milliseconds survives a shared machine's load.

Part 2, throughput: two namespaces joined by one veth pair (pfifo on both
ends, so a full XDP ring pushes back rather than drops).  iperf3 floods
64-byte UDP datagrams (-b 0, one sender thread) from A to B; the rate is
counted at B's interface (rx packets over the middle of the run, leaving
out start and end) for three set-ups doing the same job:
  none    plain IPv6 routing, no program;
  mrc     mrcctl attach on both ends, one path (A's TC egress encapsulates,
          B's XDP validates and decapsulates);
  mrc-key the same attachment with a shared key on both ends (`mrcctl key
          use`): every TLV signed by TX and verified by RX; it alternates
          with mrc run by run (the key set and cleared in place);
  kernel  the kernel's own `encap seg6 mode encap` route on A and
          `End.DT6` on B.
Ratios are against `none` in the same repetition.  The sender is one
iperf3 thread, so the figure is the sender-side cost per packet as much
as the receiver's.

The scenario's measurement (measure_all -> Measured: the test runs'
rows, the key's batches, every Flood's counts) is kept apart from its
analysis (flood_result, summarize), a pure function of it.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import ipaddress
import json
import statistics
import time

from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from mrc_ebpf.datapath import bpfsys, layout
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.loader import compile_datapath
from mrc_ebpf.control.paths import MAX_CLASSES, POLICIES, flowlabel, peer_key

SID, PEER_SID = "fc00:a::1", "fc00:b::1"


def _configure(module, n_paths: int, policy: str) -> None:
    cfg = layout.Config(mtu=1500, loss_hold_us=20000)
    ctypes.memmove(cfg.sid, ipaddress.IPv6Address(SID).packed, 16)
    module["mrc_config"][ctypes.c_int(0)] = module["mrc_config"].Leaf.from_buffer_copy(bytes(cfg))
    prefix = ipaddress.ip_network("fd00:b::/64")
    for i in range(n_paths):
        path = layout.Path(n_segments=2, state=layout.C["MRC_PATH_UP"], weight=1,
                           flowlabel=flowlabel(prefix, i, []))
        for j, seg in enumerate((PEER_SID, f"fc00:1:{i % 4 + 1:x}::")):   # wire order
            ctypes.memmove(path.segments[j].addr, ipaddress.IPv6Address(seg).packed, 16)
        module["mrc_paths"][ctypes.c_int(i)] = module["mrc_paths"].Leaf.from_buffer_copy(bytes(path))
    spray = layout.Spray(n=n_paths)
    spray.ids[:n_paths] = list(range(n_paths))
    for tclass in range(MAX_CLASSES):
        module["mrc_spray"][ctypes.c_int(tclass)] = module["mrc_spray"].Leaf.from_buffer_copy(bytes(spray))
    key = module["mrc_peers"].Key.from_buffer_copy(bytes(peer_key(prefix)))
    module["mrc_peers"][key] = module["mrc_peers"].Leaf.from_buffer_copy(
        bytes(layout.Peer(peer_id=0, n_paths=n_paths, policy=POLICIES[policy])))
    # its SID, as `path add` files it: what the peer sends is filed under it
    by_sid = module["mrc_peer_by_sid"]
    by_sid[by_sid.Key.from_buffer_copy(ipaddress.IPv6Address(PEER_SID).packed)] = by_sid.Leaf(0)


def _percentiles(samples: list[int]) -> dict:
    samples = sorted(samples)
    at = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return {"p10": at(0.10), "median": at(0.5), "p90": at(0.90)}


# the key of the keyed rows (a fixed one: the cost does not depend on it)
BENCH_KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f")


def measure(runs: int = 20000, policies=("rr", "bytes", "adaptive"), repeat: int = 1) -> list[list[dict]]:
    """`repeat` rounds of every (policy, paths) point without a key, one
    compile (what a key costs: measure_key_cost, paired)."""
    module, tx, rx, _ = compile_datapath()
    try:
        return [_measure_points(module, tx, rx, runs, policies) for _ in range(repeat)]
    finally:
        module.cleanup()


def _measure_points(module, tx, rx, runs, policies) -> list[dict]:
    packet = _packet()
    set_key(module, False)
    rows = []
    for policy in policies:
        for n_paths in (1, 16, 256):
            _configure(module, n_paths, policy)
            tx_ns, rx_ns = _timed_point(tx, rx, packet, runs)
            rows.append({"policy": policy, "paths": n_paths, "key": False,
                         "tx_ns": _percentiles(tx_ns), "rx_ns": _percentiles(rx_ns)})
    return rows


def _timed_point(tx, rx, packet: bytes, runs: int, peer_sid: str = PEER_SID) -> tuple[list[int], list[int]]:
    """TX on `packet` and RX on what TX made, `runs` single runs each
    (what RX times comes from `peer_sid`, the peer TX sent to)."""
    return _timed_tx(tx, packet, runs), _timed_rx(rx, _inbound(_tx_once(tx, packet), runs, False,
                                                               peer_sid=peer_sid))


def _packet() -> bytes:
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") /
                 IPv6(src="fd00:a::a", dst="fd00:b::b") / UDP(dport=9) / bytes(64))


def _tx_once(tx, packet: bytes) -> bytes:
    ret, _, out = bpfsys.prog_test_run(tx.fd, packet, 1)
    assert ret == 0 and len(out) > len(packet), "TX did not encapsulate"
    return out


def _timed_tx(tx, packet: bytes, n: int, feedback: bool = False) -> list[int]:
    ns = []
    for _ in range(n):
        ret, t, out = bpfsys.prog_test_run(tx.fd, packet, 1)
        assert ret == 0 and len(out) > len(packet), "TX did not encapsulate"
        assert not feedback or out[tlv_offset(out) + layout.MrcTlv.flags.offset] & layout.C["MRC_F_FEEDBACK"], \
            "TX sent no feedback"
        ns.append(t)
    return ns


def _timed_rx(rx, frames: list[bytes]) -> list[int]:
    ns = []
    for frame in frames:
        ret, t, _ = bpfsys.prog_test_run(rx.fd, frame, 1)
        assert ret == 2, "RX did not pass the packet up (XDP_PASS)"
        ns.append(t)
    return ns


# ------------------------------------------------------------ what a key costs, paired

# (what, paths, feedback): the rr policy; the last row's packets carry
# feedback, as most do once two hosts talk both ways (the MAC then covers
# the feedback words too: lib/auth.h)
KEY_COST_POINTS = (("data", 1, False), ("data", 16, False), ("data", 256, False), ("feedback", 1, True))


def _iqm(ns: list[int]) -> float:
    """The mean of the middle half: the test run's clock ticks in 10 ns on
    some machines, and a median snaps to the tick."""
    ns = sorted(ns)
    return statistics.mean(ns[len(ns) // 4:3 * len(ns) // 4])


def measure_key_cost(batches: int = 20, per: int = 200) -> list[dict]:
    """The per-packet cost of a key, paired: one compile, no key and key
    alternating in batches of `per` packets (the order flipping every
    batch), so both sides of a ratio ran within milliseconds of each
    other: on a shared machine the load moves the cost by more between
    seconds than a key does, and these machines' CPUs also switch between
    two speeds ~1.4x apart for seconds at a time.  Programs that do nothing
    (XDP_PASS, TC_ACT_OK) run in the same batches: the floor under every
    row (the syscall and the timer).  One row per (point, key, batch),
    each side the batch's interquartile mean; key_cost_ratios sums up."""
    from bcc import BPF
    from mrc_ebpf.datapath import source
    module, tx, rx, _ = compile_datapath()
    empty = BPF(text=b"int tx(struct __sk_buff *s) { return 0; } "
                     b"int rx(struct xdp_md *x) { return XDP_PASS; }")
    try:
        etx, erx = empty.load_func("tx", BPF.SCHED_CLS), empty.load_func("rx", BPF.XDP)
        names = source.counter_names()

        def counted(*which) -> int:
            return sum(sum(module["mrc_counters"][ctypes.c_int(names.index(n))]) for n in which)
        refused = [n for n in names if n.startswith("rx_auth_")]
        packet, rows = _packet(), []
        for what, n_paths, feedback in KEY_COST_POINTS:
            _configure(module, n_paths, "rr")
            filed = counted("rx_mrc_tlv", "rx_feedback")
            if feedback:    # the path's peer sends RX's packets, so TX reports to it
                path = layout.Path.from_buffer_copy(bytes(module["mrc_paths"][ctypes.c_int(0)]))
                ctypes.memmove(path.peer_sid.addr, ipaddress.IPv6Address(PEER_SID).packed, 16)
                module["mrc_paths"][ctypes.c_int(0)] = module["mrc_paths"].Leaf.from_buffer_copy(bytes(path))
            frames = {}
            for keyed in (False, True):
                set_key(module, keyed)
                frames[keyed] = _inbound(_tx_once(tx, packet), batches * per, keyed, feedback)
            for b in range(batches):
                for keyed in ((False, True) if b % 2 == 0 else (True, False)):
                    set_key(module, keyed)
                    batch = frames[keyed][b * per:(b + 1) * per]
                    if feedback:
                        # the peer acknowledges TX's path first, as a live
                        # one does: unacknowledged the path goes down and
                        # every packet is a probe, not the cost of feedback
                        probes = counted("tx_probe")
                        bpfsys.prog_test_run(rx.fd, _acked(batch[0], keyed), 1)
                        t = _timed_tx(tx, packet, per, feedback=True)
                        r = _timed_rx(rx, batch[1:])
                        assert counted("tx_probe") == probes, \
                            "TX's path went down: the feedback row would time its probes"
                    else:
                        t, r = _timed_tx(tx, packet, per), _timed_rx(rx, batch)
                    floor_tx = [bpfsys.prog_test_run(etx.fd, packet, 1)[1] for _ in range(max(1, per // 4))]
                    floor_rx = [bpfsys.prog_test_run(erx.fd, batch[0], 1)[1] for _ in range(max(1, per // 4))]
                    rows.append({"what": what, "paths": n_paths, "key": keyed, "batch": b,
                                 "tx": _iqm(t), "rx": _iqm(r), "floor_tx": _iqm(floor_tx),
                                 "floor_rx": _iqm(floor_rx)})
            # what was timed is what a peer's packets cost: every TLV
            # filed (and its feedback), none refused
            assert counted(*refused) == 0, "RX refused a TLV: the keyed rows would time a refusal"
            assert counted("rx_mrc_tlv", "rx_feedback") - filed == \
                2 * batches * per * (2 if feedback else 1), "RX did not file every TLV"
        return rows
    finally:
        empty.cleanup()
        module.cleanup()


def key_cost_ratios(rows: list[dict]) -> list[dict]:
    """Per point: key / no key, the median over batch pairs (a batch with
    a key over the no-key batch next to it); +ns likewise; "own" with the
    floor taken out of both sides (the programs alone)."""
    out = []
    for what, n_paths, _ in KEY_COST_POINTS:
        plain = [r for r in rows if (r["what"], r["paths"], r["key"]) == (what, n_paths, False)]
        keyed = [r for r in rows if (r["what"], r["paths"], r["key"]) == (what, n_paths, True)]
        if not plain:
            continue
        row = {"what": what, "paths": n_paths, "pairs": len(plain)}
        for side in ("tx", "rx"):
            pairs = list(zip(plain, keyed))
            row[f"{side}_ns"] = statistics.median(a[side] for a in plain)
            row[f"{side}_ns_key"] = statistics.median(b[side] for b in keyed)
            row[f"{side}_key_over_no_key"] = statistics.median(b[side] / a[side] for a, b in pairs)
            row[f"{side}_plus_ns"] = statistics.median(b[side] - a[side] for a, b in pairs)
            row[f"{side}_own_key_over_no_key"] = statistics.median(
                (b[side] - b[f"floor_{side}"]) / (a[side] - a[f"floor_{side}"]) for a, b in pairs)
        out.append(row)
    return out


def set_key(module, keyed: bool) -> None:
    from mrc_ebpf.datapath import auth
    value = auth.initial(BENCH_KEY if keyed else None)
    module["mrc_auth"][ctypes.c_int(0)] = module["mrc_auth"].Leaf.from_buffer_copy(bytes(value))
    module["mrc_rx_paths"].clear()
    module["mrc_rx_peers"].clear()


def tlv_offset(frame) -> int:
    """Where an SRH frame's TLV begins (after Ethernet, IPv6, the SRH's segments)."""
    return 14 + 40 + 8 + 16 * (frame[14 + 40 + 4] + 1)


def _sign(frame: bytearray) -> None:
    """The MAC a peer holding BENCH_KEY would put on this frame's TLV."""
    from mrc_ebpf.datapath import auth
    at = tlv_offset(frame)
    mac_at = at + layout.C["MRC_TLV_MAC_OFF"]
    frame[mac_at:mac_at + 8] = auth.tlv_mac(BENCH_KEY, PEER_SID, SID, bytes(frame[at:at + layout.C["MRC_TLV_SIZE"]]))


def _inbound(out: bytes, runs: int, keyed: bool, feedback: bool = False,
             peer_sid: str = PEER_SID) -> list[bytes]:
    """What the peer would send us, as RX sees it: our SID as destination,
    and a new path_seq each run (a repeated one would be a late packet, and
    with a key a replay, not filed: cheaper than the real thing), signed
    when keyed; with `feedback`, saying it carries feedback (its fb_*
    words as TX wrote them)."""
    inbound = bytearray(out)
    inbound[14 + 8:14 + 24] = ipaddress.IPv6Address(peer_sid).packed
    inbound[14 + 24:14 + 40] = ipaddress.IPv6Address(SID).packed
    inbound[14 + 40 + 3] = 0                  # segments left: we are the last
    inbound[14 + 48:14 + 64] = ipaddress.IPv6Address(SID).packed
    tlv_at = tlv_offset(inbound)
    assert inbound[tlv_at] == layout.C["MRC_TLV_TYPE"]
    if feedback:
        inbound[tlv_at + layout.MrcTlv.flags.offset] |= layout.C["MRC_F_FEEDBACK"]
    seq_at = tlv_at + layout.MrcTlv.path_seq.offset
    frames = []
    for i in range(runs):
        inbound[seq_at:seq_at + 4] = (i + 1).to_bytes(4, "big")
        if keyed:
            _sign(inbound)
        frames.append(bytes(inbound))
    return frames


def _acked(frame: bytes, keyed: bool) -> bytes:
    """The frame acknowledging, in its feedback, what TX sent on its path
    up to now (bpf_ktime_get_ns is CLOCK_MONOTONIC)."""
    f = bytearray(frame)
    at = tlv_offset(f) + layout.MrcTlv.fb_path_tx32.offset
    f[at:at + 4] = (time.monotonic_ns() & 0xffffffff).to_bytes(4, "big")
    if keyed:
        _sign(f)
    return bytes(f)


# ------------------------------------------------------------ peers in the maps (scale)

PEER_PREFIX = "fd00:b::/64"     # the measured peer outside the address plan
PEERS_AT = (1, 1000, 100000, 131072)     # the last: the 131,072-NIC fabric's memory
# the measured peer inside the address plan: host 1 of leaf 0, among the
# others (the trie's walk to it grows with them; to PEER_PREFIX it does not)
INSIDE = 1


def clear_maps(module, names) -> None:
    """Empty the maps: read in batches and deleted in batches (bcc's
    clear() is two syscalls an entry: minutes for 131,071 peers)."""
    for name in names:
        key_t, value_t, percpu = layout.MAPS[name]
        m = bpfsys.PinnedMap.from_fd(module[layout.symbol(name)].map_fd, key_t, value_t, percpu, name)
        try:
            keys, _, n = m.dump()
            if n:
                m.delete_batch(keys, n)
        finally:
            m.close()


def plan_peer(i: int) -> tuple[str, str]:
    """Peer i of the fabric's address plan (leaf, host): prefix and SID."""
    return f"fd00:1:{i // 256:x}:{i % 256:x}::/64", f"fc00:1:{i // 256:x}:{i % 256:x}::1"


def fill_peers(module, n: int, n_paths: int, policy: str, active: int, inside: bool = False) -> tuple[str, str]:
    """n peers in the maps, all on one template of n_paths paths (row 0),
    the measured one among them: PEER_PREFIX (outside the plan) and plan
    peers 1..n-1, or (`inside`) plan peers INSIDE..INSIDE+n-1; `active`
    of them with learnt state, as after a packet to each.  Written in
    batches (BPF_MAP_UPDATE_BATCH).  Returns the measured peer's
    destination address and SID."""
    import struct
    clear_maps(module, ("peers", "peer_by_sid", "peer_state", "rx_paths", "rx_peers", "peer_cache"))
    _configure(module, n_paths, policy)          # row 0: the paths
    clear_maps(module, ("peers", "peer_cache"))          # ... and no own-path peer
    base = layout.C["MRC_MAX_PEERS"]
    plan = [plan_peer(i) for i in (range(INSIDE, INSIDE + n) if inside else range(1, n))]
    if not inside:
        plan.insert(0, (PEER_PREFIX, PEER_SID))
    peer = struct.Struct("=IHBBI16s")
    keys, values, sids, ids = [], [], [], []
    for k, (prefix, sid) in enumerate(plan):
        sid_b = ipaddress.IPv6Address(sid).packed
        keys.append(bytes(peer_key(ipaddress.ip_network(prefix))))
        values.append(peer.pack(base + k, n_paths, POLICIES[policy], layout.C["MRC_PEER_F_LAST_HOP"], 0, sid_b))
        sids.append(sid_b)
        ids.append((base + k).to_bytes(4, "little"))
    for name, ks, vs in (("peers", keys, values), ("peer_by_sid", sids, ids)):
        key_t, value_t, _ = layout.MAPS[name]
        m = bpfsys.PinnedMap.from_fd(module[layout.symbol(name)].map_fd, key_t, value_t, name=name)
        try:
            for at in range(0, len(ks), 65536):
                m.update_batch(b"".join(ks[at:at + 65536]), b"".join(vs[at:at + 65536]),
                               len(ks[at:at + 65536]))
        finally:
            m.close()
    zero = layout.PeerState()
    for k in range(1, min(active, n)):
        module["mrc_peer_state"][ctypes.c_uint32(base + k)] = \
            module["mrc_peer_state"].Leaf.from_buffer_copy(bytes(zero))
    prefix, sid = plan[0]
    return str(ipaddress.ip_network(prefix).network_address + 9), sid


def maps_memlock(module) -> dict[str, int]:
    """name -> memlock the kernel reports for each of the module's maps."""
    from mrc_ebpf.datapath import memory
    out = {}
    for spec in memory.specs():
        fd = module.get_table(layout.symbol(spec.name)).map_fd
        out[spec.name] = int(memory.fdinfo(fd)["memlock"])
    return out


def packet_to(dst: str) -> bytes:
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") /
                 IPv6(src="fd00:a::a", dst=dst) / UDP(dport=9) / bytes(64))


def measure_peers(runs: int = 20000, peer_counts=PEERS_AT, n_paths: int = 256, policy: str = "rr",
                  repeat: int = 1, active: int | None = None, trie_alone: bool = True) -> list[list[dict]]:
    """Per-packet cost with 1, 1,000, 100,000 ... peers in the maps (all
    on one template, the LRU of learnt state full), against today's
    layout (one peer with paths of its own), side by side in one compile;
    for the measured peer outside the address plan and inside it
    ("template, in the plan": the trie's walk to it grows with the
    peers); and the maps' memlock at each point.  With `trie_alone`, a
    second compile without the cache of the trie's answers
    (lib/peer_cache.h, MRC_NO_PEER_CACHE) is timed at every point right
    after the first: the lookup as it was, side by side."""
    from mrc_ebpf.datapath import memory, source
    active = layout.C["MRC_MAX_ACTIVE_PEERS"] if active is None else active
    builds = [("cache", compile_datapath())]
    if trie_alone:
        text = ("#define MRC_NO_PEER_CACHE 1\n" + source.expand()).encode()
        builds.append(("trie alone", compile_datapath(text=text)))
    cpus = bpfsys.possible_cpus()
    try:
        reps = []
        for _ in range(repeat):
            rows = []
            for n in (None, *peer_counts):
                for inside in ((False,) if n is None else (False, True)):
                    for lookup, (module, tx, rx, _) in builds:
                        if n is None:
                            clear_maps(module, ("peers", "peer_by_sid", "peer_state", "rx_paths", "rx_peers",
                                            "peer_cache"))
                            _configure(module, n_paths, policy)
                            dst, sid = "fd00:b::b", PEER_SID
                        else:
                            dst, sid = fill_peers(module, n, n_paths, policy, active, inside)
                        set_key(module, False)
                        packet = packet_to(dst)
                        tx_ns, rx_ns = _timed_point(tx, rx, packet, runs, peer_sid=sid)
                        mem = maps_memlock(module)
                        in_use = {"peers": n or 1, "peer_by_sid": n or 1}
                        grow = sum(memory.model(128, in_use).values()) - sum(memory.model(cpus, in_use).values())
                        rows.append({"layout": "own paths" if n is None else
                                     "template, in the plan" if inside else "template",
                                     "lookup": lookup, "peers": n or 1,
                                     "paths": n_paths, "tx_ns": _percentiles(tx_ns), "rx_ns": _percentiles(rx_ns),
                                     "memlock": sum(mem.values()), "memlock_128_cpus": sum(mem.values()) + grow,
                                     "maps": mem})
            reps.append(rows)
        return reps
    finally:
        for _, (module, *_) in builds:
            module.cleanup()


# --------------------------------------------------------------------------- the scenario

USES_TCP = False
TITLE = "per-packet cost (BPF_PROG_TEST_RUN) and 64-byte UDP throughput: none vs mrc vs kernel SRv6"
SETUPS = ("none", "mrc", "mrc-key", "kernel")
A_LINK, B_LINK = "fd01::a", "fd01::b"
A_DATA, B_DATA = "fd00:a::1", "fd00:b::1"
A_SID, B_SID, B_DT6, A_DT6 = "fc00:a::1", "fc00:b::1", "fc00:b::6", "fc00:a::6"


def params(short: bool) -> dict:
    return {"runs": 1000 if short else 20000, "paths": [1, 16, 256], "policies": ["rr", "bytes", "adaptive"],
            "peers": [1, 1000] if short else list(PEERS_AT),
            # the trie alone (MRC_NO_PEER_CACHE) timed beside the cache: a second compile
            "trie_alone": not short,
            "key_batches": 10 if short else 20, "key_per": 100 if short else 200,
            "flood_seconds": 1.0 if short else 5.0, "payload_bytes": 64, "repeat": 1 if short else 3,
            "setups": list(SETUPS), "sender": "iperf3 -u -l 64 -b 0 (one thread)",
            "counted_at": "receiver interface rx_packets, middle of the run (0.5 s trimmed each end)"}


@dataclasses.dataclass
class Flood:
    """One 64-byte UDP flood, as B's interface counted it over the middle of the run."""
    rx_packets: int
    rx_bytes: int
    seconds: float


@dataclasses.dataclass
class Measured:
    """The whole scenario as measured."""
    prog_test_run: list[list[dict]]     # measure(): per repetition, every (policy, paths) point
    peers: list[list[dict]]             # measure_peers(): per repetition, every point ([]: not run)
    key_batches: list[dict]             # measure_key_cost()'s rows, every repetition's
    floods: dict[str, list[Flood]]      # setup -> its floods, in repetition order


def _setup(env, ns, mode: str, undo: bool = False) -> None:
    A, B = ns["A"], ns["B"]
    if mode == "kernel":
        verb = "del" if undo else "replace"
        env.run(None, ["ip", "-n", A, "-6", "route", verb, f"{B_DATA}/128", "encap", "seg6", "mode", "encap",
                       "segs", B_DT6, "via", B_LINK, "dev", "a0"])
        env.run(None, ["ip", "-n", B, "-6", "route", verb, f"{A_DATA}/128", "encap", "seg6", "mode", "encap",
                       "segs", A_DT6, "via", A_LINK, "dev", "b0"])
    elif mode == "mrc":
        if undo:
            env.mrcctl(A, "detach", "--all")
            env.mrcctl(B, "detach", "--all")
        else:
            env.mrcctl(A, "attach", "a0", "--sid", A_SID)
            env.mrcctl(B, "attach", "b0", "--sid", B_SID)
            env.mrcctl(A, "path", "add", "fd00:b::/64", "--via", B_SID)
            env.mrcctl(B, "path", "add", "fd00:a::/64", "--via", A_SID)


def _key(env, ns, on: bool) -> None:
    """mrc-key is mrc with a key on both ends: set or cleared in place, so
    the two alternate on one attachment, without a compile between."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".key") as f:
        f.write(BENCH_KEY.hex() + "\n")
        f.flush()
        for n in (ns["A"], ns["B"]):
            env.mrcctl(n, "key", *(("use", "--key-file", f.name) if on else ("clear",)))


def _pair(env, ns) -> None:
    A, B = ns["A"], ns["B"]
    env.run(None, ["ip", "link", "add", "a0", "netns", A, "type", "veth", "peer", "name", "b0", "netns", B])
    for n, dev, link, data, sid, dt6, peer in ((A, "a0", A_LINK, A_DATA, A_SID, A_DT6, B_LINK),
                                               (B, "b0", B_LINK, B_DATA, B_SID, B_DT6, A_LINK)):
        env.run(n, ["sysctl", "-qw", f"net.ipv6.conf.{dev}.seg6_enabled=1"])
        cmds = [f"link set {dev} up", f"addr add {link}/64 dev {dev} nodad", f"addr add {data}/128 dev lo",
                f"route add fd00::/16 via {peer} dev {dev}", f"route add fc00::/16 via {peer} dev {dev}",
                f"route add {dt6}/128 encap seg6local action End.DT6 table local dev {dev}"]
        env.run(None, ["ip", "-n", n, "-batch", "-"], input="\n".join(cmds) + "\n")
        env.run(None, ["tc", "-n", n, "qdisc", "replace", "dev", dev, "root", "pfifo", "limit", "1000"])


def _flood(env, ns, seconds: float, port: int) -> Flood:
    A, B = ns["A"], ns["B"]
    srv = env.popen(B, ["iperf3", "-s", "-1", "-B", B_DATA, "-p", str(port)])
    try:
        time.sleep(0.3)
        # iperf3 runs longer than the window counted, which starts once packets flow
        cli = env.popen(A, ["iperf3", "-c", B_DATA, "-B", A_DATA, "-p", str(port), "-u", "-l", "64",
                            "-b", "0", "-t", str(seconds + 10)])
        s0 = env.link_stats(B, "b0")
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if env.link_stats(B, "b0")["rx_packets"] - s0["rx_packets"] > 1000:
                break
        time.sleep(0.3)
        s1, t1 = env.link_stats(B, "b0"), time.monotonic()
        time.sleep(seconds)
        s2, t2 = env.link_stats(B, "b0"), time.monotonic()
        env.end(cli)
    finally:
        env.wait(srv, timeout=2)
    if s2["rx_packets"] <= s1["rx_packets"]:
        raise MrcError("cost: nothing reached the receiver during the flood")
    return Flood(s2["rx_packets"] - s1["rx_packets"], s2["rx_bytes"] - s1["rx_bytes"], t2 - t1)



def steps(p: dict) -> int:
    """Floods run(p) makes (the progress line's total; the BPF_PROG_TEST_RUN part is quick)."""
    return p["repeat"] * len(p["setups"])

def run(p: dict, env) -> dict:
    """Measure (measure_all()), then analyse (summarize)."""
    return summarize(p, measure_all(p, env))


def measure_all(p: dict, env) -> Measured:
    from mrc_ebpf.bench.runner import log, namespaces
    log(f"cost: BPF_PROG_TEST_RUN, {p['runs']} runs per point")
    progs = measure(p["runs"], tuple(p["policies"]), p["repeat"])
    reps = []
    if p.get("peers"):
        log(f"cost: {', '.join(map(str, p['peers']))} peers in the maps")
        reps = measure_peers(p["runs"], tuple(p["peers"]), repeat=p["repeat"],
                             trie_alone=p.get("trie_alone", True))
    log(f"cost: a key's cost, {p['key_batches']} pairs of {p['key_per']}-packet batches per point")
    key_batches = [row for _ in range(p["repeat"]) for row in measure_key_cost(p["key_batches"], p["key_per"])]
    runs = {s: [] for s in p["setups"]}
    with namespaces("c", ["A", "B"]) as ns:
        _pair(env, ns)
        port = 5300
        # none and kernel alternate; so do mrc and mrc-key, on one
        # attachment (a compile per end) whose key is set and cleared
        attached = ("mrc", "mrc-key")
        for group in ([s for s in p["setups"] if s not in attached],
                      [s for s in p["setups"] if s in attached]):
            if not group:
                continue
            if group[0] in attached:
                _setup(env, ns, "mrc")
            try:
                for rep in range(p["repeat"]):
                    for setup in group:
                        log(f"cost: flood {setup} (run {rep + 1}/{p['repeat']})", step=True)
                        if setup == "kernel":
                            _setup(env, ns, setup)
                        if setup in attached:
                            _key(env, ns, setup == "mrc-key")
                        try:
                            port += 1
                            runs[setup].append(_flood(env, ns, p["flood_seconds"], port))
                        finally:
                            if setup == "kernel":
                                _setup(env, ns, setup, undo=True)
            finally:
                if group[0] in attached:
                    _setup(env, ns, "mrc", undo=True)
    return Measured(progs, reps, key_batches, runs)


# --------------------------------------------------------------------------- analysis

def flood_result(f: Flood) -> dict:
    pps = f.rx_packets / f.seconds
    return {"pps": pps, "payload_gbps": pps * 64 * 8 / 1e9, "wire_gbps": f.rx_bytes * 8 / f.seconds / 1e9,
            "frame_bytes": f.rx_bytes / max(1, f.rx_packets), "seconds": f.seconds}


def summarize(p: dict, measured: Measured) -> dict:
    from mrc_ebpf.bench.runner import spread
    progs, reps, key_batches = measured.prog_test_run, measured.peers, measured.key_batches
    runs = {s: [flood_result(f) for f in fs] for s, fs in measured.floods.items()}
    key_cost = key_cost_ratios(key_batches)
    prog_rows = []
    for i, row in enumerate(progs[0]):
        tx = [rep[i]["tx_ns"]["median"] for rep in progs]
        rx = [rep[i]["rx_ns"]["median"] for rep in progs]
        prog_rows.append({"policy": row["policy"], "paths": row["paths"], "key": row["key"],
                          "tx_ns_median": spread(tx),
                          "rx_ns_median": spread(rx), "runs": [{"tx_ns": rep[i]["tx_ns"], "rx_ns": rep[i]["rx_ns"]}
                                                             for rep in progs]})
    peer_rows = []
    if reps:
        for i, row in enumerate(reps[0]):
            peer_rows.append({k: row[k] for k in ("layout", "lookup", "peers", "paths", "memlock",
                                                    "memlock_128_cpus", "maps")}
                             | {"tx_ns_median": spread([rep[i]["tx_ns"]["median"] for rep in reps]),
                                "rx_ns_median": spread([rep[i]["rx_ns"]["median"] for rep in reps])})
    flat = {}
    for pol in p["policies"]:
        rows = [r for r in prog_rows if r["policy"] == pol]
        for d in ("tx", "rx"):
            med = [r[f"{d}_ns_median"]["median"] for r in rows]
            flat[f"{pol}_{d}_256_over_1"] = med[-1] / med[0]
    through = {}
    for setup in p["setups"]:
        ratios = [r["pps"] / base["pps"] for r, base in zip(runs[setup], runs["none"])]
        through[setup] = {"pps": spread([r["pps"] for r in runs[setup]]),
                          "payload_gbps": spread([r["payload_gbps"] for r in runs[setup]]),
                          "wire_gbps": spread([r["wire_gbps"] for r in runs[setup]]),
                          "frame_bytes": runs[setup][0]["frame_bytes"],
                          "ratio_to_none": spread(ratios), "runs": runs[setup]}
    mrc_vs_kernel = spread([m["pps"] / k["pps"] for m, k in zip(runs["mrc"], runs["kernel"])])
    notes = ["key / no key per packet, paired batches: " +
             ", ".join(f"{r['what']} {r['paths']} paths TX {r['tx_key_over_no_key']:.3f} "
                       f"RX {r['rx_key_over_no_key']:.3f}" for r in key_cost)]
    if runs.get("mrc-key") and runs.get("mrc"):
        keyed = spread([k["pps"] / m["pps"] for k, m in zip(runs["mrc-key"], runs["mrc"])])
        notes.append(f"mrc with a key / without pps ratio {keyed['median']:.2f}")
    peers_flat = {}
    if peer_rows:
        own = [r for r in peer_rows if r["layout"] == "own paths" and r["lookup"] == "cache"][0]
        for lay, tag in (("template", ""), ("template, in the plan", "_in_plan")):
            for lookup in ("cache", "trie alone"):
                rows = [r for r in peer_rows if r["layout"] == lay and r["lookup"] == lookup]
                if not rows:
                    continue
                suffix = tag + ("" if lookup == "cache" else "_trie_alone")
                for r in rows[1:]:
                    for d in ("tx", "rx"):
                        peers_flat[f"{d}_{r['peers']}_over_{rows[0]['peers']}{suffix}"] = \
                            r[f"{d}_ns_median"]["median"] / rows[0][f"{d}_ns_median"]["median"]
        one = [r for r in peer_rows if r["layout"] == "template" and r["lookup"] == "cache"][0]
        for d in ("tx", "rx"):
            peers_flat[f"{d}_template_1_over_own_paths"] = \
                one[f"{d}_ns_median"]["median"] / own[f"{d}_ns_median"]["median"]
    return {"prog_test_run": prog_rows, "flatness_256_over_1": flat, "throughput": through,
            "peers": peer_rows, "flatness_peers": peers_flat,
            "mrc_over_kernel_pps": mrc_vs_kernel, "key_cost": key_cost, "key_cost_batches": key_batches,
            "notes": notes + [
                      f"mrc/kernel pps ratio {mrc_vs_kernel['median']:.2f} "
                      f"(min {mrc_vs_kernel['min']:.2f}, max {mrc_vs_kernel['max']:.2f})",
                      "ns/packet 256 paths over 1 path: " +
                      ", ".join(f"{k} {v:.2f}" for k, v in flat.items())]}


def table(results: dict):
    from mrc_ebpf.bench.runner import fmt_spread
    headers = ["what", "setting", "TX ns/pkt", "RX ns/pkt", "pps", "payload Gbit/s", "vs none"]
    rows = [("prog_test_run", f"{r['policy']}, {r['paths']} paths", fmt_spread(r["tx_ns_median"]),
             fmt_spread(r["rx_ns_median"]), "", "", "") for r in results["prog_test_run"]]
    for r in results.get("key_cost", []):
        rows.append(("key / no key", f"rr, {r['paths']} paths, {r['what']} packets, {r['pairs']} batch pairs",
                     f"{r['tx_key_over_no_key']:.3f} ({r['tx_plus_ns']:+.0f} ns)",
                     f"{r['rx_key_over_no_key']:.3f} ({r['rx_plus_ns']:+.0f} ns)", "", "", ""))
    for r in results.get("peers", []):
        rows.append(("peers in the maps", f"{r['peers']} ({r['layout']}, {r.get('lookup', 'cache')}, "
                     f"{r['paths']} paths), "
                     f"{r['memlock'] / 2**20:.1f} MiB ({r['memlock_128_cpus'] / 2**20:.1f} at 128 CPUs)",
                     fmt_spread(r["tx_ns_median"]), fmt_spread(r["rx_ns_median"]), "", "", ""))
    for setup, t in results["throughput"].items():
        rows.append(("64 B UDP flood", setup, "", "", fmt_spread(t["pps"]), fmt_spread(t["payload_gbps"]),
                     fmt_spread(t["ratio_to_none"])))
    return headers, rows


def plot(results: dict, plt):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for pol in sorted({r["policy"] for r in results["prog_test_run"]}):
        rows = [r for r in results["prog_test_run"] if r["policy"] == pol and not r.get("key")]
        for d, m in (("tx", "o-"), ("rx", "s--")):
            ys = [r[f"{d}_ns_median"]["median"] for r in rows]
            lo = [y - r[f"{d}_ns_median"]["min"] for y, r in zip(ys, rows)]
            hi = [r[f"{d}_ns_median"]["max"] - y for y, r in zip(ys, rows)]
            ax1.errorbar([r["paths"] for r in rows], ys, yerr=[lo, hi], fmt=m, label=f"{d.upper()} {pol}")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("paths")
    ax1.set_ylabel("ns / packet (BPF_PROG_TEST_RUN median)")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=7)
    names = list(results["throughput"])
    med = [results["throughput"][n]["pps"]["median"] / 1e3 for n in names]
    lo = [m - results["throughput"][n]["pps"]["min"] / 1e3 for m, n in zip(med, names)]
    hi = [results["throughput"][n]["pps"]["max"] / 1e3 - m for m, n in zip(med, names)]
    ax2.bar(names, med, yerr=[lo, hi], color=["grey", "tab:blue", "tab:cyan", "tab:orange"][:len(names)])
    ax2.set_ylabel("kpps at the receiver (64 B UDP)")
    return fig


def main() -> None:
    from tabulate import tabulate
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("-j", "--json", action="store_true")
    parser.add_argument("--key-cost", metavar="BATCHES", type=int,
                        help="Instead: what a key costs, paired (measure_key_cost), BATCHES pairs of "
                             "200-packet batches per point")
    parser.add_argument("--repeat", type=int, default=1, help="with --peers: rounds of every point")
    parser.add_argument("--peers", metavar="N,N,...",
                        help="Instead: the cost with N peers in the maps (e.g. 1,1000,100000), "
                             "and the maps' memlock")
    args = parser.parse_args()
    if args.key_cost:
        rows = key_cost_ratios(measure_key_cost(args.key_cost, 200))
        if args.json:
            print(json.dumps(rows, indent=2))
            return
        print(tabulate([(r["what"], r["paths"], f"{r['tx_ns']:.0f} / {r['tx_ns_key']:.0f}",
                         f"{r['rx_ns']:.0f} / {r['rx_ns_key']:.0f}", f"{r['tx_key_over_no_key']:.3f}",
                         f"{r['rx_key_over_no_key']:.3f}", f"{r['tx_plus_ns']:+.0f}", f"{r['rx_plus_ns']:+.0f}")
                        for r in rows],
                       headers=["packets", "paths", "TX ns no key / key", "RX ns no key / key",
                                "TX key / no key", "RX key / no key", "TX +ns", "RX +ns"]))
        return
    if args.peers:
        reps = measure_peers(args.runs, tuple(int(n) for n in args.peers.split(",")), repeat=args.repeat)
        if args.json:
            print(json.dumps(reps if args.repeat > 1 else reps[0], indent=2))
            return
        rows = reps[0]
        print(tabulate([(r["layout"], r["lookup"], r["peers"], r["tx_ns"]["median"], r["rx_ns"]["median"],
                         f"{r['memlock'] / 2**20:.1f}", f"{r['memlock_128_cpus'] / 2**20:.1f}")
                        for r in rows],
                       headers=["paths", "lookup", "peers", "TX ns median", "RX ns median", "memlock MiB",
                                "at 128 CPUs"]))
        return
    rows = measure(args.runs)[0]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    keys = ("p10", "median", "p90")
    print(tabulate([(r["policy"], r["paths"], *(r["tx_ns"][k] for k in keys),
                     *(r["rx_ns"][k] for k in keys)) for r in rows],
                   headers=["policy", "paths", "TX ns p10", "median", "p90", "RX ns p10", "median", "p90"]))


if __name__ == "__main__":
    main()
