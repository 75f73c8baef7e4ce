"""`mrcctl render FILE --host NAME`: one host's config from a fabric description.

Registered at the end of cli/mrcctl.py.  The config is the host config
format (`mrcctl apply` reads it); the description's format is
mrc_ebpf/lab/fabric/description.py.
"""
from __future__ import annotations

import textwrap

import click

from mrc_ebpf.cli.common import emit, json_option


@click.command()
@click.argument("file", metavar="FABRIC_FILE")
@click.option("--host", "host", required=True, metavar="NAME",
              help="The host (h1, h2, ...) whose config to print.")
@click.option("-o", "--output", metavar="FILE", help="Write the config to FILE instead of printing it.")
@click.option("--form", type=click.Choice(["auto", "peers", "blocks"]), default="auto", show_default=True,
              help="peers: every other host a peer with its paths; blocks: one path template and the "
                   "peers as blocks of the address plan; auto: blocks beyond 255 peers.")
@click.option("--no-key", "no_key", is_flag=True,
              help="Name no key: the host's feedback is then unauthenticated (anyone on the fabric "
                   "can forge or replay it: docs/design/threat-model.md).")
@json_option
@click.pass_context
def render(ctx, file, host, output, form, no_key):
    """Print host NAME's config from fabric description FABRIC_FILE: its
    attach section (plane NICs, SID, attach options, the fabric's key) and
    every other host as a peer (with all its paths, or in blocks sharing a
    path template).

    The key is the description's attach key_file; where it names none,
    FABRIC_FILE's name with .key beside it, made (mode 0600) by the first
    render and the same for every host rendered from it, unless --no-key."""
    from mrc_ebpf.errors import MrcError
    from mrc_ebpf.lab.fabric import description, render as render_mod
    desc = description.load(file)
    cfg = render_mod.host_config(desc, host, form=form)
    if not no_key and "key_file" not in cfg["attach"]:
        from mrc_ebpf.datapath import auth
        where = render_mod.key_beside(file)
        try:
            cfg["attach"]["key_file"] = str(auth.new_key_file(where))
        except MrcError as e:
            raise MrcError(f"{e}: name a key in the description (hosts.defaults.attach.key_file), or "
                           f"render with --no-key")
    # where a peer cannot use every (plane, spine), what render chose, as
    # a comment heading the file and in the summary line
    choice = desc.fabric.path_choice()
    head = "".join(f"# {line}\n" for line in textwrap.wrap(f"mrcctl render: {choice}", 96)) if choice else ""
    if output:
        text = head + render_mod.dump(cfg)
        try:
            with open(output, "w") as f:
                f.write(text)
        except OSError as e:
            raise MrcError(f"cannot write {output}: {e.strerror or e}")
        n_peers, n_paths = render_mod.counts(cfg)
        emit(ctx, {"host": host, "file": output, "bytes": len(text.encode()), "peers": n_peers,
                   "paths": n_paths, "key_file": cfg["attach"].get("key_file"), "path_choice": choice},
             lambda r: click.echo(f"{r['host']}: {r['peers']} peers, {r['paths']} paths, {r['bytes']} bytes "
                                  f"in {r['file']}" + (f"; {choice}" if choice else "")))
        return
    emit(ctx, cfg, lambda c: click.echo(head + render_mod.dump(c), nl=False))
