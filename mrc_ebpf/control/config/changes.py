"""The changes a plan is made of: one small dataclass a kind, each with
its own `describe()` (one line, for people), `public()` (what `apply -j`
shows: the kind as "what" and "action", then the fields) and
`apply(att, config)` (make it on an attachment opened for a change).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from mrc_ebpf.control import blocks, bulk, classes, paths, templates
from mrc_ebpf.control.config.state import read_applied, write_applied
from mrc_ebpf.control.config.schema import (DEFAULT_POLICY, GRANULARITIES, Config, ConfigError, attrs,
                                            count, effective_metrics, expand, ident)
from mrc_ebpf.datapath import auth, layout, offload
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.errors import MrcError

# a field JSON leaves out (bookkeeping: where in the file a change came from)
HIDDEN = {"hidden": True}


@dataclasses.dataclass
class Change:
    what: ClassVar[str]                 # "what" and "action" as JSON shows them
    action: ClassVar[str | None] = None

    def __init_subclass__(cls, what: str | None = None, action: str | None = None, **kw):
        super().__init_subclass__(**kw)
        if what is not None:
            cls.what, cls.action = what, action

    def describe(self) -> str:
        raise NotImplementedError

    def apply(self, att: Attachment, config: Config) -> None:
        raise NotImplementedError

    def line(self, config: Config) -> int | None:
        """The line of the config file this change comes from, if any."""
        return None

    def public(self) -> dict[str, Any]:
        """The change as JSON shows it: its kind, then its fields (a field
        named from_ shows as "from"), without the bookkeeping."""
        out: dict[str, Any] = {"what": self.what}
        if self.action is not None:
            out["action"] = self.action
        for f in dataclasses.fields(self):
            if not f.metadata.get("hidden"):
                out[f.name.rstrip("_")] = getattr(self, f.name)
        return out


# ---- the attach section --------------------------------------------------------

@dataclasses.dataclass
class Hook(Change, what="hook"):
    """A hook another tool took our program off (xdp-loader unload, tc
    filter del), put back (datapath/repair.py) when apply runs."""
    key: str
    device: str
    from_: Any
    to: Any
    why: str = ""
    done: Any = None

    def describe(self) -> str:
        return f"{self.device} {self.key}: {self.done or 'would put ' + str(self.to) + ' back'}"

    def apply(self, att: Attachment, config: Config) -> None:
        raise MrcError("a hook is put back by config.apply (hooks_back), not by execute")



@dataclasses.dataclass
class Attach(Change, what="attach"):
    """A fresh attach (apply makes it, before the rest of the plan)."""
    key: str = "attach"
    from_: None = None
    to: str = ""

    def describe(self) -> str:
        return f"attach {self.to}"

    def apply(self, att: Attachment, config: Config) -> None:
        raise MrcError("a fresh attach is made by config.apply, not by execute")


@dataclasses.dataclass
class Reattach(Change, what="attach"):
    """Detach and attach again: what cannot change in place differs."""
    key: str = "reattach"
    from_: list = dataclasses.field(default_factory=list)
    to: list = dataclasses.field(default_factory=list)
    reasons: list = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        return f"re-attach: {'; '.join(self.reasons)}"

    def apply(self, att: Attachment, config: Config) -> None:
        raise MrcError("a re-attach is made by config.apply, not by execute")


@dataclasses.dataclass
class SetAttach(Change, what="attach"):
    """One attach setting changed in place; `apply` sets what the file says."""
    key: str
    from_: Any
    to: Any

    def describe(self) -> str:
        return f"attach {self.key}: {self.from_} -> {self.to}"


@dataclasses.dataclass
class SetConfigField(SetAttach):
    """A timer or setting of struct mrc_config (the config map)."""

    def apply(self, att: Attachment, config: Config) -> None:
        cfg = att.config
        setattr(cfg, self.key, int(config.data["attach"][self.key]))
        att.maps["config"].update(layout.Index(0), cfg)


@dataclasses.dataclass
class SetGranularity(SetAttach):
    """granularity or link_rate_mbps: each device's gso_max_segs again,
    and the record of what was asked for."""

    def apply(self, att: Attachment, config: Config) -> None:
        want = config.data["attach"]
        cfg = att.config
        name = want["granularity"]
        rate = want.get("link_rate_mbps", 0)
        for i, device in enumerate(att.device_names()):
            target = offload.choose(name, device, cfg.devices[i].mtu, rate)
            before = offload.gso_max_segs(device)
            if before == target:
                continue
            if att.journal is not None:
                att.journal.before_write(f"gso_max_segs {device}")
                att.journal.record_gso(device, before)
            offload.set_gso_max_segs(device, target)
        for i in range(cfg.n_devices):
            cfg.devices[i].granularity = GRANULARITIES.index(name)
            cfg.devices[i].link_mbps = rate
        att.maps["config"].update(layout.Index(0), cfg)


@dataclasses.dataclass
class SetKey(SetAttach):
    """key_file: sign with the file's key (the epoch kept), or with none."""

    def apply(self, att: Attachment, config: Config) -> None:
        key_file = config.data["attach"].get("key_file")
        value = auth.read(att)
        new = layout.Auth(epoch=value.epoch)
        if key_file:
            new = auth.initial(auth.read_key(key_file))
            new.epoch = value.epoch
        auth.write(att, new)
        write_applied(att, {**read_applied(att), "key_file": key_file})


