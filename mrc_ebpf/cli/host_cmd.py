"""`mrcctl tune-host`: the host-wide TCP settings a route cannot carry
(mrc_ebpf/control/host_tcp.py), shown, applied or restored on request.
Registered at the end of cli/mrcctl.py."""
from __future__ import annotations


import click

from mrc_ebpf.cli.common import emit, json_option, tabulate


@click.command("tune-host")
@click.option("--apply", "apply_", is_flag=True, help="Set them in this network namespace.")
@click.option("--restore", is_flag=True, help="Put the kernel's defaults back.")
@json_option
@click.pass_context
def tune_host(ctx, apply_, restore):
    """Host-wide TCP settings for sprayed flows that no route metric reaches
    (mrcctl's routes carry rto_min and reordering). Shows them; changes
    nothing unless --apply or --restore."""
    from mrc_ebpf.control import host_tcp
    if apply_ and restore:
        raise click.UsageError("--apply or --restore, not both")
    rows = host_tcp.write("tuned" if apply_ else "default") if (apply_ or restore) else host_tcp.read()
    emit(ctx, rows, _human)


def _human(rows):
    click.echo(tabulate([(r["sysctl"], r["current"], r["tuned"], r["kernel_default"]) for r in rows],
                        headers=["sysctl", "current", "for spraying", "kernel default"]))
    for r in rows:
        click.echo(f"  {r['sysctl']}: {r['why']}")
