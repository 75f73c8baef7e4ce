"""`mrcctl status`: what the kernel has, compared with what the pins say."""
from __future__ import annotations

import ipaddress
import os
import time

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import (auth, bpfsys, hooks, journal, layout, memory, pins, port_hook, repair, replace,
                               stale, xdp_chain)
from mrc_ebpf.control import paths
from mrc_ebpf.datapath.loader import PROG_RX, PROG_TX, Attachment
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.source import C


def collect() -> list[dict]:
    """A row per attachment here; on the host also a row ("stale": True)
    per pin directory whose namespace is gone (`mrcctl gc` removes them)."""
    from mrc_ebpf.datapath.loader import require_root
    require_root()
    pins.ensure_bpffs()
    rows = []
    devices = pins.attached_devices()
    if devices:     # nothing attached: no netlink socket, no pyroute2 import
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            for device in devices:
                rows.append(_one(ipr, device))
    cut_short = journal.pending()
    for row in rows:
        row["journal"] = cut_short
        if cut_short:
            row["problems"].append(_half_done(cut_short))
            row["healthy"] = False
    if cut_short and not rows:      # e.g. an apply killed before its attach finished
        rows.append({"device": None, "journal": cut_short, "healthy": False,
                     "problems": [_half_done(cut_short)]})
    if on_host():
        for entry in stale.find():
            rows.append({**entry, "stale": True, "device": None, "healthy": False,
                         "problems": [f"namespace {entry['netns_cookie']} is gone: `mrcctl gc` "
                                      f"removes its state"]})
    return rows


def _half_done(cut_short: dict) -> str:
    return (f"half-done: {cut_short['what']} ({cut_short['log']}); the next mrcctl command that "
            f"changes this namespace (e.g. `mrcctl gc`) rolls it back")


def on_host() -> bool:
    """In the initial network namespace: kthreadd's (kernel threads live
    there), or pid 1's where kthreadd is not ours to see."""
    mine = os.stat("/proc/self/ns/net").st_ino
    for pid in ("2", "1"):
        try:
            if pid == "2" and open("/proc/2/comm").read().strip() != "kthreadd":
                continue
            return os.stat(f"/proc/{pid}/ns/net").st_ino == mine
        except OSError:
            continue
    return False


