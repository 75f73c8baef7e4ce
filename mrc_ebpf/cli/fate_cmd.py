"""`mrcctl shared-fate [on|off]`: shared fate's switch and its hops
(bpf/lib/shared_fate.h); registered at the end of cli/mrcctl.py."""
from __future__ import annotations

import click

from mrc_ebpf.cli.common import attached, dev_option, emit, json_option


def _human(r):
    click.echo(f"shared fate {'on' if r['shared_fate'] else 'off'}; {len(r['hops'])} first hops")
    for h in r["hops"]:
        click.echo(f"  hop {h['hop']:3d} {h['sid']:<28} suspect {h['suspects']} times "
                   f"({h['watch_suspects']} by its watch), "
                   f"{h['shared_downs']} paths out by probe")


@click.command("shared-fate")
@click.argument("switch", required=False, type=click.Choice(["on", "off"]))
@dev_option
@json_option
@click.pass_context
def shared_fate(ctx, switch, device):
    """Show (or turn on/off) shared fate: two paths taken out through one
    first hop make it suspect, and every other path through that hop is
    tested at once by a probe copy and taken out if it goes unanswered."""
    from mrc_ebpf.control import shared_fate as sf
    from mrc_ebpf.datapath import layout
    with attached(device, change=switch is not None) as att:
        cfg = att.config
        if switch is not None:
            cfg.shared_fate = int(switch == "on")
            att.maps["config"].update(layout.Index(0), cfg)
        result = {"shared_fate": bool(cfg.shared_fate), "hops": sf.hops(att)}
    emit(ctx, result, _human)
