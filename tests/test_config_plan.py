"""The plan `mrcctl apply` makes, without an attachment: the typed changes
(control/config/changes.py) between two config files, in order, each
described, shown as JSON and tied to its line of the file (the real
apply is tests/test_config.py's)."""
from __future__ import annotations

from mrc_ebpf.control import config
from mrc_ebpf.control.config import changes

WANT = """version: 1
attach: {devices: [eth0], sid: "fc00::1", ack_timeout_us: 2000, granularity: packet, min_active: 2}
classes: [{name: gold, dscp: [46]}, {name: bulk, dscp: [8, 10]}]
peers:
  - prefix: fd00:2::/64
    policy: weighted
    route_metrics: {rto_min: 10ms}
    paths:
      - via: ["fc00:1::", "fc00:2::"]
      - via: ["fc00:3::"]
        weight: 3
        class: gold
      - usid: "fc00:0:e1:2::"
      - entropy: 3
        sid: "fc00::9"
  - prefix: fd00:3::/64
    paths: [{via: ["fc00:5::"]}]
templates:
  - name: t1
    policy: adaptive
    paths: [{via: ["fc00:7::"]}, {via: ["fc00:8::"], weight: 2}]
peer_blocks:
  - {template: t1, prefix: "fd00:100::/64", sid: "fc00:100::1", count: 4, step: 64}
"""
HAVE = """version: 1
attach: {devices: [eth0], sid: "fc00::1", probe_us: 700}
classes: [{name: gold, dscp: [46, 48]}]
peers:
  - prefix: fd00:2::/64
    paths:
      - via: ["fc00:3::"]
        class: gold
        denied: true
      - via: ["fc00:9::"]
      - entropy: 1
        sid: "fc00::9"
  - prefix: fd00:4::/64
    paths: [{via: ["fc00:5::"]}]
templates:
  - name: t1
    paths: [{via: ["fc00:7::"], weight: 5}, {via: ["fc00:6::"]}]
  - name: t2
    paths: [{via: ["fc00:6::"]}]
peer_blocks:
  - {template: t2, prefix: "fd00:100::/64", sid: "fc00:100::1", count: 2, step: 64}
"""

# (description, line of WANT it is tied to): deletions of peers and paths
# first where the peer keeps paths, templates before template peers
EXPECTED = [
    ("attach ack_timeout_us: 1000 -> 2000", None),
    ("attach probe_us: 700 -> 5000", None),
    ("attach min_active: 0 -> 2", None),
    ("attach granularity: auto -> packet", None),
    ("class gold: DSCP 46", None),
    ("class bulk: DSCP 8,10", None),
    ("peer fd00:4::/64: deleted", None),
    ("template t1: 1 paths added", None),
    ("template t1 path via fc00:7::: weight 1, class default", None),
    ("template t1: 1 paths deleted", None),
    ("template t1: policy bytes -> adaptive", None),
    ("template peers: 2 added, 2 changed, 0 removed (1 blocks)", None),
    ("fd00:2::/64 path 1: deleted", 5),
    ("fd00:2::/64: 4 paths added", 9),
    ("fd00:2::/64 path 0: weight 3, class gold", 10),
    ("fd00:2::/64: policy bytes -> weighted", 5),
    ("fd00:2::/64: route metrics defaults -> {'rto_min': '10ms'}", 5),
    ("peer fd00:3::/64: added with 1 paths", 16),
    ("template t2: deleted", None),
]


def _plan(want: config.Config, have: config.Config) -> list[changes.Change]:
    ids = {p["prefix"]: list(range(sum(e.get("entropy", 1) for e in p["paths"])))
           for p in have.data.get("peers", [])}
    return config.plan(want.data, have.data, None, ids)


def test_plan_is_typed_changes_in_order():
    want, have = config.load(WANT, "want.yaml"), config.load(HAVE, "have.yaml")
    plan = _plan(want, have)
    assert [(c.describe(), c.line(want)) for c in plan] == EXPECTED
    assert all(isinstance(c, changes.Change) for c in plan)
    # what `apply -j` shows: the kind, then the fields, no bookkeeping
    shown = [c.public() for c in plan]
    assert shown[0] == {"what": "attach", "key": "ack_timeout_us", "from": 1000, "to": 2000}
    assert shown[13] == {"what": "path", "action": "add", "prefix": "fd00:2::/64",
                         "entries": [{"via": ["fc00:1::", "fc00:2::"]}, {"usid": "fc00:0:e1:2::"},
                                     {"entropy": 1, "sid": "fc00::9"}, {"entropy": 1, "sid": "fc00::9"}]}
    assert shown[14]["from"] == {"via": ["fc00:3::"], "class": "gold", "denied": True}
    assert "index" not in str(shown) and "indexes" not in str(shown)


def test_a_file_equal_to_the_running_one_plans_nothing():
    want = config.load(WANT, "want.yaml")
    assert _plan(want, config.load(config.dump(want.data), "again.yaml")) == []


def test_a_fresh_attach_plans_everything_after_the_attach_section():
    want = config.load(WANT, "want.yaml")
    plan = config.plan(want.data, {"version": 1, "attach": want.data["attach"]}, None)
    assert [c.describe() for c in plan] == [
        "class gold: DSCP 46", "class bulk: DSCP 8,10", "template t1: added with 2 paths",
        "template peers: 4 added, 0 changed, 0 removed (1 blocks)",
        "peer fd00:2::/64: added with 6 paths", "peer fd00:3::/64: added with 1 paths"]


def _template_file(vias: list[int]) -> str:
    paths = ", ".join(f'{{via: ["fc00:7::{i:x}"]}}' for i in vias)
    return f"""version: 1
attach: {{devices: [eth0], sid: "fc00::1"}}
templates:
  - name: t1
    paths: [{paths}]
"""


def test_a_full_templates_changed_paths_are_replaced_in_place():
    """A template with no free slot cannot add before it deletes: its
    changed paths become one in-place replacement; one with room adds,
    then deletes, as before."""
    full = config.load(_template_file(list(range(256))), "have.yaml")
    changed = list(range(256))
    changed[5], changed[200] = 0x105, 0x1c8
    plan = _plan(config.load(_template_file(changed), "want.yaml"), full)
    assert len(plan) == 1 and isinstance(plan[0], changes.ReplaceTemplatePaths)
    assert plan[0].public() == {"what": "template_path", "action": "replace", "name": "t1",
                                "pairs": [{"from": {"via": ["fc00:7::5"]}, "to": {"via": ["fc00:7::105"]}},
                                          {"from": {"via": ["fc00:7::c8"]}, "to": {"via": ["fc00:7::1c8"]}}]}
    assert plan[0].describe().startswith("template t1: 2 paths replaced in place (no free slot)")
    roomy = config.load(_template_file(list(range(200))), "have.yaml")
    plan = _plan(config.load(_template_file([0x105] + list(range(1, 200))), "want.yaml"), roomy)
    assert [c.describe() for c in plan] == ["template t1: 1 paths added", "template t1: 1 paths deleted"]