@dataclasses.dataclass
class SetMode(SetAttach):
    """mode, the XDP mode in effect unchanged: only what is recorded."""

    def apply(self, att: Attachment, config: Config) -> None:
        write_applied(att, {**read_applied(att), "mode": config.data["attach"]["mode"]})


# ---- classes -------------------------------------------------------------------

@dataclasses.dataclass
class SetClass(Change, what="class", action="set"):
    name: str
    dscp: list
    from_: list | None

    def describe(self) -> str:
        return f"class {self.name}: DSCP {','.join(map(str, self.dscp))}"

    def apply(self, att: Attachment, config: Config) -> None:
        classes.set_class(att, self.name, ",".join(map(str, self.dscp)))


@dataclasses.dataclass
class DeleteClass(Change, what="class", action="delete"):
    name: str

    def describe(self) -> str:
        return f"class {self.name}: deleted"

    def apply(self, att: Attachment, config: Config) -> None:
        delete_class(att, self.name)


def delete_class(att: Attachment, name: str) -> None:
    """Remove class NAME: its DSCP values go back to the default class;
    refused while a path is reserved for it."""
    tclass = classes.class_id(att, name)
    users = [(p["prefix"], r["path_id"]) for p in paths.configured(att) for r in p["paths"]
             if r["class"] == name]
    if users:
        raise MrcError(f"class {name} is used by {users[0][0]} path {users[0][1]}")
    table = att.maps["dscp_class"]
    for d in range(64):
        if table.lookup(layout.Index(d)).value == tclass:
            table.update(layout.Index(d), layout.u32(0))
    att.maps["class_names"].update(layout.Index(tclass), layout.ClassName())


# ---- peers and their paths ---------------------------------------------------------

@dataclasses.dataclass
class PeerChange(Change):
    """A change to one peer: its errors name the peer's (or the path's) line."""
    prefix: str

    def index(self) -> int | None:
        return None

    def line(self, config: Config) -> int | None:
        return config.lines.get((self.prefix, self.index())) or config.lines.get((self.prefix,))


@dataclasses.dataclass
class DeletePeer(PeerChange, what="peer", action="delete"):

    def describe(self) -> str:
        return f"peer {self.prefix}: deleted"

    def apply(self, att: Attachment, config: Config) -> None:
        paths.delete(att, self.prefix)


@dataclasses.dataclass
class AddPeer(PeerChange, what="peer", action="add"):
    peer: dict

    def describe(self) -> str:
        n = sum(count(e) for e in self.peer["paths"])
        return f"peer {self.prefix}: added with {n} paths"

    def apply(self, att: Attachment, config: Config) -> None:
        items = expand(self.peer["paths"])
        add_paths(att, self.peer["prefix"], [i["entry"] for i in items],
                  metrics=self.peer.get("route_metrics", {}))
        if self.peer["policy"] != DEFAULT_POLICY:
            paths.set_policy(att, self.peer["prefix"], self.peer["policy"])


@dataclasses.dataclass
class AddPaths(PeerChange, what="path", action="add"):
    entries: list
    indexes: list = dataclasses.field(default_factory=list, metadata=HIDDEN)

    def index(self) -> int | None:
        return (self.indexes or [None])[0]

    def describe(self) -> str:
        return f"{self.prefix}: {len(self.entries)} paths added"

    def apply(self, att: Attachment, config: Config) -> None:
        add_paths(att, self.prefix, self.entries)


@dataclasses.dataclass
class ChangePath(PeerChange, what="path", action="change"):
    path_id: int
    entry: dict
    from_: dict
    index_: int | None = dataclasses.field(default=None, metadata=HIDDEN)

    def index(self) -> int | None:
        return self.index_

    def describe(self) -> str:
        w, c, d = attrs(self.entry)
        return f"{self.prefix} path {self.path_id}: weight {w}, class {c}{', denied' if d else ''}"

    def apply(self, att: Attachment, config: Config) -> None:
        weight, tclass, denied = attrs(self.entry)
        paths.set_attrs(att, self.prefix, self.path_id, weight, classes.class_id(att, tclass))
        if denied != bool(self.from_.get("denied")):
            paths.set_denied(att, self.prefix, [self.path_id], denied)


