/* SPDX-License-Identifier: GPL-2.0 */
/* A peer's paths: as the loader writes them, as the datapath keeps them
 * (path_live) and as the peer reports them (path_health).
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_PATHS_H
#define MRC_COMMON_PATHS_H

#include "sizes.h"
#include "peers.h"

/* mrc_path.state */
#define MRC_PATH_UNUSED		0
#define MRC_PATH_UP		1
/* Denied by the operator (mrcctl path deny): in no spray list, never sent
 * on nor probed until allowed again.  (Taken out by the datapath is not a
 * state here but mrc_path_live.down_ns: "assumed bad", and probed.) */
#define MRC_PATH_DENIED		2

/* mrc_path.flags */
#define MRC_PATH_F_REDIRECT	0x01	/* next hop differs from the peer route's */
#define MRC_PATH_F_USID		0x02	/* segments[0] is a uSID container: no SRH */
/* An entropy path (an EV, as MRC calls it): no segment list.  The outer
 * destination is the peer's SID itself (segments[0] == peer_sid) and the
 * packet is encapsulated as a uSID path is (Destination Options carry
 * the TLV), so MRC_PATH_F_USID is set too; the fabric's ECMP hashing of
 * the outer flow label, which is the path's own, chooses where it goes.
 * segments[1], never sent (n_segments is 1), holds the first-tier hop
 * `mrcctl path trace --order` learnt for it, or zeros (control/ev_trace.py). */
#define MRC_PATH_F_ENTROPY	0x04
/* A spare EV (issue 29): in no spray list, held back until a path of its
 * plane is taken out; then it takes that path's turns (struct mrc_spares) */
#define MRC_PATH_F_SPARE	0x08

/*
 * paths: array indexed by peer_id * MRC_MAX_PATHS + path_id.  The segment
 * list is stored as it goes on the wire (segments[0] is the last segment
 * to visit, RFC 8754 section 2), so the datapath copies it verbatim.
 *
 * The loader resolves each path's first hop (device and next hop towards
 * its first segment) when the path is added.  The kernel routed the inner
 * packet via the next hop of the peer prefix's route; a path whose first
 * hop differs is sent with bpf_redirect_neigh() to its own.
 */
struct mrc_path {
	struct mrc_sid	segments[MRC_MAX_SEGMENTS];
	/* where the path ends: the peer's SID, its outer source when it
	 * answers, under which its feedback is filed (for an SRH path the
	 * last segment; for uSID the container's last ID under the block) */
	struct mrc_sid	peer_sid;
	__u8	nexthop[16];	/* IPv6 next hop towards segments[last] */
	__u32	oif;		/* device of that next hop */
	__u32	flowlabel;	/* outer flow label: the path's entropy */
	__u16	weight;
	__u8	n_segments;
	__u8	state;		/* MRC_PATH_* */
	__u8	flags;		/* MRC_PATH_F_* */
	__u8	tclass;		/* 0: shared; k: reserved for traffic class k */
	__u8	pad[2];
};

/*
 * spares: hash (allocated as used), a row (template_id) -> for each path
 * id the spare EV that stands in for it while it is taken out (down_ns),
 * + 1 (0: none): the loader's choice among the row's spares of the
 * path's plane (the same device and traffic class, and the same first
 * hop where `path trace --order` recorded one), spread so that the
 * plane's paths use its spares in turn.  TX sends the path's turns on it
 * while it is not out itself (lib/path_select.h, path_select_spare).
 */
struct mrc_spares {
	__u16	of[MRC_MAX_PATHS];
};

/*
 * path_health: per path in peer_state, the sender's view of its paths as the
 * peer reported them in feedback.  Read by the adaptive policy.
 */
struct mrc_path_health {
	__u64	updated_ns;	/* when feedback last arrived */
	__u64	loss_ns;	/* when the reported loss count last grew */
	__u16	qdelay_us;	/* as the wire carries it (fb_qdelay_us) */
	/* when the peer last reported congestion on the path (a CE mark or
	 * a trim: MRC_F_FB_CE), in units of 2^MRC_CE_STAMP_SHIFT ns, 16 bits
	 * (wrapping every 68.7 s); 0: never.  Widens the path's ack clock
	 * for a while (peer_path_queue_allowance): congestion, not failure.
	 * 16 bits in what qdelay_us did not use: the row state stays 128
	 * bytes a path (docs/design/scale.md's memory model) */
	__u16	ce_stamp;
	__u32	lost;		/* last reported cumulative loss */
};

/*
 * path_live: per path of a row in row_state, the datapath's own state of
 * each path, apart from the loader's `paths` so neither overwrites the
 * other.  A path goes down when packets sent on it go unacknowledged
 * (each peer's clock: struct mrc_path_clock)
 * while later ones on other paths are acknowledged (lib/failover.h): a
 * black hole or a dead link, detected by the next packet that would use
 * it, with no timer and no user space.  A down path
 * gets one packet per probe interval; an acknowledgement brings it back.
 */
struct mrc_path_live {
	__u64	down_ns;		/* 0: up */
	__u64	next_probe_ns;		/* down: when a packet may try it again */
	__u64	last_sent_ns;		/* the latest send on the path, to any peer of the row */
	__u64	down_after_ns;		/* the latest send when it went down */
	__u64	late_ns;		/* down: when a send from before the down was acknowledged */
	__u32	downs;			/* times it went down */
	__u32	probes;			/* packets sent on it while down */
	__u64	kept_since_ns;		/* overdue send the floor kept it up for (MRC_EV_KEPT logged) */
	/* down: the interval before next_probe_ns (us), doubled at each
	 * probe from probe_us up to probe_max_us (a dead path is probed ever
	 * less often), at least 1 s / probe_budget */
	__u32	probe_gap_us;
	__u32	ce_reports;		/* the peer's reports that said CE (MRC_F_FB_CE) */
	/* Skip (MRC's SKIP, UET's skipped ECN-marked EV): congestion, not
	 * failure.  A CE report not yet acted on (ce_reports above the high
	 * 32 bits) leaves the path out of the spray for
	 * config.skip_rotations of its turns (the low 32 bits count them
	 * down); counted in the floor (min_active) while it lasts, never
	 * taken down for it.  One word: one compare-and-swap (16 bytes a
	 * path at most: the 64 MB of 131,072 peers, docs/design/scale.md) */
	__u64	skip;			/* ce_reports acted on << 32 | turns left */
};

#endif /* MRC_COMMON_PATHS_H */