def _one(ipr: IPRoute, device: str) -> dict:
    row = {"device": device, "devices": [device], "pins": str(pins.device_dir(device)),
           "problems": []}
    try:
        att = Attachment.open(device)
    except MrcError as e:
        row.update(healthy=False, problems=[str(e)], sid=None, xdp_mode=None, xdp_prog_id=0,
                   xdp_chained=None,
                   xdp_ours=False, tc_prog_id=0, tc_ours=False, mtu=None, overhead={},
                   granularity=None, peers=0, paths=0, hooks=[], fail_open=[], ack_windows=[],
                   routes=[], path_states={}, min_active=None, programs={}, shared_fate=None,
                   probing=None, skip_rotations=None,
                   memory=None, templated_peers=0, active_peers=0, auth=None, learnt_state=None,
                   receive_state=None,
                   hook_changes=[], port_status=None)
        return row
    with att:
        cfg = att.config
        rx_id, tx_id = att.prog_id(PROG_RX), att.prog_id(PROG_TX)
        entries = list(att.maps["peers"].items())
        peers = [p for _, p in entries]
        used = paths.UsedCache(att)
        active = {k.value: v for k, v in att.maps["peer_state"].items()}
        rows = _Rows(att)
        overhead = {f"{n} seg": layout.encap_len(n) for n in range(1, C["MRC_MAX_SEGMENTS"] + 1)}
        overhead["usid"] = layout.encap_len(1, usid=True)
        row.update(sid=str(ipaddress.IPv6Address(bytes(cfg.sid))), mtu=cfg.mtu,
                   peers=len(peers), paths=sum(len(used(p)) for p in peers), overhead=overhead,
                   templated_peers=sum(1 for p in peers if p.flags & paths.LAST_HOP),
                   active_peers=len(active), learnt_state=learnt_state(att, len(active)),
                   receive_state=receive_state(att),
                   devices=att.device_names(), fail_open=_fail_open(att, entries, active),
                   ack_windows=_ack_windows(att, entries, active),
                   path_states=_path_states(att, peers, used, active, rows),
                   min_active=cfg.min_active, memory=maps_memory(att.dir),
                   skip_rotations=cfg.skip_rotations, probing=_probing(att, cfg, peers, used, rows),
                   programs=replace.programs(att.dir), shared_fate=bool(cfg.shared_fate),
                   port_status=dict(port_hook.state(att), ports_down=cfg.ports_down),
                   routes=[{"prefix": str(paths.key_prefix(k)),
                            "route_metrics": paths.route_metrics(att, paths.key_prefix(k))}
                           for k, p in sorted(entries, key=lambda kv: kv[1].peer_id)
                           if not p.flags & paths.LAST_HOP])
        chained = [_chained(att, cfg, i, row["problems"]) for i in range(len(row["devices"]))]
        members = [layout.Device.from_buffer_copy(cfg.devices[i]) for i in range(len(row["devices"]))]
        row["auth"] = auth.describe(auth.read(att))     # authenticated false: feedback anyone can forge
    for f in row["fail_open"]:
        row["problems"].append(f"every path to {f['prefix']} is down: sending on them anyway, "
                               f"probed (fail-open) for {f['for_ms']} ms")
    # what the kernel has on each device, against the pinned programs
    row["hooks"] = [_hooks(ipr, name, rx_id, tx_id, row["problems"], member)
                    for name, member in zip(row["devices"], members)]
    for hooked, other in zip(row["hooks"], chained):
        hooked["xdp_chained"] = other
    # a hook another tool changed: what it runs now, and the repair
    row["hook_changes"] = repair.hook_changes(ipr, att.dir)
    row["problems"] += [c["why"] for c in row["hook_changes"]]
    first = row["hooks"][0]
    row.update({k: first[k] for k in ("xdp_mode", "xdp_prog_id", "xdp_ours", "xdp_chained",
                                      "tc_prog_id", "tc_ours", "granularity",
                                      "granularity_why", "xdp_why")})
    row["healthy"] = not row["problems"]
    return row


def _chained(att: Attachment, cfg, slot: int, problems: list) -> dict | None:
    """The XDP program mrc_rx hands on to on devices[SLOT] ({"id", "name"}), or None."""
    if slot >= len(cfg.devices) or not cfg.devices[slot].flags & xdp_chain.CFG_XDP_CHAINED:
        return None
    other = xdp_chain.chained(att.dir, slot)
    if other is None:
        problems.append(f"the XDP program mrc_rx chained to on device {slot + 1} is gone "
                        f"from {xdp_chain.CHAIN_MAP}: that device's other traffic only passes")
    return other


SCALE_CPUS = 128     # status also says what the maps would take on a machine this big


def maps_memory(directory) -> dict:
    """The kernel memory (memlock) of the attachment's maps as the kernel
    reports it, and what the same maps would take with SCALE_CPUS CPUs
    (the per-CPU maps grow; datapath/memory.py's model says by how much).
    `kernel_bytes`: what the kernel really allocates, as its memory cgroup
    counts it: memlock leaves out the slab's rounding of the maps
    allocated as used and the LPM trie's intermediate nodes
    (memory.kernel_bytes, checked against a cgroup by tests/test_memory.py)."""
    maps = memory.measured(directory)
    cpus = bpfsys.possible_cpus()
    intermediates: dict = {}
    in_use = memory.entries_in_use(directory, intermediates)
    sizes = memory.attached_sizes(directory)        # attach --active-peers
    grow = sum(memory.model(SCALE_CPUS, in_use, sizes).values()) - sum(memory.model(cpus, in_use, sizes).values())
    total = sum(maps.values())
    # the maps allocated as used, as the kernel counts them, for their memlock
    model = memory.model(cpus, in_use, sizes)
    kernel = memory.kernel_model(cpus, in_use, intermediates, sizes)
    used_as = {s.name for s in memory.specs() if s.no_prealloc and s.name in maps}
    kernel_maps = {n: (maps[n] - model[n] + kernel[n]) if n in used_as else b for n, b in maps.items()}
    return {"bytes": total, "cpus": cpus, "maps": maps, "scaled_cpus": SCALE_CPUS,
            "scaled_bytes": total + grow, "kernel_bytes": sum(kernel_maps.values()),
            "kernel_scaled_bytes": sum(kernel_maps.values()) + grow, "kernel_maps": kernel_maps,
            "lpm_intermediates": intermediates}


