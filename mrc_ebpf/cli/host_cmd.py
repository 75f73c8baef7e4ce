"""`mrcctl tune-host`: the host-wide TCP settings a route cannot carry
(mrc_ebpf/control/host_tcp.py), shown, applied or restored on request.
Registered at the end of cli/mrcctl.py."""
from __future__ import annotations

import json

import click
from tabulate import tabulate


@click.command("tune-host")
@click.option("--apply", "apply_", is_flag=True, help="Set them in this network namespace.")
@click.option("--restore", is_flag=True, help="Put the kernel's defaults back.")
@click.option("-j", "--json", "json_", is_flag=True, help="Print JSON.")
@click.pass_context
def tune_host(ctx, apply_, restore, json_):
    """Host-wide TCP settings for sprayed flows that no route metric reaches
    (mrcctl's routes carry rto_min, reordering, quickack). Shows them; changes
    nothing unless --apply or --restore."""
    from mrc_ebpf.control import host_tcp
    if apply_ and restore:
        raise click.UsageError("--apply or --restore, not both")
    rows = host_tcp.write("tuned" if apply_ else "default") if (apply_ or restore) else host_tcp.read()
    if json_ or (ctx.obj or {}).get("json"):
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    click.echo(tabulate([(r["sysctl"], r["current"], r["tuned"], r["kernel_default"]) for r in rows],
                        headers=["sysctl", "current", "for spraying", "kernel default"]))
    for r in rows:
        click.echo(f"  {r['sysctl']}: {r['why']}")
