"""An emulated two-tier leaf-spine fabric of network namespaces.

`mrcctl fabric up` builds it, `show` describes it, `down` removes it; the
state is a JSON file under STATE_DIR (on /run, which `ip netns exec`
leaves alone), so every later command finds the fabric.

Shape: P planes; plane p has K spines and L leaves, every leaf linked to
every spine of its plane.  Hosts 1..L*H each have one NIC per plane (eth<p>)
to leaf (h-1)//H+1 of that plane.

Names (nodes are namespaces NAME-<node>; devices are short and repeat
across namespaces):

  plane 0:  spines s1..sK, leaves l1..lL      plane p>0: p<p>s1.., p<p>l1..
  hosts:    h1..h<L*H> (one per plane-independent host)
  devices:  host eth<p> (its NIC in plane p); leaf s<k> (uplink to spine
            k) and h<h> (to host h); spine l<l> (to leaf l)
  links:    "<spine>-<leaf>" (s1-l2, p1s1-p1l2), "<host>-<leaf>" (h1-l1,
            h1-p1l1); either order is accepted.  "a>b" is the direction a
            to b only (a fault is installed on b's ingress).  A node name
            (s1, l2, h3) stands for all of its links.

Addressing (test ranges only):

  uSID block fc00:0::/32, 16-bit IDs.  Spine s of plane p: ID
  0x100*(p+1)+s, SID fc00:0:<id>:: (End, or End with NEXT-C-SID for uSID);
  a described fabric of more than 255 spines a plane (rendered only):
  ID (p+1)<<12 | s, plane p's spines in fc00:0:<(p+1)000>::/36.
  Host h: ID 0xe000+h, SID fc00:0:<id>:: on every plane.
  Host data: fd00:0:<h>::1/128 on lo (prefix fd00:0:<h>::/64) and
  198.18.<h/256>.<h%256>/32 on lo.
  Spine-leaf links: fd01:<p>:<s>:<l>::1/64 (spine), ::2 (leaf).
  Host-leaf links: link-local only, fe80::1 (leaf) and fe80::2 (host), so a
  host's only global addresses are its data addresses (source selection).

Routing: hosts send fc00:0:<(p+1)00>::/40 (plane p's spines) out of eth<p>,
everything else of fc00::/16, fd00::/16 and 198.18.0.0/15 out of eth0 (plane
0).  A peer's paths are one per plane and spine while they number at most
256 (a path id is a byte); beyond, each plane's spines are dealt into k
groups (spine s in group (s-1) mod k) and host a reaches host b over group
(a+b) mod k of every plane (Fabric.spine_groups).  Leaves route spine SIDs to their spine (static), their own hosts'
SIDs/prefixes to the host, and remote hosts' SIDs/prefixes by kernel ECMP
over all spines of the plane, hashed as --hash says (plan.HASHES): l4, the
5-tuple (fib_multipath_hash_policy 3, fields 0x37: what policy 1 means on a
switch; the default), or flowlabel, the kernel's own default (policy 0: IPv6
addresses + flow label), under which Linux TCP moves a connection by drawing
a new flow label (PRR on an RTO, PLB on congestion).
Spines route every host SID/prefix to the host's leaf in their plane.

A fabric can also be described in a file (description.py: `fabric up
--from FILE`), from which render.py renders each host's config (`mrcctl
render FILE --host NAME`, `fabric attach --render`); sizing.py is `fabric
plan`.  The address plan's two /32s (fc00:0::/32 for SIDs, fd00:0::/32 for
data prefixes, below) are the spec's sid_block and data_block.

--encoding ev: no SRv6 in the fabric (seg6 off on every switch, no SIDs on
the spines), leaves hash the flow label (fib_multipath_hash_policy 0), one
plane; `attach` gives each host entropy paths (--entropy N, default 64).
"""
from __future__ import annotations

from .plan import (DEFAULT_ENTROPY, DEFAULT_HASH, HASHES, check_hash, DEFAULT_MTU, DEFAULT_NAME, DEFAULT_RATE, ENCODINGS, MAX_MTU, MIN_MTU, MODES,  # noqa: F401
                   QUEUE_LATENCY, STATE_DIR, SYSCTL_RE, Fabric, parse_mode, parse_rate)
from .state import check_name, existing_namespaces, list_names, load, locked, state_path  # noqa: F401
from .build import down, up  # noqa: F401
from .show import describe, node_ns  # noqa: F401
from .failures import fail, heal  # noqa: F401
from .attach import attach, attach_rendered, detach  # noqa: F401
from .hashing import read as read_hash, set_hash  # noqa: F401