@dataclasses.dataclass
class DeletePath(PeerChange, what="path", action="delete"):
    path_id: int
    entry: dict

    def describe(self) -> str:
        return f"{self.prefix} path {self.path_id}: deleted"

    def apply(self, att: Attachment, config: Config) -> None:
        paths.delete(att, self.prefix, self.path_id)


@dataclasses.dataclass
class SetPolicy(PeerChange, what="policy"):
    from_: str
    to: str

    def describe(self) -> str:
        return f"{self.prefix}: policy {self.from_} -> {self.to}"

    def apply(self, att: Attachment, config: Config) -> None:
        paths.set_policy(att, self.prefix, self.to)


@dataclasses.dataclass
class SetRouteMetrics(PeerChange, what="route_metrics"):
    from_: dict
    to: dict

    def describe(self) -> str:
        return f"{self.prefix}: route metrics {self.from_ or 'defaults'} -> {self.to or 'defaults'}"

    def apply(self, att: Attachment, config: Config) -> None:
        paths.set_route_metrics(att, self.prefix, effective_metrics(self.to))


def add_paths(att: Attachment, prefix: str, entries: list[dict], metrics: dict | None = None) -> None:
    """Add paths in the order given (a fresh peer's ids follow it); runs of
    one weight and class go in one `paths.add`."""
    start = 0
    first = True
    while start < len(entries):
        attributes = attrs(entries[start])[:2]
        end = start
        while end < len(entries) and attrs(entries[end])[:2] == attributes and \
                ident(entries[end])[0] == ident(entries[start])[0] and \
                entries[end].get("sid") == entries[start].get("sid") and \
                bool(entries[end].get("spare")) == bool(entries[start].get("spare")):
            end += 1
        run = entries[start:end]
        weight, tclass = attributes
        tclass_name = None if tclass == classes.DEFAULT else tclass
        extra = []
        if first and metrics is not None:
            extra = [f"{k}={v}" for k, v in metrics.items()]
        if "entropy" in run[0]:
            results = _add_entropy(att, prefix, run[0]["sid"], len(run), weight, tclass_name, extra,
                                   spare=bool(run[0].get("spare")))
        else:
            # one kind per run: paths.add numbers its vias before its usids
            results = paths.add(att, prefix, [",".join(e["via"]) for e in run if "via" in e],
                                weight, tclass_name, [e["usid"] for e in run if "usid" in e],
                                route_metrics_=extra)
        denied = [r["path_id"] for r, e in zip(results, run) if e.get("denied")]
        if denied:
            paths.set_denied(att, prefix, denied, True)
        first = False
        start = end


def _add_entropy(att, prefix, sid, count, weight, tclass_name, extra, spare: bool = False) -> list[dict]:
    """COUNT more entropy paths (spares, with SPARE) to SID: paths.add
    counts the EVs and spares the peer has to it already, so ask for those
    plus COUNT, with their weight and class; the new ones then get theirs."""
    rows = next((p["paths"] for p in paths.configured(att) if p["prefix"] == prefix), [])
    evs = [r for r in rows if r["encoding"] == "entropy" and r["peer_sid"] == sid]
    existing = [r for r in evs if r["spare"] == spare]
    have = {(r["weight"], r["class"]) for r in existing}
    if len(have) > 1:
        raise MrcError(f"cannot add entropy paths to {sid} while its {len(existing)} running ones "
                       f"differ in weight or class: change those first")
    base_weight, base_class = have.pop() if have else (weight, tclass_name or classes.DEFAULT)
    if spare:
        results = paths.add(att, prefix, [], base_weight,
                            None if base_class == classes.DEFAULT else base_class, [],
                            len(evs) - len(existing), sid, extra, spare=len(existing) + count)
    else:
        results = paths.add(att, prefix, [], base_weight,
                            None if base_class == classes.DEFAULT else base_class, [],
                            len(existing) + count, sid, extra)
    new = [r for r in results if not r["existed"]]
    tclass = classes.class_id(att, tclass_name) if tclass_name else 0
    if (base_weight, base_class) != (weight, tclass_name or classes.DEFAULT):
        for r in new:
            paths.set_attrs(att, prefix, r["path_id"], weight, tclass)
    return new


# ---- templates and their peers ---------------------------------------------------------

@dataclasses.dataclass
class AddTemplate(Change, what="template", action="add"):
    name: str
    template: dict

    def describe(self) -> str:
        return f"template {self.name}: added with {len(self.template['paths'])} paths"

    def apply(self, att: Attachment, config: Config) -> None:
        add_template_paths(att, self.name, self.template["paths"])
        if self.template["policy"] != DEFAULT_POLICY:
            templates.set_policy(att, self.name, self.template["policy"])


