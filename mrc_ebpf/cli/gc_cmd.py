"""`mrcctl gc`: remove state whose network namespace is gone
(mrc_ebpf/datapath/stale.py finds it).  Registered at the end of
cli/mrcctl.py; errors are MrcError (one line, exit 1)."""
from __future__ import annotations


import click

from mrc_ebpf.cli.common import emit, json_option
from mrc_ebpf.errors import MrcError


def describe(entry: dict) -> str:
    return (f"{entry['pins']} (namespace {entry['netns_cookie']} is gone): "
            f"{', '.join(entry['devices']) or 'no device'}; {entry['pin_count']} pins, "
            f"{len(entry['prog_ids'])} programs, {len(entry['map_ids'])} maps, "
            f"{entry['memlock_bytes'] / 1e6:.1f} MB locked")


@click.command()
@click.argument("cookies", metavar="[COOKIE...]", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@json_option
@click.pass_context
def gc(ctx, cookies, dry_run):
    """Remove pinned state whose network namespace is gone.

    `ip netns del` without `mrcctl detach` leaves the datapath's programs
    and maps pinned where no namespace can see them; `mrcctl status` on
    the host lists them.  COOKIE limits gc to those namespaces' state (the
    number after "ns" in the pin directory)."""
    from mrc_ebpf.datapath import journal, loader, lock, stale
    loader.require_root()
    try:
        wanted = [int(c.removeprefix("ns")) for c in cookies] or None
    except ValueError:
        raise MrcError(f"bad namespace cookie in {' '.join(cookies)}: a number, as in ns<COOKIE>")
    rolled_back = None
    if not dry_run and journal.log_path().exists():
        # a change a killed mrcctl left half-done here: rolled back, as
        # every changing verb does when it takes the lock (journal.py)
        with lock.writer(recover="no"):
            rolled_back = journal.recover()
    found = stale.find(wanted)
    if wanted:
        # a cookie that names nothing (a typo) must not read as "done"; a
        # live namespace's, or state still in use, is simply not removed
        from mrc_ebpf.datapath import pins
        unknown = sorted(c for c in set(wanted) - {e["netns_cookie"] for e in found}
                         if not (pins.BASE / f"ns{c}").exists())
        if unknown:
            unknown = sorted(set(unknown) - stale.live_cookies())
        if unknown:
            raise MrcError(f"no namespace and no pinned state with cookie "
                           f"{', '.join(map(str, unknown))} (`mrcctl gc --dry-run` lists what is stranded)")
    removed = found if dry_run else stale.remove(found)
    if not dry_run and not wanted:
        stale.remove_orphan_logs()
    emit(ctx, {"dry_run": dry_run, "removed": removed, "rolled_back": rolled_back},
         lambda r: click.echo("\n".join(
             ([f"rolled back: {rolled_back['what']}"] if rolled_back else [])
             + [f"{'would remove' if dry_run else 'removed'} {describe(entry)}" for entry in removed])
             or "nothing stranded"))
