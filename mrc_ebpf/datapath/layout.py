"""ctypes mirrors of the structs in bpf/mrc_common.h.

Sizes come from the header (source.C); each struct is registered as a
mirror (mirrors.py), and tests/test_layout.py checks every field offset
and size here against the C as bcc compiles it, so a drift fails the tests.
"""
from __future__ import annotations

import ctypes

from mrc_ebpf.datapath.mirrors import mirror
from mrc_ebpf.datapath import source
from mrc_ebpf.datapath.source import C

u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
Addr = u8 * 16


@mirror("struct mrc_tlv")
class MrcTlv(ctypes.BigEndianStructure):
    """The MRC TLV as it is on the wire (network byte order)."""
    _pack_ = 1
    _fields_ = [("type", u8), ("len", u8), ("version", u8), ("flags", u8),
                ("path_id", u16), ("tclass", u8), ("fb_block", u8),
                ("path_seq", u32), ("peer_seq", u32), ("tx_ns", u64),
                ("fb_path_id", u16), ("fb_qdelay_us", u16), ("fb_lost", u32), ("fb_heard", u64),
                ("fb_since_ns32", u32), ("fb_path_tx32", u32),
                ("epoch", u32), ("key_id", u8), ("ports_down", u8), ("reserved", u8 * 2), ("mac", u8 * 8)]


@mirror("struct mrc_sid")
class Sid(ctypes.Structure):
    _fields_ = [("addr", Addr)]


@mirror("struct mrc_peer_key")
class PeerKey(ctypes.Structure):
    _fields_ = [("prefixlen", u32), ("addr", Addr)]


@mirror("struct mrc_peer")
class Peer(ctypes.Structure):
    _fields_ = [("peer_id", u32), ("n_paths", u16), ("policy", u8), ("flags", u8),
                ("template_id", u32), ("sid", Sid)]


@mirror("struct mrc_template_name")
class TemplateName(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 32)]


@mirror("struct mrc_path")
class Path(ctypes.Structure):
    _fields_ = [("segments", Sid * C["MRC_MAX_SEGMENTS"]), ("peer_sid", Sid), ("nexthop", Addr), ("oif", u32),
                ("flowlabel", u32), ("weight", u16), ("n_segments", u8), ("state", u8),
                ("flags", u8), ("tclass", u8), ("pad", u8 * 2)]


@mirror("struct mrc_peer_tx")
class PeerTx(ctypes.Structure):
    _fields_ = [("seq", u64), ("turns_q16", u64), ("fail_open_ns", u64), ("heard_ns", u64),
                ("heard_path", u32), ("turn_len", u32), ("last_ns", u64)]


@mirror("struct mrc_device")
class Device(ctypes.Structure):
    _fields_ = [("ifindex", u32), ("flags", u32), ("saved_gso_max_segs", u32), ("mtu", u32),
                ("granularity", u32), ("link_mbps", u32)]


@mirror("struct mrc_config")
class Config(ctypes.Structure):
    _fields_ = [("sid", Addr), ("mtu", u32), ("loss_hold_us", u32), ("ack_timeout_us", u32),
                ("probe_us", u32), ("fb_interval_us", u32), ("reorder_max_us", u32),
                ("retrans_steer", u32), ("n_devices", u32),
                ("devices", Device * C["MRC_MAX_DEVICES"]), ("min_active", u32), ("shared_fate", u32),
                ("skip_rotations", u32), ("probe_max_us", u32), ("probe_budget", u32), ("ports_down", u32)]


@mirror("struct mrc_port_tell")
class PortTell(ctypes.Structure):
    _fields_ = [("addr", Addr), ("peer_id1", u32), ("row", u32)]


@mirror("struct mrc_port_hook")
class PortHook(ctypes.Structure):
    _fields_ = [("netns_cookie", u64), ("off_ifindex", u32), ("off_flags", u32), ("off_state", u32),
                ("off_nd_net", u32), ("off_net_cookie", u32), ("nocarrier_bit", u32), ("hooked", u32),
                ("mask", u32), ("calls", u64), ("changes", u64), ("last_ns", u64),
                ("lw_func", u64), ("dwork_timer_fn", u64), ("off_work_func", u32), ("off_timer_fn", u32),
                ("off_dwork_timer", u32), ("off_dwork_work", u32), ("devs", u64 * C["MRC_MAX_DEVICES"]),
                ("told", u64), ("tell", PortTell * C["MRC_PORT_TELL"])]


