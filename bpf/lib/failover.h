/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Failover inside the datapath (see struct mrc_path_live).  No timers: a
 * path's acknowledgement deadline is checked by the next packet that
 * would take it, so a dead path is excluded by the first packet sent
 * after its deadline, microseconds later, with no user space involved.
 */
#ifndef MRC_LIB_FAILOVER_H
#define MRC_LIB_FAILOVER_H

#include "lib/maps.h"
#include "lib/compiler.h"

static __always_inline void event_log(__u32 peer_id, __u16 path_id, __u16 type, __u64 now,
				      __u64 since)
{
	__u32 zero = 0, slot;
	__u64 *seq = event_seq.lookup(&zero), n;
	struct mrc_event *ev;

	if (!seq)
		return;
	n = __sync_fetch_and_add(seq, 1) + 1;
	slot = n % MRC_EVENTS;
	ev = events.lookup(&slot);
	if (!ev)
		return;
	ev->ns = now;
	ev->since_ns = since;
	ev->peer_id = peer_id;
	ev->path_id = path_id;
	ev->type = type;
	ev->seq = n;	/* last: a reader takes seq 0 as an unwritten slot */
}

enum path_use {
	PATH_SKIP,	/* down, and not its turn to be probed */
	PATH_USE,	/* up */
	PATH_PROBE,	/* down: this packet tests it */
};

/* When feedback last said the peer heard from this path (0: never);
 * -1 if the peer never sent feedback at all (it cannot acknowledge). */
static __always_inline __u64 path_acked_ns(__u32 peer_id, __u16 path_id)
{
	struct mrc_peer_acks *acks = peer_acks.lookup(&peer_id);

	if (!acks || !acks->last_ns)
		return (__u64)-1;
	return acks->ns[path_id & (MRC_MAX_PATHS - 1)];
}

/*
 * May this packet take the path?  Applies what feedback said since the
 * last look (acknowledged: the clock restarts, a down path comes back up),
 * and takes the path down when its acknowledgement is overdue.
 */
static __always_inline enum path_use path_check(struct mrc_path_live *live,
						const struct mrc_config *cfg,
						__u32 peer_id, __u16 path_id, __u64 now)
{
	__u64 probe_ns = (__u64)cfg->probe_us * 1000;
	__u64 acked = path_acked_ns(peer_id, path_id);
	__u64 since = live->unacked_since_ns;
	__u64 down = live->down_ns;

	if (acked == (__u64)-1)
		return PATH_USE;	/* a peer without feedback: no clock to run */
	if (since && acked >= since) {
		live->unacked_since_ns = 0;
		since = 0;
	}
	/* back up only on news of a packet sent after it went down: one
	 * acknowledged after the latest probe left (or after it went down) */
	if (down && acked > live->next_probe_ns - probe_ns &&
	    __sync_bool_compare_and_swap(&live->down_ns, down, 0)) {
		event_log(peer_id, path_id, MRC_EV_UP, acked, down);
		down = 0;
	}
	if (down) {
		__u64 due = live->next_probe_ns;

		if (now < due || !__sync_bool_compare_and_swap(&live->next_probe_ns, due, now + probe_ns))
			return PATH_SKIP;
		return PATH_PROBE;
	}
	if (since && now - since > (__u64)cfg->ack_timeout_us * 1000) {
		/* one CPU wins the transition and logs it */
		if (__sync_bool_compare_and_swap(&live->down_ns, 0, now)) {
			live->next_probe_ns = now + probe_ns;
			live->downs++;
			event_log(peer_id, path_id, MRC_EV_DOWN, now, since);
		}
		return PATH_SKIP;
	}
	return PATH_USE;
}

/* After a packet left on the path: start its acknowledgement clock. */
static __always_inline void path_sent(struct mrc_path_live *live, __u64 now)
{
	if (!live->unacked_since_ns)
		live->unacked_since_ns = now;
}

#endif
