"""mrcctl key: the shared key that authenticates feedback (datapath/auth.py).

Rolling a fabric to a new key without a moment where hosts disagree:
  1. on every host: mrcctl key add --key-file NEW     (accept NEW too)
  2. on every host: mrcctl key use --key-file NEW     (sign with NEW)
  3. on every host: mrcctl key retire                 (stop accepting the old)
A host accepts two keys at once, so feedback is filed throughout.
"""
from __future__ import annotations

import click

from mrc_ebpf.cli.common import attached, dev_option, emit, json_option
from mrc_ebpf.errors import MrcError


def _show(value: dict) -> None:
    if not value["keys"]:
        click.echo(f"no key: feedback unauthenticated (epoch {value['epoch']})")
        return
    for k in value["keys"]:
        click.echo(f"key id {k['key_id']}: {'signs and accepts' if k['signs'] else 'accepts'}")
    click.echo(f"epoch {value['epoch']}")


def _change(device, change):
    """Under the writer lock, as every change to an attachment."""
    from mrc_ebpf.datapath import auth
    with attached(device, change=True) as att:
        new = change(auth.read(att))
        auth.write(att, new)
        return auth.describe(new)


@click.group()
def key():
    """The key that authenticates feedback between the hosts of a fabric."""


@key.command("show")
@dev_option
@json_option
@click.pass_context
def key_show(ctx, device):
    """Installed key ids, the one that signs, and this attachment's epoch."""
    from mrc_ebpf.datapath import auth
    with attached(device) as att:
        value = auth.describe(auth.read(att))
    emit(ctx, value, _show)


@key.command("add")
@click.option("--key-file", required=True, metavar="FILE", help="The new key (32 hex digits).")
@dev_option
@json_option
@click.pass_context
def key_add(ctx, key_file, device):
    """Accept the key in FILE besides the one in use (step 1 of a roll-over).
    On a host without a key it becomes the key, signing."""
    from mrc_ebpf.datapath import auth
    new_key = auth.read_key(key_file)
    value = _change(device, lambda v: auth.add(v, new_key, sign=not v.tx_slot))
    emit(ctx, value, _show)


@key.command("use")
@click.option("--key-file", required=True, metavar="FILE", help="The key to sign with.")
@dev_option
@json_option
@click.pass_context
def key_use(ctx, key_file, device):
    """Sign with the key in FILE (installing it if needed; step 2)."""
    from mrc_ebpf.datapath import auth
    new_key = auth.read_key(key_file)
    value = _change(device, lambda v: auth.add(v, new_key, sign=True))
    emit(ctx, value, _show)


@key.command("retire")
@dev_option
@json_option
@click.pass_context
def key_retire(ctx, device):
    """Stop accepting the key that does not sign (step 3)."""
    from mrc_ebpf.datapath import auth

    def retire(v):
        new, dropped = auth.retire(v)
        if not dropped:     # a no-op would let a roll-over script think step 3 happened
            raise MrcError("no key to retire: " + ("no key is installed" if not v.tx_slot else
                                                   "only the signing key is installed"))
        return new
    value = _change(device, retire)
    emit(ctx, value, _show)


@key.command("clear")
@dev_option
@json_option
@click.pass_context
def key_clear(ctx, device):
    """Remove every key: feedback unauthenticated again, as without --key-file."""
    from mrc_ebpf.datapath import auth
    value = _change(device, auth.clear)
    emit(ctx, value, _show)
