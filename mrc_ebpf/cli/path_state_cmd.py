"""`mrcctl path deny` / `path allow`: the operator's say over paths.

A denied path is never used nor probed until allowed (MRC's DENIED);
registered on mrcctl's `path` group at the end of cli/mrcctl.py.
"""
from __future__ import annotations

import click

from mrc_ebpf.cli.common import attached, dev_option, emit, exact_prefix, json_option
from mrc_ebpf.errors import MrcError


def _run(prefix, path_ids, hop, device, deny: bool):
    from mrc_ebpf.control import paths
    if bool(path_ids) == bool(hop):
        raise MrcError("give PREFIX --path ID (repeatable), or --hop SID")
    if path_ids and not prefix:
        raise MrcError("--path needs the PREFIX whose paths they are")
    with attached(device, change=True) as att:
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
    @click.argument("prefix", required=False, callback=exact_prefix)
    @click.option("--path", "path_ids", type=click.IntRange(0, 255), multiple=True, metavar="ID",
                  help=f"{verb.capitalize()} this path of PREFIX (repeatable).")
    @click.option("--hop", metavar="SID",
                  help=f"{verb.capitalize()} every path of every peer (of PREFIX, if given) whose "
                       "segment list or uSID container crosses SID.")
    @dev_option
    @json_option
    @click.pass_context
    def cmd(ctx, prefix, path_ids, hop, device):
        emit(ctx, _run(prefix, path_ids, hop, device, deny), _human)
    cmd.help = ("Deny paths: never used nor probed until allowed (state denied)." if deny else
                "Allow denied paths again; they start afresh (state unknown until acknowledged).")
    return cmd


deny = _command(True)
allow = _command(False)
