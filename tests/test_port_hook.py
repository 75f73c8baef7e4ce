"""The kernel hooks of bpf/mrc_ports.c on their own: loaded from the
datapath's build on fresh maps, attached to netif_carrier_off/on and
__dev_notify_flags, for a namespace with two plane devices (veth pairs).
Witnesses: the kernel's own calls (a link set down at the far end takes
our device's carrier; our device set down by admin), the map the hooks
write (config.ports_down) and the event each logs, whose kernel timestamp
falls inside the netlink call that changed the link (CLOCK_MONOTONIC, as
bpf_ktime_get_ns).  A device of the same ifindex in another namespace
changes nothing.  Skipped where the kernel refuses BPF tracing programs
(this 6.18 build: EPERM at load; bpftool feature probe: "program_type
tracing is NOT available"); the VM suite runs it on Debian's 6.1.
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
    namespace `o` with a device of eth1's ifindex (another host)."""
    from mrc_ebpf.datapath import loader
    from mrc_ebpf.lab.enter import inside
    h, f, o = topo.ns("h"), topo.ns("f"), topo.ns("o")
    topo.link(h, "eth0", f, "p0")
    topo.link(h, "eth1", f, "p1")
    topo.link(o, "x0", f, "q0")
    topo.link(o, "x1", f, "q1")
    made = loader.datapath_build()
    inst = build.instantiate(made, None, {}, [])        # the maps alone
    with inside(h):
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            idx = [ipr.link_lookup(ifname=d)[0] for d in ("eth0", "eth1")]
        btf = port_hook.Btf()
        try:
            value = port_hook.settings(btf)     # this namespace's cookie
        finally:
            btf.close()
    cfg = bpfsys.PinnedMap.from_fd(inst["mrc_config"].map_fd, layout.Index, layout.Config)
    c = layout.Config(n_devices=2)
    for i, index in enumerate(idx):
        c.devices[i].ifindex = index
    cfg.update(layout.Index(0), c)
    hook_map = bpfsys.PinnedMap.from_fd(inst["mrc_port_hook"].map_fd, layout.Index, layout.PortHook)
    hook_map.update(layout.Index(0), value)
    events = bpfsys.PinnedMap.from_fd(inst["mrc_events"].map_fd, layout.Index, layout.Event)
    btf = port_hook.Btf()
    try:
        ids = {fn: btf.find(kfn, 12) for fn, (kfn, _) in port_hook.HOOKS.items()}
    finally:
        btf.close()
    maps = {sym.decode(): t.map_fd for sym, t in inst.tables.items()}
    links, progs = [], []
    try:
        for fn, btf_id in ids.items():
            try:
                p = build.instantiate(made, maps, {fn: port_hook.BPF_TRACE_FENTRY}, [fn], {fn: btf_id})
            except bpfsys.BpfError as e:
                pytest.skip(f"the kernel refuses BPF tracing programs ({fn}: {e})")
            progs.append(p)
            links.append(bpfsys.tracing_attach(p.programs[fn].fd))
        yield {"topo": topo, "h": h, "f": f, "o": o, "cfg": cfg, "hook": hook_map, "events": events}
    finally:
        for fd in links:
            os.close(fd)
        for p in progs:
            p.close()
        for m in (cfg, hook_map, events):
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


def test_a_lost_carrier_and_an_admin_down_set_the_port_status_inside_the_call(hooks):
    cfg, events = hooks["cfg"], hooks["events"]
    ports = lambda: cfg.lookup(layout.Index(0)).ports_down     # noqa: E731
    assert ports() == 0
    # the far end of eth1 set down: eth1 loses its carrier in that call
    t0, t1 = _set(hooks["f"], "p1", up=False)
    assert ports() == 0b10
    down = _own_events(events, "MRC_EV_OWN_PORT_DOWN")
    assert len(down) == 1 and t0 <= down[0][0] <= t1 and down[0][1] == C["MRC_EV_PLANE"] + 1, (down, t0, t1)
    # another namespace's device of the same ifindex: not ours
    _set(hooks["f"], "q1", up=False)
    _set(hooks["f"], "q0", up=False)
    assert ports() == 0b10
    # back: carrier on
    t0, t1 = _set(hooks["f"], "p1", up=True)
    assert ports() == 0
    up = _own_events(events, "MRC_EV_OWN_PORT_UP")
    assert len(up) == 1 and t0 <= up[0][0] <= t1, (up, t0, t1)
    # our own eth0 set down by admin, then up
    t0, t1 = _set(hooks["h"], "eth0", up=False)
    assert ports() == 0b01
    assert any(t0 <= ns <= t1 and pid == C["MRC_EV_PLANE"] for ns, pid in _own_events(events, "MRC_EV_OWN_PORT_DOWN"))
    _set(hooks["h"], "eth0", up=True)
    assert ports() == 0
    h = hooks["hook"].lookup(layout.Index(0))
    assert h.changes == 4 and h.calls >= 4, (h.changes, h.calls)
