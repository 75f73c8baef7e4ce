"""`mrcctl apply FILE`, `show-config` and `save`: a host's whole config
as one YAML file (mrc_ebpf/control/config/ has the format; docs/ops.md
the how-to)."""
from __future__ import annotations

from pathlib import Path

import click

from mrc_ebpf.cli.common import attached, dev_option, emit, json_option
from mrc_ebpf.errors import MrcError


@click.command("apply")
@click.argument("file", metavar="FILE")
@click.option("--reattach", is_flag=True,
              help="Allow a re-attach when the devices, SID or XDP mode differ (counters start "
                   "over, traffic stops while the programs compile); refused without it.")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option("--no-key", "no_key", is_flag=True,
              help="Apply a FILE that names no key_file without the warning that its feedback is "
                   "unauthenticated (refused if FILE names one).")
@json_option
@click.pass_context
def apply(ctx, file, reattach, dry_run, no_key):
    """Make this host's datapath what FILE (YAML; - for stdin) says.

    Attaches it if it is not; otherwise changes only what differs: paths
    are matched by what they are, so the ones that stay keep their ids
    and counters.  An invalid file is refused with its line; a failure
    midway undoes everything.  The attach section's key_file (`render`
    names the fabric's) authenticates feedback; a FILE without one is
    applied with a warning on stderr, unless --no-key."""
    from mrc_ebpf.control import config
    from mrc_ebpf.errors import MrcError
    cfg = config.load_file(file)
    keyed = bool(cfg.data["attach"].get("key_file"))
    if keyed and no_key:
        raise MrcError(f"--no-key, but {cfg.source} names key_file {cfg.data['attach']['key_file']}: "
                       f"drop one of them")
    applied = config.apply(cfg, reattach=reattach, dry_run=dry_run)
    result = {**applied.public(), "authenticated": keyed}
    if not keyed and not no_key:
        click.echo(f"mrcctl: warning: {cfg.source} names no key_file: {result['device']}'s feedback is "
                   f"unauthenticated, anyone on the fabric can forge or replay it (`mrcctl render` "
                   f"names the fabric's key; --no-key applies without this warning)", err=True)

    def human(r):
        if not r["changed"]:
            click.echo(f"{r['device']}: no change: the running config is {r['file']}'s")
            return
        verb = "would change" if r["dry_run"] else "changed"
        click.echo(f"{r['device']}: {verb} {len(r['changes'])} thing(s)")
        for c in applied.changes:
            click.echo(f"  {c.describe()}")
    emit(ctx, result, human)


@click.command("show-config")
@dev_option
@click.option("--key-file", metavar="FILE",
              help="The key file to name, where the attachment was made by `attach --key-file` "
                   "(apply records it).")
@json_option
@click.pass_context
def show_config(ctx, device, key_file):
    """The running config in apply's format: `show-config | apply -` changes nothing."""
    from mrc_ebpf.control import config
    with attached(device) as att:
        _check_key_file(att, key_file)
        data = config.running(att, key_file)
    emit(ctx, data, lambda d: click.echo(config.dump(d), nl=False))


def _check_key_file(att, key_file: str | None) -> None:
    """--key-file names the key the attachment signs with: a file that is
    not a key, or holds another key, would be saved into a config that
    then cannot be applied as it runs."""
    if not key_file:
        return
    from mrc_ebpf.control import config
    from mrc_ebpf.datapath import auth
    key = auth.read_key(key_file)           # one line if missing or not a key
    signing = config.signing_key(att)
    if signing is None:
        raise MrcError(f"--key-file {key_file}: {att.device} signs with no key")
    if signing.id != auth.key_id(key):
        raise MrcError(f"--key-file {key_file}: holds key {auth.key_id(key)}, "
                       f"{att.device} signs with key {signing.id}")


@click.command("save")
@dev_option
@click.option("--to", "target", metavar="FILE",
              help="Where to write (default: /etc/mrc-ebpf/DEV.yaml, or $MRC_CONFIG_DIR/DEV.yaml: "
                   "what the mrc-ebpf@DEV systemd unit applies at boot).")
@click.option("--key-file", metavar="FILE", help="As for show-config.")
@json_option
@click.pass_context
def save(ctx, device, target, key_file):
    """Write the running config where the systemd unit finds it at boot."""
    from mrc_ebpf.control import config
    with attached(device) as att:
        _check_key_file(att, key_file)
        data = config.running(att, key_file)
        name = att.device
    path = Path(target) if target else config.save_path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MrcError(f"cannot write {path}: {e.strerror or e}")
    config.write_atomically(path, config.dump(data))
    emit(ctx, {"device": name, "file": str(path)},
         lambda r: click.echo(f"saved {r['device']}'s config to {r['file']}"))