def learnt_state(att: Attachment, active: int) -> dict:
    """The LRU of learnt state: how full, and what became of the peers'
    states (counters state_*, lib/peer_state.h): started, of which after
    an eviction, and could not be made."""
    counters = att.counters()
    return {"active": active, "max": att.maps["peer_state"].max_entries,
            "started": counters.get("state_new", 0), "evicted_and_remade": counters.get("state_remade", 0),
            "failed": counters.get("state_fail", 0)}


def receive_state(att: Attachment) -> dict:
    """The receiver's LRUs (lib/rx_track.h): senders (rx_peers) and
    (sender, path) pairs (rx_paths) held, of how many, how many entries
    were made (counters rx_sender_new, rx_path_new), and so how many the
    LRU evicted (made minus held: nothing else deletes them while
    attached); a sender whose entry could not be made (rx_sender_fail)."""
    counters = att.counters()
    out = {}
    for what, name, made in (("senders", "rx_peers", "rx_sender_new"), ("paths", "rx_paths", "rx_path_new")):
        m = att.maps[name]
        held, n = m.dump()[2], counters.get(made, 0)
        out[what] = {"held": held, "max": m.max_entries, "made": n, "evicted": max(0, n - held)}
    out["senders"]["failed"] = counters.get("rx_sender_fail", 0)
    return out


def _fail_open(att: Attachment, entries, active) -> list[dict]:
    """Peers whose every path is down, which the datapath sends to anyway."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out = []
    for key, peer in entries:
        state = active.get(peer.peer_id)
        since = state.tx.fail_open_ns if state is not None else 0
        if since:
            out.append({"prefix": str(paths.key_prefix(key)), "for_ms": round((now - since) / 1e6, 1)})
    return out


class _Rows:
    """Each row's learnt path state (row_state), read once."""

    def __init__(self, att: Attachment):
        self.att, self.rows = att, {}

    def __call__(self, row: int) -> layout.RowState:
        if row not in self.rows:
            self.rows[row] = paths.row_learnt(self.att, row)
        return self.rows[row]


def _path_states(att: Attachment, peers, used, active, rows: _Rows) -> dict[str, int]:
    """How many of the peers' paths are in each of MRC's states (up,
    assumed-bad, denied, unknown, skip; spare: a spare EV held back).  A peer without learnt state has never
    been acknowledged: its paths are unknown, or denied."""
    counts = {s: 0 for s in (paths.STATE_UP, paths.STATE_BAD, paths.STATE_DENIED, paths.STATE_UNKNOWN,
                             paths.STATE_SKIP, paths.STATE_SPARE)}
    for peer in peers:
        state = active.get(peer.peer_id)
        for path_id, path in used(peer):
            if state is None:
                counts[paths.STATE_DENIED if path.state == paths.DENIED else
                       paths.STATE_SPARE if path.flags & paths.SPARE else paths.STATE_UNKNOWN] += 1
            else:
                counts[paths.path_state(att, peer, path_id, path, state, rows(peer.template_id))] += 1
    return counts


