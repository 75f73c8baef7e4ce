"""`mrcctl fabric plan`: the two-tier shape, config size against a real
rendered config, kernel memory (the datapath's model, which
tests/test_memory.py checks against the kernel), and apply time measured
by timing `mrcctl apply` of rendered configs."""
from __future__ import annotations

import json
import os

import pytest

from conftest import mrcctl
from mrc_ebpf.lab import netns
from mrc_ebpf.lab.fabric import description, render, sizing


def test_shape_of_the_target_fabric():
    """131,072 NICs in 8 planes of radix-512 switches: 512 leaves of 256
    hosts and 256 spines per plane; one NIC more needs a third tier."""
    s = sizing.shape(131072, 8, 512)
    assert (s["leaves_per_plane"], s["spines_per_plane"], s["hosts_per_leaf"]) == (512, 256, 256)
    assert s["switches"] == 8 * (512 + 256) and s["paths_available"] == 8 * 256
    r = mrcctl("fabric", "plan", "--nics", "131073", "--planes", "8", "--radix", "512", check=False)
    assert r.returncode == 1 and "at most 131072 NICs per plane" in r.stderr
    r = json.loads(mrcctl("fabric", "plan", "--nics", "131072", "--planes", "8", "--radix", "512",
                          "--cpus", "128", "-j").stdout)
    assert r["paths_per_peer"] == 256 and r["config"]["peers"] == 131071
    assert r["config"]["paths"] == 131071 * 256
    # fixed part + one copy of the per-CPU maps per CPU, every other NIC
    # a peer in the maps (memlock: 209.0 MB with learnt state for 16,384
    # active peers and receive state for 16,384 senders, as test_memory's
    # bound; issue 28 sets the target by the kernel's count, below)
    assert r["memory"]["bytes"] == r["memory"]["fixed_bytes"] + 128 * r["memory"]["per_cpu_bytes"]
    assert r["memory"]["peers_held"] == 131071 and r["memory"]["bytes"] <= 209.5e6
    # as the kernel counts it (issue 28: the LPM trie's intermediate nodes
    # and the slab objects; tests/test_memory.py checks the model against
    # a memory cgroup), well above memlock's figure
    from mrc_ebpf.datapath import memory
    assert r["memory"]["kernel_bytes"] == memory.host_kernel_bytes(131071, 128)
    assert r["memory"]["kernel_bytes"] > r["memory"]["bytes"] + 15e6
    assert r["memory"]["kernel_bytes"] <= 256e6        # issue 28's target, at 128 CPUs


def test_config_size_is_what_render_writes():
    """The plan's config size for 32 NICs in 2 planes of radix 8 (8 leaves
    of 4 hosts, 4 spines) against the config rendered for that fabric."""
    r = sizing.plan(32, 2, 8, cpus=2)
    assert (r["leaves_per_plane"], r["spines_per_plane"], r["hosts_per_leaf"], r["paths_per_peer"]) == (8, 4, 4, 8)
    desc = description.parse("version: 1\nfabric: {planes: 2, spines: 4, leaves: 8, hosts_per_leaf: 4}\n")
    cfg = render.host_config(desc, "h1")
    real = len(render.dump(cfg).encode())
    assert len(cfg["peers"]) == r["config"]["peers"] and sum(len(p["paths"]) for p in cfg["peers"]) == \
        r["config"]["paths"]
    assert abs(r["config"]["bytes"] - real) <= 0.02 * real, (r["config"]["bytes"], real)


@pytest.mark.root
def test_apply_time_is_measured_and_cleaned_up():
    """`fabric plan --measure` times `mrcctl apply` itself (both forms of a
    rendered config) and extrapolates it to the plan's peers."""
    rate = sizing.measure_apply(peers=8, paths=8, block_peers=256)
    assert rate["by"] == "mrcctl apply" and rate["attach_s"] > 0 and rate["blocks_s"] > 0
    assert rate["per_block_peer_s"] >= 0 and rate["per_peer_s"] >= 0 and rate["per_path_s"] >= 0
    assert f"mrcplan{os.getpid()}" not in netns.existing()
    r = sizing.plan(1024, 2, 64, cpus=4, apply_rate=rate)
    expect = rate["blocks_s"] + (1023 - rate["block_peers"]) * rate["per_block_peer_s"]
    assert r["apply"]["form"] == r["config"]["form"] == "blocks"
    assert r["apply"]["seconds"] == round(expect, 1) and "measured here" in r["apply"]["how"]
    r = sizing.plan(32, 2, 8, cpus=4, apply_rate=rate)
    expect = rate["base_s"] + 31 * rate["per_peer_s"] + 31 * 7 * rate["per_path_s"]
    assert r["apply"]["form"] == "peers" and r["apply"]["seconds"] == round(expect, 1)


def test_blocks_form_is_what_render_writes():
    """Beyond 255 peers the plan sizes the blocks form, which render
    writes: the 131,072-NIC host config is tens of KB (8 templates of 256
    paths: the plan's 256 spines a plane in 8 groups), not 1.45 GB."""
    r = sizing.plan(131072, 8, 512, cpus=2)
    assert r["config"]["form"] == "blocks" and r["config"]["bytes"] < 64_000
    desc = description.parse("version: 1\nfabric: {planes: 8, spines: 256, leaves: 512, hosts_per_leaf: 256}\n")
    cfg = render.host_config(desc, "h1000")
    assert set(cfg) == {"version", "attach", "templates", "peer_blocks"} and len(cfg["templates"]) == 8
    assert render.counts(cfg) == (131071, 131071 * 256)
    assert abs(len(render.dump(cfg).encode()) - r["config"]["bytes"]) < 200    # h1: 8 blocks, h1000: 9
    # asked for fewer paths a peer: one template of them
    r = sizing.plan(131072, 8, 512, cpus=2, paths=64)
    assert r["paths_per_peer"] == 64 and r["path_lists"] == 1 and r["path_choice"] is None
