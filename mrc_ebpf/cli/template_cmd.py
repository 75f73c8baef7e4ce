"""`mrcctl path template ...` and `mrcctl path bulk`: path templates and
the many peers that share them (control/templates.py); registered on
mrcctl's `path` group at the end of cli/mrcctl.py.  `path add PREFIX
--template NAME --sid SID` (in mrcctl.py) adds one such peer."""
from __future__ import annotations

import click

from mrc_ebpf.cli.common import attached, dev_option, emit, json_option
from mrc_ebpf.errors import MrcError


@click.group()
def template():
    """Path templates: the paths to a destination leaf, shared by its peers."""


@template.command("add")
@click.argument("name")
@click.option("--via", multiple=True, required=True, metavar="SEG1,...",
              help="An SRH path's segments before the last hop (e.g. the spine's SID); each "
                   "peer of the template is the last hop. Repeatable.")
@click.option("--weight", type=int, default=1, show_default=True, help="Weight (policy weighted).")
@click.option("--class", "tclass", metavar="NAME", help="Reserve the paths for this traffic class.")
@dev_option
@json_option
@click.pass_context
def template_add(ctx, name, via, weight, tclass, device):
    """Add paths to template NAME (made if new)."""
    from mrc_ebpf.control import templates
    with attached(device, change=True) as att:
        results = templates.add(att, name, list(via), weight, tclass)
    emit(ctx, results, lambda rs: click.echo("\n".join(
        f"template {r['template']} path {r['path_id']} via {','.join(r['segments'])} "
        f"(+{r['overhead']} B)" for r in rs) or f"template {name}: nothing new"))


@template.command("replace")
@click.argument("name")
@click.option("--id", "path_id", type=int, required=True, help="The path to replace (its id, path template list).")
@click.option("--via", required=True, metavar="SEG1,...", help="The new path's segments before the last hop.")
@click.option("--weight", type=int, help="Weight (default: the old path's).")
@click.option("--class", "tclass", metavar="NAME", help="Traffic class (default: the old path's).")
@dev_option
@json_option
@click.pass_context
def template_replace(ctx, name, path_id, via, weight, tclass, device):
    """Replace path ID of template NAME in place: the new path takes its
    id (its slot), so a full template (256 paths) can change one. The
    path is out of the spray while it is written, and it starts with
    nothing learnt; all or nothing."""
    from mrc_ebpf.control import classes, templates
    with attached(device, change=True) as att:
        results = templates.replace_paths(att, name, [(path_id, via, weight,
                                                       classes.class_id(att, tclass) if tclass else None)])
    emit(ctx, results, lambda rs: click.echo("\n".join(
        f"template {r['template']} path {r['path_id']}: via {','.join(r['replaced'])} -> "
        f"{','.join(r['segments'])}" for r in rs)))


@template.command("del")
@click.argument("name")
@dev_option
@json_option
@click.pass_context
def template_del(ctx, name, device):
    """Delete template NAME (it must have no peers)."""
    from mrc_ebpf.control import templates
    with attached(device, change=True) as att:
        result = templates.delete(att, name)
    emit(ctx, result, lambda r: click.echo(f"deleted template {r['template']}"))


@template.command("policy")
@click.argument("name")
@click.argument("policy")
@dev_option
@json_option
@click.pass_context
def template_policy(ctx, name, policy, device):
    """Set the spray policy of template NAME's peers."""
    from mrc_ebpf.control import templates
    with attached(device, change=True) as att:
        result = templates.set_policy(att, name, policy)
    emit(ctx, result, lambda r: click.echo(f"template {r['template']}: policy {r['policy']}"))


@template.command("list")
@dev_option
@json_option
@click.pass_context
def template_list(ctx, device):
    """Templates, their paths and how many peers use each."""
    from mrc_ebpf.control import templates
    from mrc_ebpf.datapath import loader
    with loader.Attachment.open(loader.resolve_device(device)) as att:
        rows = templates.list_templates(att)

    def human(rows):
        if not rows:
            click.echo("no templates")
        for r in rows:
            click.echo(f"{r['template']}: {len(r['paths'])} paths, policy {r['policy']}, "
                       f"{r['peers']} peers")
            for p in r["paths"]:
                click.echo(f"  path {p['path_id']} via {','.join(p['segments'])} weight {p['weight']}"
                           f" {p['state']}")
    emit(ctx, rows, human)


@click.command("bulk")
@click.argument("file", type=click.File("r"))
@click.option("--route/--no-route", default=True, show_default=True,
              help="Install a kernel route per prefix (--no-route: an aggregate route out of the "
                   "attached device covers them).")
@dev_option
@json_option
@click.pass_context
def bulk(ctx, file, route, device):
    """Add many peers of templates at once: FILE has a line `PREFIX
    TEMPLATE SID` per peer ('-' reads stdin; # starts a comment).  All or
    nothing."""
    from mrc_ebpf.control import templates
    entries = []
    try:
        for number, line in enumerate(file, start=1):
            line = line.split("#", 1)[0]
            if line.strip():
                entries.append(templates.parse_line(line, number))
    except UnicodeDecodeError:
        raise MrcError(f"{file.name}: not a text file (not UTF-8): expected lines "
                       f"`PREFIX TEMPLATE SID`")
    if not entries:
        raise MrcError("no peers in the file")
    with attached(device, change=True) as att:
        result = templates.add_peers(att, entries, route=route)
    emit(ctx, result, lambda r: click.echo(f"{r['added']} peers added, {r['updated']} updated; "
                                           f"{r['peers']} peers in all"
                                           + (f"; {r['routes']} routes installed" if route else "")))


def add_templated(ctx, prefix, name, sid, device, other_options) -> None:
    """`mrcctl path add PREFIX --template NAME --sid SID`."""
    from mrc_ebpf.control import templates
    if other_options:
        raise click.UsageError("--template takes only --sid: the paths are the template's")
    if not sid:
        raise click.UsageError("--template needs --sid PEER_SID (the last hop of its paths)")
    with attached(device, change=True) as att:
        result = templates.add_peers(att, [(prefix, name, sid)])
    emit(ctx, result, lambda r: click.echo(f"{prefix}: template {name}, last hop {sid}"))