def _probing(att: Attachment, cfg, peers, used, rows: _Rows) -> dict:
    """Down paths (of the rows: a template's peers share theirs) and the
    probes they cost now: each is probed once per its interval (doubling
    from probe_us to probe_max_us, lib/failover.h), and all of them
    through one first hop at most probe_budget a second.  From the
    datapath's state, not sampled: the rate the schedule gives."""
    budget = cfg.probe_budget
    per_hop: dict[int, float] = {}
    down = 0
    seen = set()
    for peer in peers:
        if peer.template_id in seen:
            continue
        seen.add(peer.template_id)
        state = rows(peer.template_id)
        for path_id, _ in used(peer):
            live = state.paths[path_id].live
            if not live.down_ns:
                continue
            down += 1
            gap_ns = (live.probe_gap_us or cfg.probe_us) * 1000
            hop = att.maps["path_fate"].lookup(paths.path_index(peer.template_id, path_id)).hop
            key = hop if hop else -(peer.template_id << 16 | path_id)    # no hop: the path alone
            per_hop[key] = per_hop.get(key, 0.0) + 1e9 / gap_ns
    rate = sum(min(r, budget) if budget else r for r in per_hop.values())
    return {"down_paths": down, "probes_per_s": round(rate, 1), "probe_us": cfg.probe_us,
            "probe_max_us": cfg.probe_max_us, "budget_per_hop_per_s": budget or None,
            "first_hops": len(per_hop)}


def _ack_windows(att: Attachment, entries, active) -> list[dict]:
    """Peers whose acknowledgement window late packets have widened past
    --ack-timeout-us (lib/failover.h): a black hole on their paths now
    takes that long to be seen."""
    base_us = att.config.ack_timeout_us
    out = []
    for key, peer in entries:
        if peer.peer_id not in active:
            continue
        acks = active[peer.peer_id].acks
        if acks.window_ns > base_us * 1000:
            out.append({"prefix": str(paths.key_prefix(key)), "window_us": acks.window_ns // 1000,
                        "ack_timeout_us": base_us})
    return out


def _hooks(ipr: IPRoute, device: str, rx_id: int, tx_id: int, problems: list,
           member: layout.Device | None = None) -> dict:
    hooked = {"device": device}
    found = ipr.link_lookup(ifname=device)
    if not found:
        hooked.update(xdp_mode=None, xdp_prog_id=0, xdp_ours=False, tc_prog_id=0, tc_ours=False,
                      granularity=None, granularity_why=None, xdp_why=None)
        problems.append(f"{device} no longer exists: `mrcctl detach` clears the pins")
        return hooked
    index = found[0]
    info = hooks.device_info(ipr, index)
    tc_id = hooks.tc_egress_prog_ids(index).get(hooks.TC_PRIO, 0)
    hooked.update(xdp_mode=info["xdp_mode"], xdp_prog_id=info["xdp_prog_id"],
                  xdp_ours=bool(rx_id) and info["xdp_prog_id"] == rx_id,
                  tc_prog_id=tc_id, tc_ours=bool(tx_id) and tc_id == tx_id,
                  **_granularity(device, member, problems))
    return hooked       # what differs is said by repair.hook_changes


def _granularity(device: str, member: layout.Device | None, problems: list) -> dict:
    """What the device sprays at, why, and why its XDP mode: the device
    record says what attach was asked for, the device what it runs."""
    from mrc_ebpf.datapath import offload
    from mrc_ebpf.datapath.loader import CFG_XDP_SKB, xdp_mode
    try:
        segs = offload.gso_max_segs(device)
    except Exception:
        return {"granularity": "unknown", "granularity_why": None, "xdp_why": None}
    names = offload.GRANULARITIES
    asked = names[member.granularity] if member is not None and member.granularity < len(names) else None
    xdp_why = None
    if asked is None:
        told = offload.describe("", segs, 0, 0)
    else:
        mbps = member.link_mbps or offload.wire_mbps(device)
        told = offload.describe(asked, segs, mbps, member.mtu)
        want = offload.choose(asked, device, member.mtu, member.link_mbps)
        if segs != want:
            told["why"] = f"gso_max_segs is {segs}, not the {want} that {asked} sets: changed outside mrcctl"
            problems.append(f"{device}: {told['why']}")
        used = "skb" if member.flags & CFG_XDP_SKB else "native"
        auto, why = xdp_mode(device, "auto")
        xdp_why = why if (auto == "skb") == (used == "skb") else f"asked for (--mode {used})"
    return {"granularity": told["what"], "granularity_why": told["why"], "xdp_why": xdp_why}
