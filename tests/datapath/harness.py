"""The real datapath, compiled once, driven by BPF_PROG_TEST_RUN.

No device and no namespace: the programs run on frames given to the
kernel's test-run hook, with the maps the loader and control plane write
in an attachment (config, paths, spray lists, SID index).  What each run
changed is read back from the counters map.
"""
from __future__ import annotations

import ctypes
import ipaddress
import re

from mrc_ebpf.control import path_spec, peer_table, shared_fate, spray
from mrc_ebpf.datapath import bpfsys, layout, loader, source

SID = "fc00:0:a::"                 # ours: a uSID block (fc00:0) + ID a
MAC_US, MAC_PEER = "02:00:00:00:00:0a", "02:00:00:00:00:0b"

# peer prefix -> (the path as `mrcctl path add` takes it, peer SID)
PEERS = {
    "fd00:b::/64": ("via", "fc00:0:e1::,fc00:0:b::"),      # SRH, 2 segments
    "fd00:c::/64": ("usid", "fc00:0:e1:c::"),              # uSID container
    "198.18.2.0/24": ("via", "fc00:0:e1::,fc00:0:d::"),    # IPv4 inner, SRH
}
PEER_SIDS = {"fd00:b::/64": "fc00:0:b::", "fd00:c::/64": "fc00:0:c::", "198.18.2.0/24": "fc00:0:d::"}

XDP = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}
TC = {0: "TC_ACT_OK", 2: "TC_ACT_SHOT", 7: "TC_ACT_REDIRECT"}

COUNTERS = source.counter_names()
# Counted when a frame is the first of a sender's epoch (tests/test_auth.py
# covers it): which row or fuzz case comes first from a sender is order,
# not the frame's verdict, so the tables leave it out.
# The same holds for a sender's port status (issue 29, lib/ports.h): a
# change is counted against what the sender said before, and for the
# receiver's entries of a sender and of its paths (made on the first).
SENDER_STATE = {"rx_epoch", "rx_port_status", "rx_port_down_paths",
                "rx_sender_new", "rx_sender_fail", "rx_path_new"}


def outcomes(prefix: str) -> list[str]:
    """The counters enum mrc_counter marks as outcomes ("outcome:" in
    the comment) whose names start with `prefix`: every packet is counted
    in exactly one of them."""
    text = source.header_text()
    body = re.search(r"enum\s+mrc_counter\s*{(.*?)}", text, flags=re.S).group(1)
    found = re.findall(r"MRC_(\w+),\s*/\*\s*outcome:", body)
    return [n.lower() for n in found if n.lower().startswith(prefix)]


def provision(att, peer_id: int, prefix_text: str, specs: list[path_spec.PathSpec],
              fate: bool = False) -> layout.Peer:
    """What `path add` writes to the maps for a peer with SPECS as its
    paths 0.., rr, each up, weight 1, out of ifindex 1 to its first hop;
    without the kernel route it also installs (no device here).  FATE:
    file each path's hop for shared fate too."""
    prefix = path_spec.parse_prefix(prefix_text)
    for path_id, spec in enumerate(specs):
        path = path_spec.encode(spec, spec.first_hop, 1, path_spec.flowlabel(prefix, path_id, spec.segments))
        index = peer_table.path_index(peer_id, path_id)
        att.maps["paths"].update(index, path)
        if fate:
            shared_fate.assign(att, index, path)
    peer = layout.Peer(peer_id=peer_id, n_paths=len(specs), policy=peer_table.POLICIES["rr"],
                       template_id=peer_id)
    spray.rebuild(att, peer)        # spray lists first: the peer entry makes them live
    att.maps["peers"].update(peer_table.peer_key(prefix), peer)
    return peer


class Result:
    def __init__(self, verdict: str, out: bytes, delta: dict[str, int]):
        self.verdict, self.out, self.delta = verdict, out, delta

    def __repr__(self):
        return f"Result({self.verdict}, {len(self.out)} bytes, {self.delta})"


