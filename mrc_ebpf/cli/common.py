"""What every mrcctl verb shares: entering --netns, opening (or changing,
under the writer lock) an attachment, -j/-p output, --dev and its
completion.  The verb modules (mrcctl.py and the *_cmd.py beside it)
import these, so each verb behaves the same."""
from __future__ import annotations

import contextlib
import functools
import json
import socket

import click

from mrc_ebpf.errors import MrcError


def tabulate(*args, **kwargs) -> str:
    """tabulate.tabulate, imported on first use: the import (~40 ms) is
    paid only by verbs that print a table, not by every mrcctl start."""
    from tabulate import tabulate as _tabulate
    return _tabulate(*args, **kwargs)


def enter_netns(name: str) -> None:
    """Enter an existing namespace; never create one (flags=0: pyroute2
    creates a missing one by default)."""
    from pyroute2 import netns
    if not name or "/" in name or name in (".", ".."):
        raise MrcError(f"bad network namespace name {name!r}")
    try:
        netns.setns(name, flags=0)
    except FileNotFoundError:
        raise MrcError(f"no network namespace {name!r} (see `ip netns list`)")
    except (OSError, ValueError) as e:
        raise MrcError(f"cannot enter network namespace {name!r}: {e}")


@contextlib.contextmanager
def attached(device: str | None, change: bool = False):
    """The pinned state of DEVICE (or of the only device attached here);
    with change=True under the namespace's writer lock, all or nothing."""
    from mrc_ebpf.datapath import loader
    if change:
        with loader.changing(device) as att:
            yield att
        return
    with loader.Attachment.open(loader.resolve_device(device)) as att:
        yield att


def complete_devices(ctx, param, incomplete):
    """Network devices of the namespace the command will run in."""
    return [name for _, name in in_netns_of(ctx, socket.if_nameindex) or []
            if name.startswith(incomplete)]


def complete_attached(ctx, param, incomplete):
    """Devices with the datapath attached (their pins), else every device."""
    from mrc_ebpf.datapath import pins
    found = in_netns_of(ctx, pins.attached_devices)
    if not found:
        return complete_devices(ctx, param, incomplete)
    return [d for d in found if d.startswith(incomplete)]


def complete_prefixes(ctx, param, incomplete):
    """Peer prefixes that have paths (needs root to read the maps)."""
    def read():
        from mrc_ebpf.control import paths
        from mrc_ebpf.datapath import loader
        device = ctx.params.get("device")
        with loader.Attachment.open(loader.resolve_device(device)) as att:
            return [p["prefix"] for p in paths.peers(att)]
    return [p for p in in_netns_of(ctx, read) or [] if p.startswith(incomplete)]


def in_netns_of(ctx, fn):
    """fn() inside the --netns given on the command line being completed;
    None when that cannot be done (not root, no such namespace)."""
    root = ctx.find_root()
    try:
        if root.params.get("netns_name"):
            enter_netns(root.params["netns_name"])
        return fn()
    except Exception:
        return None


def lock_timeout(ctx, param, value):
    if value is None:
        return None
    from mrc_ebpf.datapath import lock
    try:
        seconds = lock.parse_timeout(value)
    except ValueError as e:
        raise click.BadParameter(str(e))
    lock.set_timeout(seconds)
    return seconds


def exact_prefix(ctx, param, value):
    """click callback of PREFIX arguments: host bits set is an error (as
    `ip route` says), never a silent fd00:c2::1/64 -> fd00:c2::/64."""
    if value is None:
        return value
    from mrc_ebpf.control import paths
    return paths.exact_prefix(value)


def dev_option(f):
    return click.option("--dev", "device", help="Device (default: the only one attached).",
                        shell_complete=complete_attached)(f)


def dumps(data, pretty: bool = False) -> str:
    """One document: one line, or indented with -p."""
    if pretty:
        return json.dumps(data, indent=2, sort_keys=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def emit(ctx: click.Context, data, human) -> None:
    if ctx.obj["json"]:
        click.echo(dumps(data, ctx.obj.get("pretty", False)))
    else:
        human(data)


def json_option(f):
    """-j/--json and -p/--pretty on the verb itself, as well as on mrcctl."""
    @click.option("-j", "--json", "json_", is_flag=True, help="Print JSON, one document per line.")
    @click.option("-p", "--pretty", "pretty_", is_flag=True, help="Print JSON, indented.")
    @functools.wraps(f)
    def wrapper(*args, json_=False, pretty_=False, **kwargs):
        ctx = click.get_current_context()
        ctx.obj["pretty"] = ctx.obj.get("pretty", False) or pretty_
        ctx.obj["json"] = ctx.obj["json"] or json_ or pretty_
        return f(*args, **kwargs)
    return wrapper