@mirror("struct mrc_tx_flow")
class TxFlow(ctypes.Structure):
    _fields_ = [("key", u32), ("snd_nxt", u32)]


@mirror("struct mrc_spray")
class Spray(ctypes.Structure):
    _fields_ = [("n", u32), ("quantum", u32), ("ids", u16 * C["MRC_SPRAY_SLOTS"])]


@mirror("struct mrc_class_name")
class ClassName(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 16)]


@mirror("struct mrc_path_health")
class PathHealth(ctypes.Structure):
    _fields_ = [("updated_ns", u64), ("loss_ns", u64), ("qdelay_us", u16), ("ce_stamp", u16),
                ("lost", u32)]


@mirror("struct mrc_rx_key")
class RxKey(ctypes.Structure):
    _fields_ = [("sid", Addr), ("path_id", u16), ("pad", u16)]


Hist = u32 * C["MRC_HIST_BUCKETS"]


@mirror("struct mrc_rx_path")
class RxPath(ctypes.Structure):
    _fields_ = [("packets", u64), ("bytes", u64), ("lost", u64), ("late", u64),
                ("min_owd_ns", u64), ("last_ns", u64), ("next_seq", u32), ("qdelay_us", u32),
                ("qdelay_hist", Hist), ("epoch", u32), ("ce", u32), ("seen", u64),
                ("trimmed", u32), ("pad2", u32), ("qdelay_sum_us", u64), ("latest_tx", u64)]


