"""Carrying a plan out: `execute` makes a plan's changes on an attachment
opened for a change (the caller's transaction rolls it back on failure);
`apply` makes the attachment a config describes equal to it, attaching,
changing in place or re-attaching.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.control.config import changes as ch
from mrc_ebpf.control.config.planner import plan, reattach_reasons
from mrc_ebpf.control.config.state import UNRECORDED_KEY, running_with_ids, used_mode, write_applied
from mrc_ebpf.control.config.schema import SETTING_RANGES, TIMER_RANGES, VERSION, Config, ConfigError
from mrc_ebpf.datapath import journal, loader, lock, pins
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.errors import MrcError


def execute(att: Attachment, config: Config, changes: list[ch.Change]) -> None:
    """Make CHANGES on ATT (opened for a change: its transaction undoes
    them all if one fails).  Paths are added before any is deleted, so a
    peer is never without the paths it keeps."""
    for c in changes:
        try:
            c.apply(att, config)
        except ConfigError:
            raise
        except MrcError as e:
            line = c.line(config)
            raise MrcError(f"{config.source}:{line}: {e}" if line else str(e)) from e


@dataclasses.dataclass
class Applied:
    """What `apply` did (or, dry, would do)."""
    device: str
    file: str
    attached: bool
    reattached: bool
    dry_run: bool
    changed: bool
    changes: list[ch.Change]

    def public(self) -> dict:
        """As `apply -j` shows it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "changes"} | \
            {"changes": [c.public() for c in self.changes]}


def _hooks_back(att, dry_run: bool) -> list[ch.Change]:
    """The hooks another tool took the programs off (xdp-loader unload,
    tc filter del): put back (datapath/repair.py), as changes."""
    from pyroute2 import IPRoute
    from mrc_ebpf.datapath import repair
    with IPRoute() as ipr:
        gone = repair.hook_changes(ipr, att.dir)
        for c in gone:
            c["done"] = None if dry_run else repair.restore(ipr, att.dir, c)
    return [ch.Hook(key=c["hook"], device=c["device"], from_=c["found"], to=c["expected"],
                    why=c["why"], done=c["done"]) for c in gone]


def apply(cfg: Config, reattach: bool = False, dry_run: bool = False) -> Applied:
    """Make the attachment CFG describes equal to it: attach it if it is
    not, change in place what differs, re-attach (with REATTACH) when the
    devices, SID or XDP mode differ.  All or nothing: a failure undoes
    every change (a fresh attach is detached again)."""
    loader.require_root()
    pins.ensure_bpffs()
    want = cfg.data["attach"]
    first = want["devices"][0]
    owner = loader.owner(first)
    if owner is None:
        changes: list[ch.Change] = [ch.Attach(to=" ".join(want["devices"]))]
        changes += plan(cfg.data, {"version": VERSION, "attach": want}, None)
        if not dry_run:
            # one change under one lock: killed anywhere, the next command
            # detaches what it made (journal.py)
            with lock.writer(), journal.logged() as log:
                log.append({"op": "detach", "device": first})
                _fresh(cfg)
        return Applied(first, cfg.source, True, False, dry_run, True, changes)
    with loader.changing(owner) as att:
        current, ids = running_with_ids(att, key_hint=True)
        reasons = reattach_reasons(cfg.data, current, used_mode(att))
        if not reasons:
            changes = plan(cfg.data, current, att, ids)
            if not dry_run:
                execute(att, cfg, changes)
            changes += _hooks_back(att, dry_run)
            return Applied(owner, cfg.source, False, False, dry_run, bool(changes), changes)
    if not reattach:
        raise MrcError(f"{owner}: {'; '.join(reasons)}: that needs a re-attach (the programs are "
                       f"reloaded, every path's sequence numbers and counters start over, and "
                       f"traffic stops while they compile): run apply with --reattach")
    changes = [ch.Reattach(from_=current["attach"]["devices"], to=want["devices"], reasons=reasons)]
    changes += plan(cfg.data, {"version": VERSION, "attach": want}, None)
    if dry_run:
        return Applied(first, cfg.source, False, True, dry_run, True, changes)
    if current["attach"].get("key_file") == UNRECORDED_KEY:
        raise MrcError(f"{owner} signs with a key whose file was not recorded: cannot restore it "
                       f"if the re-attach fails; `mrcctl detach {owner}` first")
    loader.detach(owner)
    try:
        _fresh(cfg)
    except MrcError as e:
        try:
            _fresh(Config(current, "the previous config", {}))
        except MrcError as again:
            raise MrcError(f"{e}; restoring the previous config failed too: {again}")
        raise MrcError(f"{e}; the previous config was attached again")
    return Applied(first, cfg.source, False, True, dry_run, True, changes)


def _fresh(cfg: Config) -> None:
    """Attach as CFG says and configure everything; detached again on failure."""
    want = cfg.data["attach"]
    loader.attach(want["devices"], want["sid"], want["mode"], want["granularity"],
                  link_rate_mbps=want.get("link_rate_mbps", 0), retrans_steer=want["retrans_steer"],
                  min_active=want["min_active"], shared_fate=want["shared_fate"],
                  key_file=want.get("key_file"), **{k: want[k] for k in (*TIMER_RANGES, *SETTING_RANGES)})
    first = want["devices"][0]
    try:
        with loader.changing(first) as att:
            write_applied(att, {"mode": want["mode"], "key_file": want.get("key_file")})
            current, ids = running_with_ids(att)
            execute(att, cfg, plan(cfg.data, current, att, ids))
    except BaseException:
        loader.detach(first)
        raise
