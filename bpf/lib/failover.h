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

/*
 * How long a path's packet may trail the peer's acknowledgements of
 * later ones on other paths: ack_timeout, or the wider window late
 * packets taught (struct mrc_peer_acks), which halves back once it has
 * held MRC_REORDER_HOLD_NS without a late packet.
 */
static __always_inline __u64 ack_window(struct mrc_peer_acks *acks, const struct mrc_config *cfg,
					__u64 now)
{
	__u64 base = (__u64)cfg->ack_timeout_us * 1000;
	__u64 wide = acks->window_ns;

	if (!wide)
		return base;
	if (now > acks->window_hold_ns) {
		wide = wide / 2 > base ? wide / 2 : 0;
		acks->window_ns = wide;
		acks->window_hold_ns = now + MRC_REORDER_HOLD_NS;
	}
	return wide > base ? wide : base;
}

/*
 * Since when have the path's acknowledgements stood still, counting from
 * no earlier than its oldest unacknowledged send?  A live path keeps
 * delivering while its queue drains, so its acknowledgements keep moving
 * however far its packets trail the other paths'; a dead one's freeze.
 * Judging by how far a path's sends trail the others' acknowledged sends
 * (as RACK does for TCP) took live paths down: on a loaded fabric the
 * queues of equally sprayed paths drift apart by up to a buffer's depth
 * (each drains exactly what it gets), 6-8 false downs per path in 8 s for
 * one TCP flow over 4 x 100 Mbit/s with 20 ms buffers.  Allowing a path
 * its reported queue stopped those but saw a black hole about a queue
 * late when every path queued alike (3-24 ms at 9000 bytes); allowing
 * only the excess over the peer's smallest report brought the false downs
 * back; and a black hole behind a shorter queue than the others' was
 * still seen that difference late.  A clock that stands still needs no
 * estimate of any queue.  A path sprayed thinner than one arrival per
 * window looks frozen between its packets: late packets widen the window
 * for it.
 */
static __always_inline __u64 acks_still_since(const struct mrc_peer_acks *acks, __u16 path_id,
					      __u64 since)
{
	__u64 moved = acks->moved_ns[path_id & (MRC_MAX_PATHS - 1)];

	return moved > since ? moved : since;
}

/*
 * A path taken down turned out late, not dead: double the window, up to
 * reorder_max_us.  Doubling, as a backoff: paths whose delays differ by D
 * cost at most log2(D / ack_timeout) + 1 false downs before the window
 * covers D, and a hold later it halves back, so a black hole is again
 * seen within ack_timeout once the paths agree again.
 */
static __always_inline void ack_window_widen(struct mrc_peer_acks *acks,
					     const struct mrc_config *cfg, __u64 now)
{
	__u64 max = (__u64)cfg->reorder_max_us * 1000;
	__u64 wide = 2 * ack_window(acks, cfg, now);

	if (wide > max)
		wide = max;
	if (wide > acks->window_ns)
		acks->window_ns = wide;
	acks->window_hold_ns = now + MRC_REORDER_HOLD_NS;
}

/*
 * May this packet take the path?  Applies what feedback said since the
 * last look (acknowledged: the clock stops, a down path comes back up),
 * and takes the path down when it is overdue: its acknowledgements have
 * stood still for a window (acks_still_since) while the peer went on
 * hearing other paths a window after that, so it is not merely slow,
 * nothing is; or while the peer went on sending feedback for
 * MRC_SILENCE_FACTOR windows (no other path carries anything).  A peer
 * that stops talking altogether takes no path down (there is nothing to
 * compare with), and one that never sent feedback (no mrc-ebpf there) has
 * no clock at all.
 */
static __always_inline enum path_use path_check(struct mrc_path_live *live,
						const struct mrc_config *cfg,
						__u32 peer_id, __u16 path_id, __u64 now)
{
	struct mrc_peer_acks *acks = peer_acks.lookup(&peer_id);
	__u64 probe_ns = (__u64)cfg->probe_us * 1000;
	__u64 since = live->unacked_since_ns;
	__u64 down = live->down_ns;
	__u64 acked, window, still;

	if (!acks || !acks->last_ns)
		return PATH_USE;
	acked = acks->ns[path_id & (MRC_MAX_PATHS - 1)];
	if (since && acked > live->clock_after_ns) {
		live->unacked_since_ns = 0;
		since = 0;
	}
	/* back up on news of the last packet before the down, or a later one;
	 * late if that came first (feedback_late) */
	if (down && acked >= live->down_after_ns &&
	    __sync_bool_compare_and_swap(&live->down_ns, down, 0)) {
		if (live->late_ns > down) {
			/* sent before the down: the path was late, not dead */
			ack_window_widen(acks, cfg, now);
			event_log(peer_id, path_id, MRC_EV_LATE, now, down);
		} else {
			event_log(peer_id, path_id, MRC_EV_UP, now, down);
		}
		down = 0;
	}
	if (down) {
		__u64 due = live->next_probe_ns;

		if (now < due || !__sync_bool_compare_and_swap(&live->next_probe_ns, due, now + probe_ns))
			return PATH_SKIP;
		return PATH_PROBE;
	}
	if (!since)
		return PATH_USE;
	window = ack_window(acks, cfg, now);
	still = acks_still_since(acks, path_id, since);
	if (now > still + window && (acks->moved_any_ns > still + window ||
				     acks->last_ns > still + window * MRC_SILENCE_FACTOR)) {
		/* one CPU wins the transition and logs it */
		if (__sync_bool_compare_and_swap(&live->down_ns, 0, now)) {
			live->down_after_ns = live->last_sent_ns;
			live->next_probe_ns = now + probe_ns;
			live->downs++;
			event_log(peer_id, path_id, MRC_EV_DOWN, now, since);
		}
		return PATH_SKIP;
	}
	return PATH_USE;
}

/* After a packet left on the path: start its acknowledgement clock, if
 * the peer has ever acknowledged anything (else there is no clock: a
 * clock started before the peer's first feedback would run out on it). */
static __always_inline void path_sent(struct mrc_path_live *live, __u32 peer_id, __u64 now)
{
	struct mrc_peer_acks *acks;
	__u64 before = live->last_sent_ns;

	live->last_sent_ns = now;
	if (live->unacked_since_ns)
		return;
	acks = peer_acks.lookup(&peer_id);
	if (acks && acks->last_ns) {
		live->clock_after_ns = before;
		live->unacked_since_ns = now;
	}
}

#endif
