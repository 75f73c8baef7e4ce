/* SPDX-License-Identifier: GPL-2.0 */
/* The event log of path state changes.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_EVENTS_H
#define MRC_COMMON_EVENTS_H

/* events: a circular log of path state changes, MRC_EVENTS entries */
#define MRC_EVENTS		1024
#define MRC_EVENT_RING_PAGES	16	/* mrc_event_ring: 64 KiB, ~2000 events unread */
#define MRC_EV_DOWN		1	/* not acknowledged within ack_timeout */
#define MRC_EV_UP		2	/* a probe (or late packet) was acknowledged */
#define MRC_EV_FAIL_OPEN	3	/* every path of the peer is down: sending anyway */
#define MRC_EV_LATE		4	/* up: its packets from before the down arrived late */
#define MRC_EV_KEPT		5	/* overdue, but kept: taking it out would leave the
					 * peer fewer than min_active usable paths */
#define MRC_EV_SHARED_DOWN	6	/* its first hop is suspect (another path through it
					 * went down) and its probe went unanswered */
#define MRC_EV_SKIP		7	/* the peer reported CE on it: left out of the spray
					 * for skip_rotations turns (congestion, still up) */
#define MRC_EV_PORT_DOWN	8	/* the peer said its device of a plane is down (port
					 * status, lib/ports.h): that plane's paths are out until
					 * a probe answers; path_id is MRC_EV_PLANE + the plane */
#define MRC_EV_OWN_PORT_DOWN	9	/* our own device of a plane went down (bpf/mrc_ports.c):
					 * path_id MRC_EV_PLANE + the plane, peer_id MRC_EV_NO_PEER */
#define MRC_EV_OWN_PORT_UP	10	/* ... and came back up */
#define MRC_EV_PORT_TOLD	11	/* we told the peer our port status changed, at once,
					 * from a packet of any peer (lib/port_tell.h): path_id
					 * is the path the feedback took */
#define MRC_EV_PLANE		0xff00
#define MRC_EV_NO_PEER		0xffffffff	/* an event of ours, not of a peer */

struct mrc_event {
	__u64	seq;		/* 1, 2, ...: position in the log (0: empty slot) */
	__u64	ns;		/* CLOCK_MONOTONIC */
	__u64	since_ns;	/* DOWN: the unacknowledged send that timed out */
	__u32	peer_id;
	__u16	path_id;
	__u16	type;		/* MRC_EV_* */
};

#endif /* MRC_COMMON_EVENTS_H */