class Datapath:
    """bpf/mrc.c compiled by the loader, its maps opened the way the
    control plane opens an attachment's."""

    def __init__(self):
        self.module, self.tx, self.rx, self.fb = loader.compile_datapath()
        self.att = loader.Attachment("test-run", None)
        for name, (key, value, percpu) in layout.MAPS.items():
            self.att.maps[name] = bpfsys.PinnedMap.from_fd(self.module[layout.symbol(name).encode()].map_fd, key, value,
                                                           percpu, name)
        loader.watch_peers(self.att.maps)
        self.sid = ipaddress.IPv6Address(SID)
        self._ncpu = bpfsys.possible_cpus()
        n = len(COUNTERS)
        self._keys = (ctypes.c_uint32 * n)()
        self._values = (ctypes.c_uint64 * (n * self._ncpu))()
        self._out_batch = ctypes.c_uint32()
        self.configure()

    def close(self):
        self.att.close()
        self.module.cleanup()

    # ------------------------------------------------------------------ state
    def configure(self):
        """A fresh attachment's state: config as attach writes it, the
        peers of PEERS as `path add` writes them; everything the programs
        learnt (RX tracking, feedback, failover) forgotten."""
        cfg = layout.Config(n_devices=1, mtu=1500, **loader.TIMERS)
        ctypes.memmove(cfg.sid, self.sid.packed, 16)
        cfg.devices[0] = layout.Device(ifindex=1, mtu=1500)
        self.att.maps["config"].update(layout.Index(0), cfg)
        for name in ("rx_paths", "rx_peers", "peer_by_sid", "peers", "peer_state", "peer_cache"):
            m = self.att.maps[name]
            for key in list(m.keys()):
                m.delete(key)
        # how often each peer's state started (lib/peer_state.h)
        for name in ("peer_starts", "row_state"):
            m = self.att.maps[name]
            n = m.max_entries
            keys = b"".join(layout.Index(i) for i in range(n))
            m.update_batch(keys, bytes(ctypes.sizeof(m.value_type) * n), n)
        self.att.maps["event_seq"].update(layout.Index(0), layout.u64())
        for peer_id, (prefix, (kind, text)) in enumerate(PEERS.items()):
            spec = path_spec.PathSpec.via(text) if kind == "via" else path_spec.PathSpec.compressed(text)
            provision(self.att, peer_id, prefix, [spec])

    def path(self, prefix: str) -> layout.Path:
        peer = self.att.maps["peers"].lookup(peer_table.peer_key(path_spec.parse_prefix(prefix)))
        return self.att.maps["paths"].lookup(peer_table.path_index(peer.peer_id, 0))

    # --------------------------------------------------------------- counters
    def counters(self) -> list[int]:
        """All counters summed over CPUs, in one bpf() call."""
        n = len(COUNTERS)
        got, _ = bpfsys.lookup_batch(self.att.maps["counters"].fd, None, self._out_batch,
                                     self._keys, self._values, n)
        assert got == n, f"batch lookup returned {got} of {n} counters"
        values, ncpu = self._values, self._ncpu
        return [sum(values[i * ncpu:(i + 1) * ncpu]) for i in range(n)]

    # ------------------------------------------------------------------- runs
    def _run(self, prog, names: dict, frame: bytes, ctx=None) -> Result:
        before = self.counters()
        ret, _, out = bpfsys.prog_test_run(prog.fd, frame, 1, ctx)
        after = self.counters()
        delta = {COUNTERS[i]: a - b for i, (a, b) in enumerate(zip(after, before))
                 if a != b and COUNTERS[i] not in SENDER_STATE}
        return Result(names.get(ret, str(ret)), out, delta)

    def run_rx(self, frame: bytes) -> Result:
        return self._run(self.rx, XDP, bytes(frame))

    def run_tx(self, frame: bytes, mark: int = 0) -> Result:
        return self._run(self.tx, TC, bytes(frame), bpfsys.SkbHead(mark=mark) if mark else None)
