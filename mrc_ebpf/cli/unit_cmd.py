"""`mrcctl install-unit`: the systemd unit mrc-ebpf@DEV, written with
this mrcctl's absolute path (mrc_ebpf/control/unit.py)."""
from __future__ import annotations

import click

from mrc_ebpf.cli.common import emit, json_option


@click.command("install-unit")
@click.option("--dir", "directory", metavar="DIR",
              help="Where to write mrc-ebpf@.service (default /etc/systemd/system; then "
                   "`systemctl daemon-reload` follows when systemd runs).")
@click.option("--mrcctl", "mrcctl", metavar="PATH",
              help="The mrcctl the unit runs (default: this one, by its absolute path).")
@json_option
@click.pass_context
def install_unit(ctx, directory, mrcctl):
    """Install the systemd unit that applies /etc/mrc-ebpf/DEV.yaml at boot
    (`mrcctl save --dev DEV` writes it; then `systemctl enable --now mrc-ebpf@DEV`)."""
    from pathlib import Path
    from mrc_ebpf.control import unit
    r = unit.install(Path(directory) if directory else None, Path(mrcctl) if mrcctl else None)
    emit(ctx, r, lambda r: click.echo(
        f"wrote {r['unit']} (runs {r['mrcctl']})" + ("; systemd reloaded" if r["daemon_reload"] else "")))
