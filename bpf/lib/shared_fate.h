/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Shared fate: two paths taken out through one first hop make it
 * suspect, and every other path of every peer through that hop is tested
 * at once instead of each losing its own data first.  A suspect path the peer has not
 * acknowledged since the suspicion began is skipped, and its next turn
 * sends a header-only probe copy (as for a down path); it is taken out
 * when the peer acknowledges sends a window after the probe on other
 * paths but not the probe (the failover rule, applied to the probe), and
 * used again as soon as the probe, or any later send, is acknowledged.
 * O(1) per packet: two array lookups.  Design: docs/design/shared-fate.md.
 */
#ifndef MRC_LIB_SHARED_FATE_H
#define MRC_LIB_SHARED_FATE_H

#include "lib/maps.h"
#include "lib/compiler.h"

/* shared_fate_check(): this packet's turn tests the path with a probe copy */
#define FATE_PROBE_NOW	1


static __always_inline struct mrc_hop *shared_fate_hop(struct mrc_path_fate *pf)
{
	__u32 hop;

	if (!pf || !pf->hop)
		return NULL;
	hop = pf->hop;
	barrier_var(hop);
	hop &= MRC_MAX_HOPS - 1;
	return mrc_hops.lookup(&hop);
}

/* `index`: the path's place in its row (path_fate), which names its hop;
 * `who`: peer_id << 16 | path_id.  The path was just taken out
 * (`shared`: by its probe, as counted on the hop), or is out and due
 * another probe (its last one went unanswered).
 * A hop not suspect becomes suspect only when a second path through it
 * goes down within a hold of the last lone one, and the suspicion starts
 * at that first down (a path heard since is clear): one down alone is
 * most often false (a live path's acknowledgement trailed, thousands of
 * them on a loaded machine), and made every idle path of the hop skipped
 * for a round trip; a black hole takes the second path out a turn later.
 * A suspicion already running is extended by a hold from now and keeps
 * its start: a hop that fails only in part does not have its live paths
 * probed again at every probe of its dead ones. */
static __always_inline void shared_fate_path_down(const struct mrc_config *cfg, __u32 index, __u64 who,
						  int shared, __u64 now)
{
	__u64 hold = (__u64)cfg->probe_us * 1000 * MRC_FATE_HOLD_FACTOR;
	struct mrc_path_fate *pf;
	struct mrc_hop *h;
	__u64 until, lone;

	if (!cfg->shared_fate)
		return;
	pf = mrc_path_fate.lookup(&index);
	h = shared_fate_hop(pf);
	if (!h)
		return;
	if (shared)
		__sync_fetch_and_add(&h->shared_downs, 1);
	until = h->until_ns;
	if (now < until) {
		if (now + hold > until)
			h->until_ns = now + hold;
		return;
	}
	lone = h->lone_ns;
	if (!lone || now >= lone + hold || h->lone_who == who) {
		/* the first (or the same path still out): remembered */
		h->lone_ns = now;
		h->lone_who = who;
		return;
	}
	if (__sync_bool_compare_and_swap(&h->until_ns, until, now + hold)) {
		h->suspect_ns = lone;
		h->lone_ns = 0;
		__sync_fetch_and_add(&h->suspects, 1);
	}
}

/*
 * An up path's verdict: 0, its hop is not suspect or the peer heard it
 * since the suspicion began (`acked`: peer_acks.ns); FATE_PROBE_NOW, this
 * packet's turn tests it with a probe copy; else the send time of its
 * probe, not yet heard: the path is skipped, and the caller judges it by
 * the probe as by its oldest unacknowledged send (taken out when the
 * peer has heard sends a window later on other paths).
 */
static __always_inline __u64 shared_fate_check(const struct mrc_config *cfg, __u32 index,
					       __u64 *probe_ns, __u64 acked, __u64 now)
{
	struct mrc_path_fate *pf;
	struct mrc_hop *h;
	__u64 since, sent;

	if (!cfg->shared_fate)
		return 0;
	pf = mrc_path_fate.lookup(&index);
	h = shared_fate_hop(pf);
	if (!h || !pf)
		return 0;
	since = h->suspect_ns;
	if (!since || now >= h->until_ns || acked >= since)
		return 0;
	sent = *probe_ns;	/* the peer's own (learnt state): rows are shared */
	if (sent >= since)
		return sent;
	/* one CPU sends the probe; the others skip the path (a send time
	 * is never 1: the clock has run for more than a nanosecond) */
	return __sync_bool_compare_and_swap(probe_ns, sent, now) ? FATE_PROBE_NOW : now;
}

#endif
