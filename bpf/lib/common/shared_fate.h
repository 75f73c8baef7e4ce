/* SPDX-License-Identifier: GPL-2.0 */
/* Shared fate: first hops and the paths through them.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_SHARED_FATE_H
#define MRC_COMMON_SHARED_FATE_H

#include "peers.h"

/* ---- shared fate (lib/shared_fate.h) -------------------------------- */
/*
 * A path's first hop (SRH: its first segment; uSID: the block and its
 * first ID) gets a small id from the loader when the path is added, the
 * same for every path of every peer through that hop; 0 is no hop
 * (entropy paths: the fabric's hash picks their hops).  When a second
 * path through it is taken out within MRC_FATE_HOLD_FACTOR x probe_us of
 * another (one down alone is most often a false one), its hop becomes
 * suspect, from the first down on: every other path through it that
 * the peer has not acknowledged since is skipped and tested at once by a
 * header-only probe copy, and taken out if the peer acknowledges later
 * sends on other paths but not that probe.  The suspicion holds while a
 * path through the hop is out and its probes go unanswered, each due
 * probe extending it by MRC_FATE_HOLD_FACTOR x probe_us.  It also
 * becomes suspect, at once, when the hop's watched send (the oldest one
 * through it not known to have arrived) is overdue by the failover rule:
 * its peer acknowledged sends a window later on other paths, not it.
 */
#define MRC_MAX_HOPS		256	/* hop ids 1..255 per attachment */
#define MRC_FATE_HOLD_FACTOR	4

/* hops: array by hop id */
struct mrc_hop {
	struct mrc_sid	sid;	/* loader: the first-hop SID (all zero: slot free) */
	__u64	suspect_ns;	/* datapath: when its suspicion began; 0: never */
	__u64	until_ns;	/* datapath: suspect until then */
	__u64	suspects;	/* times it became suspect */
	__u64	shared_downs;	/* paths taken out because their probe went unanswered */
	/* datapath: the last down through it that made it suspect of nothing
	 * (a lone down: a second path's within the hold does) and whose it
	 * was (peer_id << 16 | path_id) */
	__u64	lone_ns;
	__u64	lone_who;
	/* datapath: the watch, the oldest send through it not yet known to
	 * have arrived (any peer's; none: 0) and whose it was; judged by
	 * every packet that would take a path through the hop (a dead hop is
	 * seen one send-to-that-peer after its first loss, not at each
	 * path's own next turn) */
	__u64	watch_ns;
	__u64	watch_who;
	/* the path's send before the watched one: acknowledgements carry a
	 * lower bound (a report's block's), so the watched send was heard
	 * once a send after this one was, as for a path's own clock */
	__u64	watch_after_ns;
	__u64	watch_suspects;	/* times its watch made it suspect */
	/* a second watch, another peer's send taken while the first is
	 * unheard: the first verdict comes from whichever peer reports
	 * sooner (same rules, same fields) */
	__u64	watch2_ns;
	__u64	watch2_who;
	__u64	watch2_after_ns;
	/* datapath: the probe budget (config.probe_budget): no down path's
	 * probe through the hop before this; each probe moves it on by
	 * 1 s / probe_budget */
	__u64	probe_next_ns;
	__u64	probes_held;	/* due probes the budget held back */
};

/* path_fate: array by path index of a row (the peer's own or a
 * template's); the probe's send time is the peer's (mrc_path_state) */
struct mrc_path_fate {
	__u32	hop;		/* loader: hop id (0: none) */
};

#endif /* MRC_COMMON_SHARED_FATE_H */
