"""The kernel hooks of bpf/mrc_ports.c on their own: loaded from the
datapath's build on fresh maps, attached to netif_carrier_off/on and
__dev_notify_flags, for a namespace with two plane devices (veth pairs).
Witnesses: the kernel's own calls (a link set down at the far end takes
our device's carrier; our device set down by admin), the map the hooks
write (config.ports_down) and the event each logs, whose kernel timestamp
(CLOCK_MONOTONIC, as bpf_ktime_get_ns) falls inside the netlink call that
changed the link with the fentry hooks (Debian's 6.1: the VM suite), or
after it with the link-watch hooks (this 6.18 refuses tracing programs:
EPERM at load).  A device of the same ifindex in another namespace
changes nothing.
"""
from __future__ import annotations

import os
import time

import pytest

from mrc_ebpf.datapath import bpfsys, build, layout, port_hook
from mrc_ebpf.datapath.source import C

pytestmark = pytest.mark.root


@pytest.fixture
def hooks(topo):
    """Namespace `h` with eth0, eth1 (planes 0, 1), their far ends in `f`;
    namespace `o` with devices of the same ifindexes (another host).  The
    hooks attached as `mrcctl ports hook on` attaches them (port_hook.attach,
    the link-watch hooks too where fentry is refused), on maps of their own
    pinned in a directory of the test's."""
    from mrc_ebpf.datapath import loader, pins
    from mrc_ebpf.lab.enter import inside
    h, f, o = topo.ns("h"), topo.ns("f"), topo.ns("o")
    topo.link(h, "eth0", f, "p0")
    topo.link(h, "eth1", f, "p1")
    topo.link(o, "eth0", f, "q0")
    topo.link(o, "eth1", f, "q1")
    made = loader.datapath_build()
    inst = build.instantiate(made, None, {}, [])        # the maps alone
    directory = pins.ensure_bpffs() / f"test-port-hook-{os.getpid()}-{time.monotonic_ns()}"
    directory.mkdir()
    maps = []
    try:
        for sym, name in (("mrc_config", "config"), ("mrc_port_hook", "port_hook")):
            bpfsys.obj_pin(inst[sym].map_fd, str(directory / name))
        cfg = bpfsys.PinnedMap(str(directory / "config"), *layout.MAPS["config"])
        hook_map = bpfsys.PinnedMap(str(directory / "port_hook"), *layout.MAPS["port_hook"])
        events = bpfsys.PinnedMap.from_fd(inst["mrc_events"].map_fd, layout.Index, layout.Event)
        maps += [cfg, hook_map, events]
        with inside(h):
            from pyroute2 import IPRoute
            with IPRoute() as ipr:
                idx = [ipr.link_lookup(ifname=d)[0] for d in ("eth0", "eth1")]
            c = layout.Config(n_devices=2)
            for i, index in enumerate(idx):
                c.devices[i].ifindex = index
            cfg.update(layout.Index(0), c)
            out = port_hook.attach(made, {sym.decode(): t.map_fd for sym, t in inst.tables.items()}, directory,
                                   link_watch=True)
        if port_hook.detector(out["hooked"]) != "kernel":
            pytest.skip(f"no kernel hooks attach here: {out['errors']}")
        yield {"topo": topo, "h": h, "f": f, "o": o, "cfg": cfg, "hook": hook_map, "events": events,
               "fentry": "netif_carrier_off" in out["hooked"], "hooked": out["hooked"]}
    finally:
        pins.remove_tree(directory)         # the hooks' links with it: they come off
        for m in maps:
            m.close()
        inst.close()


def _set(ns, dev, up):
    """DEV in NS set up or down: one netlink call, CLOCK_MONOTONIC before and after."""
    from pyroute2 import IPRoute
    from mrc_ebpf.lab.enter import inside
    with inside(ns), IPRoute() as ipr:
        index = ipr.link_lookup(ifname=dev)[0]
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        ipr.link("set", index=index, state="up" if up else "down")
        return before, time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _own_events(events, kind):
    return sorted((e.ns, e.path_id) for _, e in events.items()
                  if e.seq and e.type == C[kind] and e.peer_id == C["MRC_EV_NO_PEER"])


def _settles(read, want, seconds=3.0):
    """READ() == WANT, waiting for the kernel's link-watch work where
    that is what the hooks caught (not a timing bound: the work's delay
    is the kernel's own, up to a second)."""
    ends = time.monotonic() + seconds
    while read() != want and time.monotonic() < ends:
        time.sleep(0.01)
    return read()


def test_a_lost_carrier_and_an_admin_down_set_the_port_status(hooks):
    """fentry hooks (6.1): the event's kernel timestamp inside the netlink
    call.  Link-watch hooks (6.18 here): at the latest when the kernel's
    link-watch work runs; how soon after the call is printed."""
    cfg, events = hooks["cfg"], hooks["events"]
    ports = lambda: cfg.lookup(layout.Index(0)).ports_down     # noqa: E731
    assert ports() == 0
    seen = []
    # the far end of eth1 set down: eth1 loses its carrier in that call
    t0, t1 = _set(hooks["f"], "p1", up=False)
    assert _settles(ports, 0b10) == 0b10
    down = _own_events(events, "MRC_EV_OWN_PORT_DOWN")
    assert len(down) == 1 and t0 <= down[0][0] and down[0][1] == C["MRC_EV_PLANE"] + 1, (down, t0, t1)
    seen.append(("p1 down", down[0][0] - t0, t1 - t0))
    # another namespace's devices of the same ifindexes: not ours
    _set(hooks["f"], "q1", up=False)
    _set(hooks["f"], "q0", up=False)
    time.sleep(1.2)             # their link-watch work has run
    assert ports() == 0b10
    # back: carrier on
    t0, t1 = _set(hooks["f"], "p1", up=True)
    assert _settles(ports, 0) == 0
    up = _own_events(events, "MRC_EV_OWN_PORT_UP")
    assert len(up) == 1 and t0 <= up[0][0], (up, t0, t1)
    seen.append(("p1 up", up[0][0] - t0, t1 - t0))
    # our own eth0 set down by admin, then up
    t0, t1 = _set(hooks["h"], "eth0", up=False)
    assert _settles(ports, 0b01) == 0b01
    ns = [n for n, pid in _own_events(events, "MRC_EV_OWN_PORT_DOWN") if n >= t0 and pid == C["MRC_EV_PLANE"]]
    assert ns
    seen.append(("eth0 down", ns[0] - t0, t1 - t0))
    _set(hooks["h"], "eth0", up=True)
    assert _settles(ports, 0) == 0
    h = hooks["hook"].lookup(layout.Index(0))
    assert h.changes == 4, h.changes
    print(f"hooks {hooks['hooked']}: event after the call began / the call's length (us): "
          + ", ".join(f"{what} {d / 1e3:.0f}/{c / 1e3:.0f}" for what, d, c in seen))
    if hooks["fentry"]:         # inside the call that changed the link
        assert all(d <= c for _, d, c in seen), seen
