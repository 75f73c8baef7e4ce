"""The real datapath, compiled once, driven by BPF_PROG_TEST_RUN.

No device and no namespace: the programs run on frames given to the
kernel's test-run hook, with the maps the loader and control plane write
in an attachment (config, paths, spray lists, SID index).  What each run
changed is read back from the counters map.
"""
from __future__ import annotations

import ctypes
import errno
import ipaddress
import re

from mrc_ebpf.control import paths as cp
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
SENDER_STATE = {"rx_epoch"}
BPF_MAP_LOOKUP_BATCH = 24


def outcomes(prefix: str) -> list[str]:
    """The counters enum mrc_counter marks as outcomes ("outcome:" in
    the comment) whose names start with `prefix`: every packet is counted
    in exactly one of them."""
    text = source.COMMON_HEADER.read_text()
    body = re.search(r"enum\s+mrc_counter\s*{(.*?)}", text, flags=re.S).group(1)
    found = re.findall(r"MRC_(\w+),\s*/\*\s*outcome:", body)
    return [n.lower() for n in found if n.lower().startswith(prefix)]


class _BatchAttr(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


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
        for name in ("peer_starts",):
            m = self.att.maps[name]
            n = m.max_entries
            keys = b"".join(layout.Index(i) for i in range(n))
            m.update_batch(keys, bytes(ctypes.sizeof(m.value_type) * n), n)
        self.att.maps["event_seq"].update(layout.Index(0), layout.u64())
        for peer_id, (prefix, (kind, text)) in enumerate(PEERS.items()):
            self._add_peer(peer_id, prefix, kind, text)

    def _add_peer(self, peer_id: int, prefix_text: str, kind: str, text: str):
        """What paths.add writes to the maps for one path, without the
        kernel route it also installs (no device here)."""
        spec = cp.PathSpec.via(text) if kind == "via" else cp.PathSpec.compressed(text)
        prefix = cp.parse_prefix(prefix_text)
        path = layout.Path(n_segments=len(spec.segments), state=cp.UP, weight=1,
                           flowlabel=cp.flowlabel(prefix, 0, spec.segments), oif=1,
                           flags=cp.USID if spec.usid else 0)
        ctypes.memmove(path.nexthop, spec.first_hop.packed, 16)
        ctypes.memmove(path.peer_sid.addr, spec.peer_sid.packed, 16)
        for i, seg in enumerate(reversed(spec.segments)):
            ctypes.memmove(path.segments[i].addr, seg.packed, 16)
        index = cp.path_index(peer_id, 0)
        self.att.maps["paths"].update(index, path)
        peer = layout.Peer(peer_id=peer_id, n_paths=1, policy=cp.POLICIES["rr"], template_id=peer_id)
        cp._rebuild(self.att, peer)
        self.att.maps["peers"].update(cp.peer_key(prefix), peer)

    def path(self, prefix: str) -> layout.Path:
        peer = self.att.maps["peers"].lookup(cp.peer_key(cp.parse_prefix(prefix)))
        return self.att.maps["paths"].lookup(cp.path_index(peer.peer_id, 0))

    # --------------------------------------------------------------- counters
    def counters(self) -> list[int]:
        """All counters summed over CPUs, in one bpf() call."""
        n = len(COUNTERS)
        attr = _BatchAttr(out_batch=ctypes.addressof(self._out_batch),
                          keys=ctypes.addressof(self._keys), values=ctypes.addressof(self._values),
                          count=n, map_fd=self.att.maps["counters"].fd)
        try:
            bpfsys._bpf(BPF_MAP_LOOKUP_BATCH, attr)
        except bpfsys.BpfError as e:
            if e.errno != errno.ENOENT:
                raise
        assert attr.count == n, f"batch lookup returned {attr.count} of {n} counters"
        values, ncpu = self._values, self._ncpu
        return [sum(values[i * ncpu:(i + 1) * ncpu]) for i in range(n)]

    # ------------------------------------------------------------------- runs
    def _run(self, prog, names: dict, frame: bytes) -> Result:
        before = self.counters()
        ret, _, out = bpfsys.prog_test_run(prog.fd, frame, 1)
        after = self.counters()
        delta = {COUNTERS[i]: a - b for i, (a, b) in enumerate(zip(after, before))
                 if a != b and COUNTERS[i] not in SENDER_STATE}
        return Result(names.get(ret, str(ret)), out, delta)

    def run_rx(self, frame: bytes) -> Result:
        return self._run(self.rx, XDP, bytes(frame))

    def run_tx(self, frame: bytes) -> Result:
        return self._run(self.tx, TC, bytes(frame))
