"""The plan: the changes, in the order they are to be made, that turn the
running config into the wanted one.  Paths are matched by what they are
(segments, uSID container, the k-th entropy path to a SID), never by
position, so an unchanged path keeps its id, sequence numbers and
counters.
"""
from __future__ import annotations

from mrc_ebpf.control import blocks, paths
from mrc_ebpf.control.config import changes as ch
from mrc_ebpf.control.config.state import signing_key
from mrc_ebpf.control.config.schema import SETTING_RANGES, TIMER_RANGES, attrs, expand, ident
from mrc_ebpf.datapath import auth
from mrc_ebpf.datapath.loader import Attachment

# How each attach setting is changed in place, in the order a plan makes them
# (key_file and mode follow: they are compared otherwise).
ATTACH_CHANGES: dict[str, type[ch.SetAttach]] = {
    **{key: ch.SetConfigField for key in (*TIMER_RANGES, "retrans_steer", "shared_fate", "min_active",
                                           *SETTING_RANGES)},
    "granularity": ch.SetGranularity, "link_rate_mbps": ch.SetGranularity,
}


def reattach_reasons(desired: dict, current: dict, mode_used: str) -> list[str]:
    want, have = desired["attach"], current["attach"]
    reasons = []
    if want["devices"] != have["devices"]:
        reasons.append(f"devices {' '.join(have['devices'])} -> {' '.join(want['devices'])}")
    if want["sid"] != have["sid"]:
        reasons.append(f"sid {have['sid']} -> {want['sid']}")
    if want["mode"] != "auto" and want["mode"] != mode_used:
        reasons.append(f"XDP mode {mode_used} -> {want['mode']}")
    return reasons


def plan(desired: dict, current: dict, att: Attachment | None,
         ids: dict[str, list[int]] | None = None) -> list[ch.Change]:
    """The changes, in the order they are to be made, that turn CURRENT
    (running) into DESIRED; [] when they are the same.  ATT None: nothing
    is attached yet (CURRENT is DESIRED's attach section alone)."""
    changes: list[ch.Change] = []
    want, have = desired["attach"], current["attach"]
    for key, kind in ATTACH_CHANGES.items():
        if want.get(key, 0) != have.get(key, 0):
            changes.append(kind(key, have.get(key, 0), want.get(key, 0)))
    if want.get("key_file") != have.get("key_file") or \
            (att is not None and _key_differs(att, want.get("key_file"))):
        changes.append(ch.SetKey("key_file", have.get("key_file"), want.get("key_file")))
    if want["mode"] != have["mode"]:    # the same XDP mode in effect: only what is recorded
        changes.append(ch.SetMode("mode", have["mode"], want["mode"]))

    have_classes = {c["name"]: c["dscp"] for c in current.get("classes", [])}
    want_classes = {c["name"]: c["dscp"] for c in desired.get("classes", [])}
    for name, dscp in want_classes.items():
        if have_classes.get(name) != dscp:
            changes.append(ch.SetClass(name, dscp, have_classes.get(name)))

    have_peers = {p["prefix"]: p for p in current.get("peers", [])}
    want_peers = {p["prefix"]: p for p in desired.get("peers", [])}
    for prefix in have_peers:
        if prefix not in want_peers:
            changes.append(ch.DeletePeer(prefix))
    if ids is None and att is not None:
        ids = {p["prefix"]: [r["path_id"] for r in p["paths"]] for p in paths.configured(att)}
    have_tpls = {t["name"]: t for t in current.get("templates", [])}
    want_tpls = {t["name"]: t for t in desired.get("templates", [])}
    for name, tpl in want_tpls.items():
        changes += _plan_template(tpl, have_tpls.get(name))
    # template peers after their templates, before own-path peers are
    # added (a prefix moving from a block to peers: leaves the block first)
    blocks_change = _plan_blocks(desired.get("peer_blocks", []), current.get("peer_blocks", []))
    if blocks_change:
        changes.append(blocks_change)
    for prefix, peer in want_peers.items():
        if prefix not in have_peers:
            changes.append(ch.AddPeer(prefix, peer))
            continue
        changes += _plan_peer(peer, have_peers[prefix], ids[prefix])
    for name in have_tpls:
        if name not in want_tpls:
            changes.append(ch.DeleteTemplate(name))

    for name in have_classes:
        if name not in want_classes:
            changes.append(ch.DeleteClass(name))
    return changes


