"""`mrcctl gc`: remove state whose network namespace is gone
(mrc_ebpf/datapath/stale.py finds it).  Registered at the end of
cli/mrcctl.py; errors are MrcError (one line, exit 1)."""
from __future__ import annotations

import json

import click

from mrc_ebpf.errors import MrcError


def describe(entry: dict) -> str:
    return (f"{entry['pins']} (namespace {entry['netns_cookie']} is gone): "
            f"{', '.join(entry['devices']) or 'no device'}; {entry['pin_count']} pins, "
            f"{len(entry['prog_ids'])} programs, {len(entry['map_ids'])} maps, "
            f"{entry['memlock_bytes'] / 1e6:.1f} MB locked")


@click.command()
@click.argument("cookies", metavar="[COOKIE...]", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option("-j", "--json", "json_", is_flag=True, help="Print JSON.")
def gc(cookies, dry_run, json_):
    """Remove pinned state whose network namespace is gone.

    `ip netns del` without `mrcctl detach` leaves the datapath's programs
    and maps pinned where no namespace can see them; `mrcctl status` on
    the host lists them.  COOKIE limits gc to those namespaces' state (the
    number after "ns" in the pin directory)."""
    from mrc_ebpf.datapath import loader, stale
    loader.require_root()
    try:
        wanted = [int(c.removeprefix("ns")) for c in cookies] or None
    except ValueError:
        raise MrcError(f"bad namespace cookie in {' '.join(cookies)}: a number, as in ns<COOKIE>")
    found = stale.find(wanted)
    removed = found if dry_run else stale.remove(found)
    ctx = click.get_current_context()
    if json_ or (ctx.obj or {}).get("json"):
        click.echo(json.dumps({"dry_run": dry_run, "removed": removed}, indent=2, sort_keys=True))
        return
    if not removed:
        click.echo("nothing stranded")
    for entry in removed:
        click.echo(f"{'would remove' if dry_run else 'removed'} {describe(entry)}")
