"""`mrcctl path deny` / `path allow`: the operator's say over paths.

A denied path is never used nor probed until allowed (MRC's DENIED);
registered on mrcctl's `path` group at the end of cli/mrcctl.py.
"""
from __future__ import annotations

import json

import click

from mrc_ebpf.errors import MrcError


def _emit(json_: bool, data, human) -> None:
    ctx = click.get_current_context()
    if json_ or (ctx.find_root().obj or {}).get("json"):
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        human(data)


def _run(prefix, path_ids, hop, device, deny: bool):
    from mrc_ebpf.control import paths
    from mrc_ebpf.datapath import loader
    if bool(path_ids) == bool(hop):
        raise MrcError("give PREFIX --path ID (repeatable), or --hop SID")
    if path_ids and not prefix:
        raise MrcError("--path needs the PREFIX whose paths they are")
    with loader.Attachment.open(loader.resolve_device(device)) as att:
        if hop:
            return paths.set_denied_hop(att, hop, deny, prefix)
        return [paths.set_denied(att, prefix, list(path_ids), deny)]


def _human(results):
    for r in results:
        click.echo(f"{r['prefix']}: {r['action']} {','.join(map(str, r['path_ids'])) or 'nothing'}"
                   f" ({len(r['changed'])} changed), {r['usable']} usable")


def _command(deny: bool):
    verb = "deny" if deny else "allow"

    @click.command(verb)
    @click.argument("prefix", required=False)
    @click.option("--path", "path_ids", type=click.IntRange(0, 255), multiple=True, metavar="ID",
                  help=f"{verb.capitalize()} this path of PREFIX (repeatable).")
    @click.option("--hop", metavar="SID",
                  help=f"{verb.capitalize()} every path of every peer (of PREFIX, if given) whose "
                       "segment list or uSID container crosses SID.")
    @click.option("--dev", "device", help="Device (default: the only one attached).")
    @click.option("-j", "--json", "json_", is_flag=True, help="Print JSON.")
    def cmd(prefix, path_ids, hop, device, json_):
        _emit(json_, _run(prefix, path_ids, hop, device, deny), _human)
    cmd.help = ("Deny paths: never used nor probed until allowed (state denied)." if deny else
                "Allow denied paths again; they start afresh (state unknown until acknowledged).")
    return cmd


deny = _command(True)
allow = _command(False)