def _plan_template(want: dict, have: dict | None) -> list[ch.Change]:
    """A template's changes: made, paths added, changed, deleted (by what
    they are, so a kept path keeps its id), its policy."""
    name = want["name"]
    if have is None:
        return [ch.AddTemplate(name, want)]
    changes: list[ch.Change] = []
    have_ids = {tuple(e["via"]): i for i, e in enumerate(have["paths"])}
    # a template's path ids are its running paths' positions only while
    # none was removed: plan by identity, and let the change resolve ids
    adds = [e for e in want["paths"] if tuple(e["via"]) not in have_ids]
    keep = {tuple(e["via"]) for e in want["paths"]}
    deletes = [e for e in have["paths"] if tuple(e["via"]) not in keep]
    replaces = []
    if adds and deletes and len(have["paths"]) + len(adds) > paths.MAX_PATHS:
        # no free slot to add before deleting: the new paths go into the
        # old ones' slots, in place (templates.replace_paths)
        n = min(len(adds), len(deletes))
        replaces = [{"from": old, "to": new} for old, new in zip(deletes[:n], adds[:n])]
        adds, deletes = adds[n:], deletes[n:]
    for e in want["paths"]:
        i = have_ids.get(tuple(e["via"]))
        if i is not None and attrs(e)[:2] != attrs(have["paths"][i])[:2]:
            changes.append(ch.ChangeTemplatePath(name, e, have["paths"][i]))
    if adds:
        changes.insert(0, ch.AddTemplatePaths(name, adds))
    if replaces:
        changes.insert(0, ch.ReplaceTemplatePaths(name, replaces))
    if deletes:
        changes.append(ch.DeleteTemplatePaths(name, deletes))
    if want["policy"] != have["policy"]:
        changes.append(ch.SetTemplatePolicy(name, have["policy"], want["policy"]))
    return changes


def _plan_blocks(want: list[dict], have: list[dict]) -> ch.SyncPeerBlocks | None:
    """One change for all template peers: how many are added, changed
    (template or SID) and removed."""
    if want == have:
        return None
    if not have:
        return ch.SyncPeerBlocks(sum(b.get("count", 1) for b in want), 0, 0, len(want))
    have_peers = {key: (sid, tname) for key, sid, tname in blocks.wanted(have)}
    added = updated = 0
    for key, sid, tname in blocks.wanted(want):
        old = have_peers.pop(key, None)
        if old is None:
            added += 1
        elif old != (sid, tname):
            updated += 1
    return ch.SyncPeerBlocks(added, updated, len(have_peers), len(want))


def _key_differs(att: Attachment, key_file: str | None) -> bool:
    have = signing_key(att)
    if key_file is None:
        return have is not None
    want = auth.auth_key(auth.read_key(key_file))
    return have is None or (have.k0, have.k1) != (want.k0, want.k1)


def _plan_peer(want: dict, have: dict, ids: list[int]) -> list[ch.Change]:
    prefix = want["prefix"]
    running_items = expand(have["paths"])
    assert len(running_items) == len(ids)
    for item, path_id in zip(running_items, ids):
        item["id"] = path_id
    by_ident: dict = {}
    for item in running_items:
        by_ident.setdefault(ident(item["entry"]), []).append(item)
    adds, modifies, matched = [], [], set()
    for item in expand(want["paths"]):
        candidates = by_ident.get(ident(item["entry"]))
        if candidates:
            old = candidates.pop(0)     # entropy: the k-th to a SID is the k-th running one
            matched.add(old["id"])
            if attrs(old["entry"]) != attrs(item["entry"]):
                modifies.append(ch.ChangePath(prefix, old["id"], item["entry"], old["entry"], item["index"]))
        else:
            adds.append(item)
    deletes: list[ch.Change] = [ch.DeletePath(prefix, item["id"], item["entry"])
                                for item in running_items if item["id"] not in matched]
    add: list[ch.Change] = [ch.AddPaths(prefix, [a["entry"] for a in adds],
                                        [a["index"] for a in adds])] if adds else []
    # Deleting first lets the new paths take the freed ids (the file's
    # order stays the ids' order); while the peer keeps a path, its
    # packets go on the others meanwhile.  A peer that keeps none gets its
    # new paths first, so it is never without one (nor its route removed).
    changes = deletes + add if matched else add + deletes
    changes += modifies
    if want["policy"] != have["policy"]:
        changes.append(ch.SetPolicy(prefix, have["policy"], want["policy"]))
    if want.get("route_metrics", {}) != have.get("route_metrics", {}):
        changes.append(ch.SetRouteMetrics(prefix, have.get("route_metrics", {}), want.get("route_metrics", {})))
    return changes