@dataclasses.dataclass
class DeleteTemplate(Change, what="template", action="delete"):
    name: str

    def describe(self) -> str:
        return f"template {self.name}: deleted"

    def apply(self, att: Attachment, config: Config) -> None:
        templates.delete(att, self.name)


@dataclasses.dataclass
class AddTemplatePaths(Change, what="template_path", action="add"):
    name: str
    entries: list

    def describe(self) -> str:
        return f"template {self.name}: {len(self.entries)} paths added"

    def apply(self, att: Attachment, config: Config) -> None:
        add_template_paths(att, self.name, self.entries)


def _template_path_ids(att: Attachment, name: str) -> dict[tuple, int]:
    """A template's running path ids by their hops: its ids are its paths'
    positions only while none was removed, so changes name paths by hops."""
    return {tuple(templates.path_vias(p)): i for i, p in templates.paths_of(att, name)}


@dataclasses.dataclass
class ChangeTemplatePath(Change, what="template_path", action="change"):
    name: str
    entry: dict
    from_: dict

    def describe(self) -> str:
        w, c, _ = attrs(self.entry)
        return f"template {self.name} path via {','.join(self.entry['via'])}: weight {w}, class {c}"

    def apply(self, att: Attachment, config: Config) -> None:
        weight, tclass, _ = attrs(self.entry)
        path_id = _template_path_ids(att, self.name)[tuple(self.entry["via"])]
        templates.set_path_attrs(att, self.name, path_id, weight, classes.class_id(att, tclass))


@dataclasses.dataclass
class ReplaceTemplatePaths(Change, what="template_path", action="replace"):
    """Paths of a template with no free slot changed: each new path is
    written into an old one's slot (templates.replace_paths), not added
    before the old one is deleted."""
    name: str
    pairs: list             # [{"from": old entry, "to": new entry}]

    def describe(self) -> str:
        return (f"template {self.name}: {len(self.pairs)} paths replaced in place (no free slot): "
                + "; ".join(f"via {','.join(p['from']['via'])} -> {','.join(p['to']['via'])}"
                            for p in self.pairs[:4]) + ("; ..." if len(self.pairs) > 4 else ""))

    def apply(self, att: Attachment, config: Config) -> None:
        by_via = _template_path_ids(att, self.name)
        changes = []
        for p in self.pairs:
            weight, tclass, _ = attrs(p["to"])
            changes.append((by_via[tuple(p["from"]["via"])], ",".join(p["to"]["via"]), weight,
                            classes.class_id(att, tclass)))
        templates.replace_paths(att, self.name, changes)


@dataclasses.dataclass
class DeleteTemplatePaths(Change, what="template_path", action="delete"):
    name: str
    entries: list

    def describe(self) -> str:
        return f"template {self.name}: {len(self.entries)} paths deleted"

    def apply(self, att: Attachment, config: Config) -> None:
        by_via = _template_path_ids(att, self.name)
        templates.remove_paths(att, self.name, [by_via[tuple(e["via"])] for e in self.entries])


@dataclasses.dataclass
class SetTemplatePolicy(Change, what="template_policy"):
    name: str
    from_: str
    to: str

    def describe(self) -> str:
        return f"template {self.name}: policy {self.from_} -> {self.to}"

    def apply(self, att: Attachment, config: Config) -> None:
        templates.set_policy(att, self.name, self.to)


@dataclasses.dataclass
class SyncPeerBlocks(Change, what="peer_blocks"):
    """All template peers at once (bulk.sync): how many are added,
    changed (template or SID) and removed."""
    added: int
    updated: int
    removed: int
    blocks: int

    def describe(self) -> str:
        return (f"template peers: {self.added} added, {self.updated} changed, "
                f"{self.removed} removed ({self.blocks} blocks)")

    def apply(self, att: Attachment, config: Config) -> None:
        tpls = {}
        wanted = []
        for key, sid, name in blocks.wanted(config.data.get("peer_blocks", [])):
            tpl = tpls.get(name)
            if tpl is None:
                tpl = tpls[name] = templates.get(att, name)
            wanted.append((key, sid, tpl))
        try:
            bulk.sync(att, wanted, remove_missing=True)
        except MrcError as e:
            line = config.lines.get(("peer_blocks",))
            raise ConfigError(f"{config.source}:{line}: {e}" if line else str(e)) from e


def add_template_paths(att: Attachment, name: str, entries: list[dict]) -> None:
    """templates.add per run of one weight and class, in the order given."""
    start = 0
    while start < len(entries):
        attributes = attrs(entries[start])[:2]
        end = start
        while end < len(entries) and attrs(entries[end])[:2] == attributes:
            end += 1
        weight, tclass = attributes
        templates.add(att, name, [",".join(e["via"]) for e in entries[start:end]], weight,
                      None if tclass == classes.DEFAULT else tclass)
        start = end
