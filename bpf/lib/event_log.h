/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The event log of path state changes (struct mrc_event, MRC_EV_*): a
 * circular log in mrc_events, its sequence in mrc_event_seq, and a ring
 * that wakes the readers (datapath/ringbuf.py).  Written by failover
 * (lib/failover.h) and path selection (lib/path_select.h).
 */
#ifndef MRC_LIB_EVENT_LOG_H
#define MRC_LIB_EVENT_LOG_H

#include "lib/maps.h"

static __always_inline void failover_event_log(__u32 peer_id, __u16 path_id, __u16 type, __u64 now,
				      __u64 since)
{
	__u32 zero = 0, slot;
	__u64 *seq = mrc_event_seq.lookup(&zero), n;
	struct mrc_event *ev;

	if (!seq)
		return;
	n = __sync_fetch_and_add(seq, 1) + 1;
	slot = n % MRC_EVENTS;
	ev = mrc_events.lookup(&slot);
	if (!ev)
		return;
	ev->ns = now;
	ev->since_ns = since;
	ev->peer_id = peer_id;
	ev->path_id = path_id;
	ev->type = type;
	ev->seq = n;	/* last: a reader takes seq 0 as an unwritten slot */
	/* the ring is the readers' doorbell: each reads the log above at its
	 * own position (datapath/ringbuf.py); FORCE_WAKEUP wakes every one of
	 * them, as they keep a record unread.  A full ring (nobody reading)
	 * drops the copy; the log keeps the event. */
	mrc_event_ring.ringbuf_output(ev, sizeof(*ev), BPF_RB_FORCE_WAKEUP);
}

#endif /* MRC_LIB_EVENT_LOG_H */