@mirror("struct mrc_rx_peer")
class RxPeer(ctypes.Structure):
    _fields_ = [("packets", u64), ("reordered", u64), ("heard", u64 * (C["MRC_MAX_PATHS"] // 64)),
                ("loss_news", u64 * (C["MRC_MAX_PATHS"] // 64)),
                ("ce_news", u64 * (C["MRC_MAX_PATHS"] // 64)),
                ("fb_sent_ns", u64), ("max_peer_seq", u32), ("last_path_id", u16),
                ("fb_block", u8), ("ports_down", u8), ("reorder_hist", Hist), ("epoch", u32), ("restarts", u32),
                ("heard_since", u64 * (C["MRC_MAX_PATHS"] // 64)),
                ("heard_need", u64 * (C["MRC_MAX_PATHS"] // 64)),
                ("heard_slow", u64 * (C["MRC_MAX_PATHS"] // 64)),
                ("ports_walk", u32), ("ports_told", u8), ("pad3", u8 * 3), ("reorder_sum", u64)]


@mirror("struct mrc_path_live")
class PathLive(ctypes.Structure):
    _fields_ = [("down_ns", u64), ("next_probe_ns", u64),
                ("last_sent_ns", u64), ("down_after_ns", u64),
                ("late_ns", u64),
                ("downs", u32), ("probes", u32), ("kept_since_ns", u64),
                ("probe_gap_us", u32), ("ce_reports", u32), ("skip", u64)]

    @property
    def skip_left(self) -> int:
        """Turns the path still skips (the low half of `skip`)."""
        return self.skip & 0xFFFFFFFF


@mirror("struct mrc_peer_acks")
class PeerAcks(ctypes.Structure):
    _fields_ = [("max_ns", u64), ("last_ns", u64),
                ("window_ns", u64), ("window_hold_ns", u64),
                ("resume_ns", u64), ("max_at_resume_ns", u64)]


@mirror("struct mrc_plane_paths")
class PlanePaths(ctypes.Structure):
    _fields_ = [("ids", u64 * (C["MRC_MAX_PATHS"] // 64))]


@mirror("struct mrc_peer_floor")
class PeerFloor(ctypes.Structure):
    _fields_ = [("usable", u64), ("plane_paths", PlanePaths * C["MRC_MAX_DEVICES"])]


@mirror("struct mrc_spares")
class Spares(ctypes.Structure):
    _fields_ = [("of", u16 * C["MRC_MAX_PATHS"])]


@mirror("struct mrc_path_state")
class PathState(ctypes.Structure):
    _fields_ = [("live", PathLive), ("health", PathHealth), ("heard_ns", u64),
                ("tx_packets", u64), ("tx_bytes", u64), ("fate_probe_ns", u64)]


@mirror("struct mrc_row_state")
class RowState(ctypes.Structure):
    _fields_ = [("floor_out", u64), ("pad", u64), ("paths", PathState * C["MRC_MAX_PATHS"])]


@mirror("struct mrc_path_clock")
class PathClock(ctypes.Structure):
    _fields_ = [("acked_ns", u64), ("unacked_since_ns", u64), ("clock_after_ns", u64)]


@mirror("struct mrc_mac_prefix")
class MacPrefix(ctypes.Structure):
    _fields_ = [("k0", u64), ("k1", u64), ("words", u64 * 3), ("v", u64 * 4), ("check", u64)]


@mirror("struct mrc_peer_state")
class PeerState(ctypes.Structure):
    _fields_ = [("tx", PeerTx), ("acks", PeerAcks), ("fb_due", u64),
                ("row1", u32), ("pad", u32), ("tx_mac", MacPrefix),
                ("clocks", PathClock * C["MRC_MAX_PATHS"]), ("path_seq", u64 * (C["MRC_MAX_PATHS"] // 2))]

    def next_seq(self, path_id: int) -> int:
        """The next sequence number of path PATH_ID (two 32-bit ones a word)."""
        return (self.path_seq[path_id // 2] >> (32 * (path_id % 2))) & 0xFFFFFFFF


@mirror("struct mrc_peer_cached")
class PeerCached(ctypes.Structure):
    _fields_ = [("peer", Peer), ("gen", u32), ("found", u32), ("pad", u32)]


@mirror("struct mrc_event")
class Event(ctypes.Structure):
    _fields_ = [("seq", u64), ("ns", u64), ("since_ns", u64), ("peer_id", u32),
                ("path_id", u16), ("type", u16)]


@mirror("struct mrc_auth_key")
class AuthKey(ctypes.Structure):
    _fields_ = [("k0", u64), ("k1", u64), ("id", u8), ("pad", u8 * 7)]


@mirror("struct mrc_auth")
class Auth(ctypes.Structure):
    _fields_ = [("epoch", u32), ("tx_slot", u8), ("pad", u8 * 3),
                ("keys", AuthKey * C["MRC_AUTH_KEYS"])]


@mirror("struct mrc_tx_scratch")
class TxScratch(ctypes.Structure):
    _fields_ = [("bytes", u8 * 128)]


@mirror("struct mrc_hop")
class Hop(ctypes.Structure):
    _fields_ = [("sid", Sid), ("suspect_ns", u64), ("until_ns", u64), ("suspects", u64),
                ("shared_downs", u64), ("lone_ns", u64), ("lone_who", u64),
                ("watch_ns", u64), ("watch_who", u64), ("watch_after_ns", u64), ("watch_suspects", u64),
                ("watch2_ns", u64), ("watch2_who", u64), ("watch2_after_ns", u64),
                ("probe_next_ns", u64), ("probes_held", u64)]


@mirror("struct mrc_path_fate")
class PathFate(ctypes.Structure):
    _fields_ = [("hop", u32)]


@mirror("struct mrc_roce_key")
class RoceKey(ctypes.Structure):
    _fields_ = [("peer_id", u32), ("sport", u16), ("pad", u16)]


@mirror("struct mrc_roce_qp")
class RoceQp(ctypes.Structure):
    _fields_ = [("tx_packets", u64), ("tx_retrans", u64), ("naks_seq", u64), ("acks", u64),
                ("rx_packets", u64), ("rx_ahead", u64), ("rx_behind", u64),
                ("dqpn", u32), ("last_psn", u32), ("acked_psn", u32), ("rx_next_psn", u32),
                ("turn", u32), ("moves", u32), ("path_id", u16), ("pos", u16), ("flags", u8),
                ("pad", u8 * 3)]


@mirror("struct mrc_roce_path_key")
class RocePathKey(ctypes.Structure):
    _fields_ = [("peer_id", u32), ("path_id", u16), ("side", u16)]


@mirror("struct mrc_roce_path")
class RocePath(ctypes.Structure):
    _fields_ = [("tx_packets", u64), ("tx_retrans", u64), ("naks_seq", u64),
                ("rx_packets", u64), ("rx_ahead", u64), ("rx_behind", u64)]


@mirror("struct mrc_roce_pkt")
class RocePkt(ctypes.Structure):
    _fields_ = [("psn", u32), ("dqpn", u32), ("sport", u16), ("opcode", u8), ("syndrome", u8),
                ("valid", u32), ("seq_mul", u32), ("pos", u32)]


Index = u32

# name in lib/maps.h -> (key type, value type, per-CPU)
MAPS = {
    "config": (Index, Config, False),
    "peers": (PeerKey, Peer, False),
    "paths": (Index, Path, False),
    "peer_state": (Index, PeerState, False),
    "peer_state_zero": (Index, PeerState, False),
    "row_state": (Index, RowState, False),
    "peer_starts": (Index, u64, False),
    "peer_cache": (Sid, PeerCached, False),
    "peers_gen": (Index, u32, False),
    "peer_buf": (Index, PeerCached, True),
    "counters": (Index, u64, True),
    "spray": (Index, Spray, False),
    "dscp_class": (Index, u32, False),
    "class_names": (Index, ClassName, False),
    "peer_by_sid": (Sid, u32, False),
    "rx_paths": (RxKey, RxPath, False),
    "rx_peers": (Sid, RxPeer, False),
    "rx_peer_zero": (Index, RxPeer, False),
    "events": (Index, Event, False),
    "event_seq": (Index, u64, False),
    "tx_flows": (Index, TxFlow, False),
    "peer_floor": (Index, PeerFloor, False),
    "spares": (Index, Spares, False),
    "auth": (Index, Auth, False),
    "tx_scratch": (Index, TxScratch, True),
    "hops": (Index, Hop, False),
    "path_fate": (Index, PathFate, False),
    "tx_path": (Index, Path, True),
    "templates": (TemplateName, Peer, False),
    "auth_rx_prefix": (Index, MacPrefix, False),
    "roce_qps": (RoceKey, RoceQp, False),
    "roce_paths": (RocePathKey, RocePath, False),
    "roce_turns": (Index, u64, False),
    "roce_zero": (Index, RoceQp, False),
    "roce_pkt": (Index, RocePkt, True),
    "port_hook": (Index, PortHook, False),
}


def symbol(name: str) -> str:
    """The C and kernel name of map NAME of MAPS (its pin keeps NAME):
    prefixed, so that `bpftool map` tells the datapath's maps apart."""
    return name if name.startswith("mrc_") else f"mrc_{name}"


def logical(sym: str) -> str:
    """symbol()'s inverse: the name in MAPS of the map called SYM in C."""
    return sym[4:] if sym.startswith("mrc_") and sym[4:] in MAPS else sym


def srh_len(n_segments: int) -> int:
    """MRC_SRH_LEN(n_segments) of mrc_common.h: SRH fixed part, segments, TLV."""
    return source.macro("MRC_SRH_LEN", n_segments)


def encap_len(n_segments: int, usid: bool = False) -> int:
    """Bytes encapsulation adds to a packet: outer IPv6 + SRH + TLV
    (MRC_ENCAP_LEN), or for a uSID path outer IPv6 + Destination Options
    with the TLV (MRC_USID_ENCAP_LEN)."""
    return C["MRC_USID_ENCAP_LEN"] if usid else source.macro("MRC_ENCAP_LEN", n_segments)


# The timers of struct mrc_config when attach is not told otherwise
# (MRC_DEFAULT_*_US of mrc_common.h): {"ack_timeout_us": 1000, ...}
TIMER_DEFAULTS = {name: C[f"MRC_DEFAULT_{name.upper()}"]
                  for name in ("loss_hold_us", "ack_timeout_us", "probe_us", "fb_interval_us",
                               "reorder_max_us", "probe_max_us")}
# The other settings of struct mrc_config with a default in mrc_common.h
# (MRC_DEFAULT_*): {"skip_rotations": 0, "probe_budget": 0}
SETTING_DEFAULTS = {name: C[f"MRC_DEFAULT_{name.upper()}"] for name in ("skip_rotations", "probe_budget")}
