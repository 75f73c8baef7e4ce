"""What a running fabric is (`fabric show`) and which namespace a node is (`fabric exec`)."""
from __future__ import annotations

import contextlib
from mrc_ebpf.lab import ecn_marks, faults, trims
from mrc_ebpf.errors import MrcError

from .plan import Fabric
from .state import load


def describe(name: str) -> dict:
    state = load(name)
    fab = Fabric(state["spec"])
    nodes = fab.nodes()
    live = state["status"] == "up"
    hosts = []
    for h in fab.hosts():
        hn = fab.host(h)
        hosts.append({"name": hn, "ns": fab.ns(hn), "id": f"0x{fab.host_id(h):x}", "sid": fab.host_sid(h),
                      "addr6": fab.addr6(h), "prefix6": fab.prefix6(h), "addr4": fab.addr4(h),
                      "prefix4": fab.prefix4(h),
                      "nics": [{"plane": p, "dev": f"eth{p}", "leaf": fab.leaf(p, fab.leaf_of(h)),
                                "leaf_dev": f"h{h}"} for p in range(fab.planes)],
                      "attached": state.get("attached", {}).get(hn)})
    switches = []
    for node, d in nodes.items():
        if d["kind"] == "host":
            continue
        sw = {"name": node, "kind": d["kind"], "plane": d["plane"], "index": d["index"], "ns": d["ns"]}
        if d["kind"] == "spine":
            sw["id"] = f"0x{fab.spine_id(d['plane'], d['index']):x}"
            sw["sid"] = fab.spine_sid(d["plane"], d["index"])
            sw["behavior"] = ("IPv6 router (SRv6 off)" if fab.encoding == "ev" else
                              "End" + (" next-csid lblen 32 nflen 16" if fab.encoding == "usid" else ""))
        switches.append(sw)
    queues = (ecn_marks.read(name) or {}) if live and state.get("ecn_marking") else {}
    by_end = {(d["ns"], d["dev"]): queues.get(mac) for mac, d in state.get("ecn_marking", {}).items()}
    tq = (trims.read(name) or {}) if live and state.get("trimming") else {}
    trim_by_end = {(d["ns"], d["dev"]): tq.get(mac) for mac, d in state.get("trimming", {}).items()}

    def with_marks(end: dict, other: dict) -> dict:
        """The end, with the marks its device's queue gave, sending towards other."""
        q = by_end.get((end["ns"], end["dev"]))
        t = trim_by_end.get((end["ns"], end["dev"]))
        if q is not None:
            end = dict(end, ecn={"packets": q.packets, "ect": q.ect, "marked": q.marked,
                                 "direction": f"{end['node']}>{other['node']}"})
        if t is not None:
            end = dict(end, trim={"packets": t.packets, "mrc": t.mrc, "trimmed": t.trimmed,
                                  "trimmed_bytes": t.trimmed_bytes, "untrimmable": t.untrimmable,
                                  "direction": f"{end['node']}>{other['node']}"})
        return end
    links = []
    for lk in fab.links():
        entry = {k: lk[k] for k in ("name", "kind", "plane", "rate")}
        entry["ends"] = [with_marks(lk["a"], lk["b"]), with_marks(lk["b"], lk["a"])]
        entry["faults"] = []
        for f in state.get("faults", []):
            for me, other in ((lk["a"], lk["b"]), (lk["b"], lk["a"])):
                if f["ns"] == me["ns"] and f["dev"] == me["dev"]:
                    fd = {"mode": f["mode"], "target": f["target"]}
                    if f["kind"] == "gray":
                        fd["direction"] = f"{other['node']}>{me['node']}"
                        fd["loss"] = f["loss"]
                        if live:
                            with contextlib.suppress(Exception):
                                st = faults.status(f["ns"], f["dev"])
                                if st:
                                    fd["dropped"], fd["passed"] = st.get("dropped"), st.get("passed")
                                    fd["first_drop_ns"] = st.get("first_drop_ns")
                    else:
                        fd["down_end"] = me["node"]
                    entry["faults"].append(fd)
        links.append(entry)
    pairs = []
    for a in fab.hosts():
        for b in fab.hosts():
            if a == b:
                continue
            pairs.append({"src": fab.host(a), "dst": fab.host(b), "dst_sid": fab.host_sid(b),
                          "prefix6": fab.prefix6(b), "prefix4": fab.prefix4(b),
                          "paths": [{k: v for k, v in p.items() if k != "args"} for p in fab.paths(a, b)],
                          "path_add": fab.path_add_args(a, b)})
    hashing = None
    if live:
        from .hashing import read as read_hash
        with contextlib.suppress(MrcError):
            hashing = read_hash(fab)
    return {"name": name, "status": state["status"], "hash": fab.hash,
            **{k: v for k, v in state["spec"].items() if k != "name"}, "hash_on_leaves": hashing,
            "namespaces": state["namespaces"], "hosts": hosts, "switches": switches, "links": links,
            "paths": pairs, "key_file": state.get("key_file"),
            "naming": {"links": "<spine>-<leaf> (s1-l2; plane p>0: p1s1-p1l2), <host>-<leaf> (h1-l1, "
                                "h1-p1l1); a>b is one direction (fault on b's ingress); a node name "
                                "means all its links",
                       "devices": "host eth<plane>; leaf s<spine>, h<host>; spine l<leaf>",
                       "sids": f"spine {fab.sid32}:<0x100*(plane+1)+s>::, host {fab.sid32}:<0xe000+h>::",
                       "data": f"host h: {fab.data32}:<h>::1 ({fab.data32}:<h>::/64), 198.18.<h/256>.<h%256>"}}



def node_ns(name: str, node: str) -> str:
    state = load(name)
    fab = Fabric(state["spec"])
    nodes = fab.nodes()
    if node in nodes:
        return nodes[node]["ns"]
    if node in state["namespaces"]:
        return node
    raise MrcError(f"no host or switch {node!r} in fabric {name} (hosts h1..h{fab.host_count}, "
                   f"spines s1..s{fab.spines}, leaves l1..l{fab.leaves}"
                   + (", plane p>0: p<p>s<k>, p<p>l<k>" if fab.planes > 1 else "") + ")")
