/* SPDX-License-Identifier: GPL-2.0 */
/*
 * mrc-ebpf: the one place where the wire format, the map layouts and the
 * counters are defined.  The datapath (bpf/mrc*.c) and its loader
 * (mrc_ebpf/) both read this file: Python parses the #defines and the
 * `enum mrc_counter` from it at run time, and tests/test_layout.py checks
 * the ctypes mirrors (mrc_ebpf/datapath/mirrors.py) against the structs below as
 * bcc compiles them.
 */
#ifndef MRC_COMMON_H
#define MRC_COMMON_H

/* ---- sizes ------------------------------------------------------------ */
#define MRC_MAX_PEERS		256	/* rows of paths: own-path peers plus path templates */
#define MRC_MAX_PATHS		256	/* paths per peer (path ids 0..255) */
#define MRC_MAX_SEGMENTS	6	/* SIDs in one path's segment list */
#define MRC_MAX_TLVS		16	/* TLVs the receiver walks per SRH */
#define MRC_MAX_CLASSES		8	/* traffic classes; 0 is the default class */
#define MRC_SPRAY_SLOTS		1024	/* entries of one spray list */
#define MRC_RX_MAX_PATHS	65536	/* (sender, path) pairs the receiver tracks */
#define MRC_HIST_BUCKETS	16	/* log2 buckets of the receiver's histograms */
#define MRC_REROUTE_TRIES	4	/* other list entries tried when a path is down */
#define MRC_SILENCE_FACTOR	16	/* feedback without this path: down after this x ack_timeout */
/* A peer's widened acknowledgement window halves after this long without
 * a late packet (see struct mrc_peer_acks) */
#define MRC_REORDER_HOLD_NS	1000000000ULL
#define MRC_FB_MARK		0x4d524346	/* skb->mark of a clone that becomes feedback */
#define MRC_MAX_DEVICES		8	/* devices (planes) one attachment spans */
/* skb->mark of a packet `mrcctl probe` sends on one chosen path:
 * MRC_PROBE_MARK | path id (the low 8 bits; MRC_MAX_PATHS is 256) */
#define MRC_PROBE_MARK		0x4d525000
#define MRC_PROBE_MARK_MASK	0xffffff00
/* skb->mark of the header-only copy of a data packet that mrc_tx sends
 * to test a down path, while the packet itself takes a live one:
 * MRC_PROBE_COPY_MARK | path id (under MRC_PROBE_MARK_MASK) */
#define MRC_PROBE_COPY_MARK	0x4d525100

/* ---- the MRC TLV, carried in the SRH (RFC 8754 section 2.1) ----------- */
/*
 * Type 124 is from the "Experimentation and Test" range of IANA's
 * "Segment Routing Header TLVs" registry (124-126).  Its high bit is
 * clear: the value does not change en route.
 */
#define MRC_TLV_TYPE		124
#define MRC_VERSION		1
#define MRC_TLV_SIZE		64	/* whole TLV: keeps the SRH 8-byte aligned */
#define MRC_TLV_LEN		(MRC_TLV_SIZE - 2)	/* the TLV's length field */

/* mrc_tlv.flags */
#define MRC_F_PROBE		0x01	/* sent to test a path, not data */
#define MRC_F_FEEDBACK		0x02	/* the fb_* fields report on one of the peer's paths */
#define MRC_F_CONTROL		0x04	/* feedback only: the receiver consumes it */
/* with MRC_F_FEEDBACK: a packet on the path fb_path_id arrived CE-marked
 * (outer ECN) since that path was last reported so: the fabric's queues
 * on it are filling.  The sender skips the path for a while (struct
 * mrc_path_live.skip); congestion, never a failure. */
#define MRC_F_FB_CE		0x08

struct mrc_tlv {
	__u8	type;		/* MRC_TLV_TYPE */
	__u8	len;		/* MRC_TLV_LEN */
	__u8	version;	/* MRC_VERSION */
	__u8	flags;		/* MRC_F_* */
	__be16	path_id;	/* index of the path in the sender's set */
	__u8	tclass;		/* traffic class the packet was sent in */
	__u8	fb_block;	/* fb_heard covers path ids 64*fb_block .. +63 */
	__be32	path_seq;	/* per (peer, path): a gap is a loss on that path */
	__be32	peer_seq;	/* per peer, across paths: gives reordering */
	__be64	tx_ns;		/* sender's CLOCK_MONOTONIC at encap */
	/* Feedback, piggybacked: how the path fb_path_id of the packets the
	 * receiver of this one sends us is doing, as we measured it. */
	__be16	fb_path_id;
	__be16	fb_qdelay_us;	/* queueing delay (one-way delay above its minimum) */
	__be32	fb_lost;	/* packets lost on that path so far (gaps not filled late) */
	__be64	fb_heard;	/* bit i: we heard from path 64*fb_block+i since we last said */
	/* ...and the newest packet heard on each path in fb_heard was
	 * stamped by its sender (tx_ns, low 32 bits) at or after this: an
	 * acknowledgement in the sender's own clock, so it can tell which of
	 * its sends arrived */
	__be32	fb_since_ns32;
	/* exactly: the newest packet heard on fb_path_id was stamped this */
	__be32	fb_path_tx32;
	/* The sender's epoch (struct mrc_auth): a new one tells the peer the
	 * sender restarted and its sequence numbers begin again. */
	__be32	epoch;
	__u8	key_id;		/* key the MAC is made with; 0: no MAC */
	__u8	reserved[3];	/* zero */
	/* SipHash-2-4 under key key_id of the final destination, the outer
	 * source and this TLV's fields (lib/auth.h gives the order); zero
	 * when key_id is 0 */
	__u8	mac[8];
} __attribute__((packed, aligned(8)));	/* every field is at its natural
					 * offset: aligned, so that clang writes and reads
					 * it a word at a time, not a byte at a time */

/* the bytes of the TLV that the MAC covers: from flags (byte 3; type,
 * length and version are checked for their exact values) to mac[], the
 * feedback words (MRC_TLV_FB_OFF..MRC_TLV_EPOCH_OFF) only when the TLV
 * says it carries feedback (MRC_F_FEEDBACK): a receiver reads them only
 * then */
#define MRC_TLV_MAC_OFF		(MRC_TLV_SIZE - 8)
#define MRC_TLV_FB_OFF		24	/* fb_path_id: the feedback words begin */
#define MRC_TLV_EPOCH_OFF	48	/* epoch, key_id, reserved: one word */

/* SRH fixed part (8) + segment list + MRC TLV */
#define MRC_SRH_LEN(nseg)	(8 + 16 * (nseg) + MRC_TLV_SIZE)
/* what encapsulation adds to each packet: outer IPv6 + SRH */
#define MRC_ENCAP_LEN(nseg)	(40 + MRC_SRH_LEN(nseg))

/* ---- compressed SRv6 (uSID, NEXT-C-SID of RFC 9800) ------------------- */
/*
 * The whole path is the outer destination: a 32-bit locator block, then
 * one 16-bit ID per hop, zeros after the last.  Each switch's End with
 * the next-csid flavor shifts the next ID into place; the host whose ID
 * is last decapsulates.  No SRH: the MRC TLV rides, with the same layout,
 * as an option of a Destination Options header (RFC 8200 section 4.6),
 * whose type is from the experimental range of RFC 4727: 0x1E, action
 * bits 00 (skip if unknown), change bit 0 (not changed en route).
 */
#define MRC_USID_BLOCK_BITS	32
#define MRC_USID_ID_BITS	16
#define MRC_OPT_TYPE		0x1E
#define MRC_OPT_PADN		1	/* PadN option type */
/* Destination Options: next header, length, MRC option, PadN to 8 bytes */
#define MRC_DOH_LEN		(2 + MRC_TLV_SIZE + 6)
#define MRC_USID_ENCAP_LEN	(40 + MRC_DOH_LEN)

#define MRC_HOP_LIMIT		64

/* ---- maps ------------------------------------------------------------- */
/*
 * peers: LPM trie, destination prefix -> peer.  IPv4 destinations are
 * looked up as IPv4-mapped IPv6 (::ffff:a.b.c.d), so one trie serves both.
 * Allocated as used (BPF_F_NO_PREALLOC): the size costs nothing until
 * peers fill it.
 */
#define MRC_MAX_PEER_PREFIXES	262144
/* A SID; a struct, not __u8[N][16], so bcc's ctypes for maps get it right. */
struct mrc_sid {
	__u8	addr[16];
};

struct mrc_peer_key {
	__u32	prefixlen;
	__u8	addr[16];
};

/* mrc_peer.policy: how a packet's path is chosen from its spray list */
#define MRC_POLICY_RR		0	/* round robin */
#define MRC_POLICY_WEIGHTED	1	/* round robin over a list expanded by weight */
#define MRC_POLICY_RANDOM	2	/* uniform random */
#define MRC_POLICY_HASH		3	/* per flow (ECMP-like): the baseline MRC replaces */
#define MRC_POLICY_ADAPTIVE	4	/* best of two random paths by measured health */
#define MRC_POLICY_BYTES	5	/* round robin by bytes: each turn carries a quantum */
/* RoCEv2 (lib/roce.h): each queue pair on one path, QPs spread over the
 * paths by turns; a QP moves only when nothing of it is in flight, or at
 * once when its path is taken out.  Other packets: round robin. */
#define MRC_POLICY_ROCE		6

/*
 * A peer's paths are a row of the paths and spray maps (template_id): its
 * own (a peer added with its paths: template_id == peer_id), or a path
 * template shared by every peer behind one destination leaf, whose last
 * hop is then the peer's own SID (MRC_PEER_F_LAST_HOP): segments[0] and
 * peer_sid of each path are replaced by `sid` as the packet is built.
 * peer_id keys what the datapath learns about the peer (peer_state).
 */
struct mrc_peer {
	__u32	peer_id;	/* key of peer_state, named in events */
	__u16	n_paths;	/* paths 0..n_paths-1 are configured */
	__u8	policy;		/* MRC_POLICY_* */
	__u8	flags;		/* MRC_PEER_F_* */
	__u32	template_id;	/* row in the paths/spray/peer_floor maps */
	struct mrc_sid	sid;	/* MRC_PEER_F_LAST_HOP: the peer's SID */
};

#define MRC_PEER_F_LAST_HOP	0x01	/* paths of a template, ending at `sid` */

/*
 * spray: array indexed by peer_id * MRC_MAX_CLASSES + class: the path ids
 * a packet of that class may take, built by the loader from the paths'
 * states, classes and (for weighted) weights.  Choosing is one index into
 * it, whatever the number of paths.
 */
struct mrc_spray {
	__u32	n;		/* entries in use */
	/* bytes policy: the bytes one turn carries, the largest packet the
	 * peer route lets through (route MTU + Ethernet header), so full-size
	 * packets go one per turn as under rr and smaller ones share a turn */
	__u32	quantum;
	__u16	ids[MRC_SPRAY_SLOTS];
};

/* dscp_class: array of 64, DSCP -> traffic class */

/* templates: hash, a path template's name -> its row, as a peer whose
 * paths it holds (peer_id == template_id == the row) */
struct mrc_template_name {
	char	name[32];
};

/* class_names: array of MRC_MAX_CLASSES, the loader's names for classes */
struct mrc_class_name {
	char	name[16];
};

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
 * path_health: per path in peer_state, the sender's view of its paths as the
 * peer reported them in feedback.  Read by the adaptive policy.
 */
struct mrc_path_health {
	__u64	updated_ns;	/* when feedback last arrived */
	__u64	loss_ns;	/* when the reported loss count last grew */
	__u32	qdelay_us;
	__u32	lost;		/* last reported cumulative loss */
};

/* peer_by_sid: hash, a peer's SID -> peer_id, to file incoming feedback.
 * Every path may end at a SID of its own, and every peer of a template
 * has one; allocated as used (BPF_F_NO_PREALLOC), so the size costs
 * nothing until paths need it (but its buckets). */
#define MRC_MAX_PEER_SIDS	MRC_MAX_PEER_PREFIXES

/*
 * path_live: per path in peer_state, the datapath's own state of each path,
 * apart from the loader's `paths` so neither overwrites the other.
 * A path goes down when packets sent on it go unacknowledged (fb_heard)
 * while later ones on other paths are acknowledged (lib/failover.h): a
 * black hole or a dead link, detected by the next packet that would use
 * it, with no timer and no user space.  A down path
 * gets one packet per probe interval; an acknowledgement brings it back.
 */
struct mrc_path_live {
	__u64	unacked_since_ns;	/* oldest send not yet acknowledged; 0: none */
	__u64	down_ns;		/* 0: up */
	__u64	next_probe_ns;		/* down: when a packet may try it again */
	/* The peer's acknowledgement of a path is often a lower bound (the
	 * oldest of the paths a report covers), below the very send it
	 * acknowledges.  What it proves is "a packet sent after this
	 * arrived": so each state keeps the send that came just before it,
	 * and an acknowledgement past that one counts. */
	__u64	last_sent_ns;		/* the latest send on the path */
	__u64	clock_after_ns;		/* the send before unacked_since_ns */
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

/*
 * peer_floor: array by peer_id, MRC's ev_min_active: the datapath takes
 * no path out that would leave the peer fewer than config.min_active
 * usable ones (lib/floor.h).  How many it has taken out is learnt state:
 * mrc_peer_state.floor_out.
 */
struct mrc_peer_floor {
	__u64	usable;		/* loader: the peer's paths in state UP (not denied) */
};

/*
 * peer_acks: in peer_state: for each of our paths, the send time (our
 * clock) from which on the peer has heard a packet of it.  Each feedback
 * acknowledges a few paths of one block of 64 path ids (the receiver
 * rotates over the blocks with news, lib/feedback.h); filing is one store
 * per bit, and the TX side reads one entry when it checks a path.  A peer
 * that never sent feedback (no mrc-ebpf there, e.g. the kernel's own
 * End.DT6) has no acknowledgement clock: its paths never time out.
 */
struct mrc_peer_acks {
	__u64	ns[MRC_MAX_PATHS];	/* a packet sent at or after this arrived */
	__u64	max_ns;		/* the latest of ns[]: how far the peer has heard us */
	__u64	last_ns;	/* any feedback from this peer (0: never: no failover) */
	/* The window learnt from late packets, as RACK learns its reordering
	 * window from spurious retransmissions: a path taken down whose
	 * packets from before the down are then acknowledged was late, not
	 * dead, so the peer's paths differ in delay by more than the window.
	 * 0: ack_timeout as configured.  Never above reorder_max_us. */
	__u64	window_ns;
	__u64	window_hold_ns;	/* until then window_ns holds, then halves */
};

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

struct mrc_event {
	__u64	seq;		/* 1, 2, ...: position in the log (0: empty slot) */
	__u64	ns;		/* CLOCK_MONOTONIC */
	__u64	since_ns;	/* DOWN: the unacknowledged send that timed out */
	__u32	peer_id;
	__u16	path_id;
	__u16	type;		/* MRC_EV_* */
};

/* fb_due: in peer_state, set by RX when the peer is owed feedback and
 * no packet of ours has carried it lately (one-way traffic). */

/*
 * rx_paths: LRU hash, (sender SID, path id) -> what the receiver saw on
 * that path.  Packets on one path arrive in order, so a gap in path_seq
 * is a loss on that path.
 */
struct mrc_rx_key {
	__u8	sid[16];	/* the sender's SID (outer source) */
	__u16	path_id;
	__u16	pad;
};

struct mrc_rx_path {
	__u64	packets;
	__u64	bytes;
	__u64	lost;		/* sequence numbers skipped */
	__u64	late;		/* arrived behind the path's next expected number */
	__u64	min_owd_ns;	/* smallest one-way delay seen (clock offset included) */
	__u64	last_ns;	/* arrival time of the latest packet */
	__u32	next_seq;	/* next path_seq expected */
	__u32	qdelay_us;	/* moving average of one-way delay above the minimum */
	__u32	qdelay_hist[MRC_HIST_BUCKETS];	/* log2 microseconds */
	/* the sender's epoch next_seq belongs to: another one restarts the
	 * path's sequence (and delay baseline) instead of counting late */
	__u32	epoch;
	__u32	ce;		/* packets that arrived with outer CE (a fabric queue marked them) */
	/* bit i: path_seq next_seq - 2 - i arrived (the replay window of an
	 * authenticated sender: a number arrives once; next_seq - 1 did) */
	__u64	seen;
};

/*
 * rx_peers: LRU hash, sender SID -> reordering across that sender's paths,
 * and which path to report on in our next feedback to it.
 */
struct mrc_rx_peer {
	__u64	packets;
	__u64	reordered;	/* arrived with peer_seq below the highest seen */
	__u64	heard[MRC_MAX_PATHS / 64];	/* paths heard from, not yet reported */
	__u64	loss_news[MRC_MAX_PATHS / 64];	/* paths with a loss not yet reported */
	__u64	ce_news[MRC_MAX_PATHS / 64];	/* paths with a CE mark not yet reported */
	__u64	latest_tx[MRC_MAX_PATHS];	/* per path: the newest sender tx_ns that arrived */
	__u64	fb_sent_ns;	/* when our last feedback to this sender left */
	__u32	max_peer_seq;
	__u16	last_path_id;	/* reported in feedback when nothing is new */
	__u8	fb_block;	/* next block of `heard` to report */
	__u8	pad;
	__u32	reorder_hist[MRC_HIST_BUCKETS];	/* log2 of (highest - peer_seq) */
	__u32	epoch;		/* the sender's latest epoch (lib/auth.h) */
	__u32	restarts;	/* times its epoch changed: it re-attached */
	/* Per block of `heard`: every path in it has sent a packet at or
	 * after heard_since that arrived (the report's lower bound), and the
	 * newest send before that on any of them is heard_need, which the
	 * bound must stay above to acknowledge it (lib/rx_track.h,
	 * rx_track_heard; reported by lib/feedback.h). */
	__u64	heard_since[MRC_MAX_PATHS / 64];
	__u64	heard_need[MRC_MAX_PATHS / 64];
	/* paths heard whose send would drag the bound below heard_need:
	 * reported exactly, one per report */
	__u64	heard_slow[MRC_MAX_PATHS / 64];
};

/* peer_tx: in peer_state; updated with atomic adds, shared by CPUs */
struct mrc_peer_tx {
	__u64	seq;		/* next per-peer sequence number */
	__u64	bytes;		/* bytes policy: bytes sprayed so far (all classes) */
	__u64	fail_open_ns;	/* since when every path is down (0: not) */
	/* The path with the newest acknowledgement TX has seen while choosing
	 * paths, and that acknowledgement: where a TCP retransmission goes
	 * (lib/tcp_steer.h) */
	__u64	heard_ns;
	__u32	heard_path;
	__u32	pad;
};

/*
 * peer_state: LRU hash, peer_id -> everything the datapath learns about a
 * peer and its paths, created (zeroed) by the peer's first packet either
 * way and evicted when idle, so memory follows the peers in use, not the
 * peers configured.  One lookup per packet; a path's part is reached by a
 * masked index inside the value (lib/peer_state.h).  The counters in it
 * are atomic adds shared by CPUs (next to the sequence number the packet
 * takes anyway), not per-CPU copies of every path.
 */
#define MRC_MAX_ACTIVE_PEERS	256	/* peers with learnt state at once */

/*
 * A peer without learnt state (never sent to, or evicted from the LRU)
 * starts its turns at an offset of its own, not at path 0
 * (lib/peer_state.h, peer_state_turn): its id spread by Fibonacci hashing
 * plus how often its state started before, counted in peer_starts (by
 * peer_id mod MRC_PEER_STARTS; 16 bits, four to a word), so peers that keep
 * losing their state still spray over all their paths, and a new state of
 * a peer that had one is counted as made again (MRC_STATE_REMADE).  An
 * LRU insert fails only when no element can be freed for it (not for
 * being full: the oldest is evicted): such a packet is counted
 * (MRC_STATE_FAIL) and dropped as before (MRC_TX_DROP_NO_PATH).
 */
#define MRC_PEER_STARTS		262144	/* a power of two */

/*
 * peer_cache: LRU hash, a destination address -> the peers trie's answer
 * for it (lib/peer_cache.h): one hash lookup per packet however many
 * prefixes the trie holds.  An entry is good while its generation is
 * peers_gen's, which the control plane bumps after every write to peers.
 */
#define MRC_PEER_CACHE		8192
struct mrc_peer_cached {
	struct mrc_peer	peer;
	__u32	gen;		/* peers_gen when it was looked up */
	__u32	found;		/* 0: no prefix covers the address */
	__u32	pad;		/* 8-byte size: bcc's per-CPU copy (peer_buf) needs it */
};

struct mrc_path_state {
	struct mrc_path_live	live;
	struct mrc_path_health	health;
	__u64	seq;		/* next per-path sequence number (atomic: no gaps) */
	__u64	tx_packets;
	__u64	tx_bytes;
	/* shared fate: the probe copy sent for its hop's suspicion; 0: none */
	__u64	fate_probe_ns;
};

/*
 * SipHash-2-4's state after the words of the MAC's message that do not
 * change from packet to packet (lib/auth.h): both SIDs and the sender's
 * epoch word.  TX keeps one per peer (mrc_peer_state.tx_mac), RX one per
 * sender in auth_rx_prefix, an array by a hash of the sender's SID
 * (direct-mapped: a sender whose slot another took gets its own back at
 * its next authentic packet).  Made by the datapath when a packet finds
 * none for its key and words, then reused.  Our own SID is the same for
 * the attachment's life.
 */
#define MRC_AUTH_RX_SENDERS	1024	/* a power of two */

struct mrc_mac_prefix {
	__u64	k0, k1;		/* the key it was made with */
	__u64	words[3];	/* TX: the peer SID's two words and the epoch word;
				 * RX: the sender SID's and the epoch word */
	__u64	v[4];		/* the state */
	__u64	check;		/* XOR of the nine words above: an entry that two
				 * CPUs wrote at once, with different keys, fails it */
};

struct mrc_peer_state {
	struct mrc_peer_tx	tx;
	struct mrc_peer_acks	acks;
	__u64	fb_due;		/* RX: the peer is owed feedback (see fb_due below) */
	__u64	floor_out;	/* paths taken out by the datapath (lib/floor.h) */
	struct mrc_mac_prefix	tx_mac;	/* the MAC's state for what we send it */
	struct mrc_path_state	paths[MRC_MAX_PATHS];
};

/*
 * One device of an attachment: a host with planes has one NIC per plane,
 * all sharing one datapath (one set of maps), and a path leaves by its own
 * plane's device.  The loader's bookkeeping; the datapath ignores it.
 */
struct mrc_device {
	__u32	ifindex;
	__u32	flags;		/* MRC_DEV_F_*: what attach changed, for detach */
	__u32	saved_gso_max_segs;	/* restored at detach */
	__u32	mtu;
	__u32	granularity;	/* MRC_GRAN_*: what attach was asked for (datapath/offload.py) */
	__u32	link_mbps;	/* the link rate auto sized bursts for (0: none) */
};

/* mrc_device.granularity: the order of offload.GRANULARITIES */
#define MRC_GRAN_AUTO		0	/* bursts within 50 us of the slowest link */
#define MRC_GRAN_PACKET		1	/* gso_max_segs 1 */
#define MRC_GRAN_BURST		2	/* the device's own GSO bound */

/* mrc_device.flags; bit 0 means the same in bpf/lab/fault.c's fault_config.flags */
#define MRC_DEV_F_CLSACT_OURS	0x01	/* attach added the clsact qdisc: detach removes it */
#define MRC_DEV_F_XDP_SKB	0x02	/* XDP attached in skb (generic) mode */
#define MRC_DEV_F_XDP_CHAINED	0x04	/* mrc_rx hands on to the device's earlier XDP program (lib/xdp_chain.h) */

/* The timers of mrc_config when `mrcctl attach` is not told otherwise:
 * for a datacenter, round trips of tens of microseconds */
#define MRC_DEFAULT_LOSS_HOLD_US	20000
#define MRC_DEFAULT_ACK_TIMEOUT_US	1000
#define MRC_DEFAULT_PROBE_US		5000
#define MRC_DEFAULT_FB_INTERVAL_US	100
#define MRC_DEFAULT_REORDER_MAX_US	16000
/* Off by default, so that what was measured stays true until they are
 * benchmarked on: 0 keeps probe_us fixed (no backoff), no budget, no skip.
 * Suggested: probe_max_us 1000000, probe_budget 1000, skip_rotations 2
 * (docs/design/failover.md). */
#define MRC_DEFAULT_PROBE_MAX_US	0	/* a down path's probe interval doubles up to this */
#define MRC_DEFAULT_PROBE_BUDGET	0	/* probes a second through one first hop (0: no limit) */
#define MRC_DEFAULT_SKIP_ROTATIONS	0	/* turns a CE-reported path is skipped (0: never) */

/* config: array of one, written by the loader at attach */
struct mrc_config {
	__u8	sid[16];	/* this host's SID: outer source, decap match */
	__u32	mtu;		/* smallest device MTU: encapsulated packets must fit */
	__u32	loss_hold_us;	/* adaptive: a path that lost is avoided this long */
	__u32	ack_timeout_us;	/* a path unacknowledged this long goes down */
	__u32	probe_us;	/* a down path is tried once per this */
	__u32	fb_interval_us;	/* one-way traffic: feedback at least this often */
	__u32	reorder_max_us;	/* late packets widen ack_timeout up to this */
	__u32	retrans_steer;	/* 1: TCP retransmissions avoid paths not heard lately (lib/tcp_steer.h) */
	__u32	n_devices;
	struct mrc_device devices[MRC_MAX_DEVICES];
	__u32	min_active;	/* a peer keeps at least this many paths in use (0: no floor) */
	__u32	shared_fate;	/* 1: a path down makes its first hop suspect (lib/shared_fate.h) */
	/* a path whose peer reported CE on it skips this many of its turns
	 * (about as many rotations of the spray); 0: CE reports skip nothing */
	__u32	skip_rotations;
	__u32	probe_max_us;	/* a down path's probe interval doubles up to this (0: probe_us, fixed) */
	/* down paths' probes a second through one first hop (struct
	 * mrc_hop; a path without one: its own interval), 0: no limit */
	__u32	probe_budget;
};

/* tx_flows: array by a TCP flow's hash (direct-mapped): how far each flow
 * has sent, so that TX tells a retransmission from new data */
#define MRC_TX_FLOWS		4096	/* a power of two */
struct mrc_tx_flow {
	__u32	key;		/* its addresses and ports folded; one flow per slot */
	__u32	snd_nxt;	/* one past the highest sequence number it sent */
};

/* ---- counters: per-CPU array indexed by enum mrc_counter -------------- */
/*
 * Every packet a program sees is counted once in *_SEEN and exactly once
 * in one outcome below it (conservation is tested).  The loader reads the
 * names from this enum: add new ones before MRC_COUNTER_MAX.
 */
enum mrc_counter {
	/* TX, TC egress */
	MRC_TX_SEEN,
	MRC_TX_ENCAP,			/* outcome: encapsulated and sent */
	MRC_TX_PASS,			/* outcome: not for a peer, untouched */
	MRC_TX_DROP_TOO_BIG,		/* outcome: would not fit the MTU */
	MRC_TX_DROP_NO_PATH,		/* outcome: peer without usable path */
	MRC_TX_DROP_ENCAP_FAIL,		/* outcome: the kernel refused the room */
	MRC_TX_ENCAP_BYTES,		/* bytes of encapsulated packets (outer) */
	MRC_TX_REDIRECT,		/* encapsulated, sent to the path's own next hop */
	/* RX, XDP */
	MRC_RX_SEEN,
	MRC_RX_DECAP,			/* outcome: valid, decapsulated, passed up */
	MRC_RX_PASS,			/* outcome: not for our SID, untouched */
	MRC_RX_DROP_TRUNCATED,		/* outcome: frame shorter than its headers */
	MRC_RX_DROP_PAYLOAD_LEN,	/* outcome: outer payload length != frame */
	MRC_RX_DROP_ROUTING_TYPE,	/* outcome: routing header is not an SRH */
	MRC_RX_DROP_SRH_LEN,		/* outcome: hdr_ext_len vs last_entry/packet */
	MRC_RX_DROP_SEGMENTS_LEFT,	/* outcome: segments left > last entry or > 0 */
	MRC_RX_DROP_ACTIVE_SEGMENT,	/* outcome: DA is not segment list[SL] */
	MRC_RX_DROP_TLV,		/* outcome: a TLV overruns the SRH */
	MRC_RX_DROP_MRC_TLV,		/* outcome: MRC TLV of wrong length/version */
	MRC_RX_DROP_INNER_PROTO,	/* outcome: next header not IPv6/IPv4 */
	MRC_RX_DROP_INNER_HEADER,	/* outcome: inner header cut or inconsistent */
	MRC_RX_DROP_DECAP_FAIL,		/* outcome: the kernel refused adjust_head */
	MRC_RX_DECAP_BYTES,		/* bytes of inner packets passed up */
	MRC_RX_MRC_TLV,			/* decapsulated packets that carried MRC TLV */
	MRC_RX_FEEDBACK,		/* feedback filed in path_health */
	MRC_RX_CONTROL,			/* outcome: feedback-only packet, consumed */
	MRC_TX_PROBE,			/* sent on a down path to test it */
	MRC_TX_REROUTE,			/* chosen path was down: another one taken */
	MRC_TX_FAIL_OPEN,		/* every path down: sent on a probed one anyway */
	MRC_TX_CONTROL,			/* outcome: feedback-only packet made and sent */
	MRC_FB_CLONE,			/* RX: a packet cloned to carry feedback back */
	MRC_RX_DROP_OPTION,		/* outcome: Destination Options header malformed,
					 * or an option we must not skip */
	MRC_TX_PINNED_PROBE,		/* sent on the path mrcctl probe named (SO_MARK) */
	MRC_TX_PROBE_COPY,		/* a header-only copy of a data packet tested a down path */
	MRC_RX_CE,			/* a fabric queue's CE mark carried to the inner header */
	MRC_RX_DROP_ECN,		/* outcome: outer CE on a Not-ECT inner packet (RFC 6040) */
	MRC_RX_DROP_OUTER_HEADER,	/* outcome: outer version is not 6, or its source is multicast */
	MRC_TX_TCP_RETRANS,		/* a TCP segment with nothing new (lib/tcp_steer.h) */
	MRC_TX_RETRANS_STEERED,		/* ... moved to a path heard more recently */
	/* RX with a key (lib/auth.h): a TLV whose feedback and measurements
	 * were not filed, by reason (not outcomes: the inner packet goes on) */
	MRC_RX_AUTH_NO_MAC,		/* the sender sent no MAC (key_id 0) */
	MRC_RX_AUTH_UNKNOWN_KEY,	/* key_id is none of our keys */
	MRC_RX_AUTH_BAD_MAC,		/* the MAC does not verify */
	MRC_RX_AUTH_OLD_EPOCH,		/* epoch older than the sender's latest */
	MRC_RX_AUTH_REPLAY,		/* path_seq seen already, or behind the window */
	MRC_RX_EPOCH,			/* a sender's new epoch: its tracking restarted */
	MRC_RX_CONTROL_TC,		/* RX: control packets filed at TC ingress, not XDP (a clone
					 * bpf_clone_redirect made is skipped by generic XDP) */
	/* learnt state (peer_state, lib/peer_state.h): not outcomes */
	MRC_STATE_NEW,			/* TX found a peer's state new: its turns started at its offset */
	MRC_STATE_REMADE,		/* ... of which the peer had state before: evicted since */
	MRC_STATE_FAIL,			/* TX: none could be made (the LRU freed no element): dropped */
	MRC_TX_SKIP,			/* a turn skipped: the peer reported CE on its path */
	MRC_TX_PROBE_HELD,		/* of tx_probe: a probe copy the probe budget held back, not sent */
	MRC_RX_FB_CE,			/* feedback said one of our paths was CE-marked */
	/* RoCEv2 (lib/roce.h): not outcomes */
	MRC_TX_ROCE,			/* a RoCEv2 packet encapsulated */
	MRC_TX_ROCE_RETRANS,		/* ... a request whose PSN was not new (go-back-N) */
	MRC_TX_ROCE_MOVE,		/* roce policy: a QP moved to another path */
	MRC_RX_ROCE,			/* a RoCEv2 packet decapsulated */
	MRC_RX_ROCE_NAK_SEQ,		/* ... a NAK, PSN sequence error */
	MRC_RX_ROCE_AHEAD,		/* ... a request ahead of the PSN expected */
	MRC_COUNTER_MAX,
};

/* ---- RoCEv2 (lib/roce.h) --------------------------------------------- */
/*
 * A RoCEv2 packet is UDP to port 4791 with an InfiniBand Base Transport
 * Header (BTH) after the UDP header.  A queue pair (QP) is known here by
 * its peer and the UDP source port: RoCEv2 senders (rxe, and NICs through
 * rdma_get_udp_sport) derive it from the product of the two QP numbers
 * when no flow label is set, so the requests of a reliably connected QP
 * and the ACKs its responder sends back carry the same port.
 */
#define MRC_ROCE_PORT		4791
#define MRC_ROCE_QPS		1024	/* QPs tracked (LRU; memlock: docs/design/roce.md) */
#define MRC_ROCE_PATHS		1024	/* (peer, path, side) rows of RoCE counters (LRU) */
#define MRC_ROCE_TURNS		1024	/* per-peer QP counters, by peer_id mod this (a power of two) */
#define MRC_ROCE_PSN_MASK	0xffffff

struct mrc_roce_key {
	__u32	peer_id;
	__u16	sport;		/* the QP pair's UDP source port */
	__u16	pad;
};

/* mrc_roce_qp.flags */
#define MRC_ROCE_F_SENT		0x01	/* last_psn holds a request we sent */
#define MRC_ROCE_F_ACKED	0x02	/* acked_psn holds an ACK we received */
#define MRC_ROCE_F_RX		0x04	/* rx_next_psn holds the next request PSN expected */
#define MRC_ROCE_F_PLACED	0x08	/* roce policy: turn and pos are set */

/* roce_qps: LRU hash, mrc_roce_key -> one QP's RoCE state and counters.
 * TX side for the QPs we are requester of, RX side for those we answer. */
struct mrc_roce_qp {
	__u64	tx_packets;	/* RoCE packets of it we sent */
	__u64	tx_retrans;	/* requests sent whose PSN was not new: the requester went back */
	__u64	naks_seq;	/* NAK (PSN sequence error) its responder sent us */
	__u64	acks;		/* ACKs (and other AETH-carrying responses) received */
	__u64	rx_packets;	/* requests received (we are its responder) */
	__u64	rx_ahead;	/* requests that arrived ahead of the next PSN expected (a gap) */
	__u64	rx_behind;	/* requests behind it: retransmitted or late */
	__u32	dqpn;		/* destination QP of its latest request or ACK */
	__u32	last_psn;	/* TX: the latest request PSN sent */
	__u32	acked_psn;	/* RX: the latest PSN its responder acknowledged */
	__u32	rx_next_psn;	/* RX: the next request PSN expected */
	__u32	turn;		/* roce policy: its place in the peer's spread */
	__u32	moves;		/* roce policy: times it changed path */
	__u16	path_id;	/* TX: the path of its latest packet */
	__u16	pos;		/* roce policy: its position in the spray list */
	__u8	flags;		/* MRC_ROCE_F_* */
	__u8	pad[3];
};

/* roce_paths: LRU hash, (peer, path, side) -> RoCE counters of a path.
 * Side 0: our path to the peer (what we sent on it and the NAKs its QPs
 * drew); side 1: the peer's path to us, by the id its TLV gives. */
struct mrc_roce_path_key {
	__u32	peer_id;
	__u16	path_id;
	__u16	side;
};

struct mrc_roce_path {
	__u64	tx_packets;
	__u64	tx_retrans;
	__u64	naks_seq;
	__u64	rx_packets;
	__u64	rx_ahead;
	__u64	rx_behind;
};

/* roce_pkt: per-CPU array of one: what mrc_tx read of a RoCE packet's
 * BTH before its path choice, for after it (mrc_tx has no stack left) */
struct mrc_roce_pkt {
	__u32	psn;
	__u32	dqpn;
	__u16	sport;
	__u8	opcode;
	__u8	syndrome;	/* the AETH's, for opcodes that carry one */
	__u32	valid;		/* TX: 1 while the packet in hand is RoCE */
	/* TX, what the policy's turn is (lib/path_select.h): list position
	 * (peer_seq * seq_mul + pos) mod the list's length: round robin
	 * (1, 0) for any packet but a QP's under the roce policy (0, its
	 * position).  Numbers, not a branch: mrc_tx's verifier budget. */
	__u32	seq_mul;
	__u32	pos;
};

/* ---- authenticated feedback (lib/auth.h) ---------------------------- */
/*
 * auth: array of one, written by the loader.  A host with keys signs
 * every TLV it sends with keys[tx_slot - 1] and files a peer's TLV
 * (feedback, measurements) only when it carries a MAC made with one of
 * its keys and is fresh: two keys, so a fabric can roll to a new key
 * host by host.  Without keys, TLVs go out unsigned and are all filed.
 */
#define MRC_AUTH_KEYS		2
#define MRC_AUTH_REPLAY_WINDOW	64	/* path_seq numbers behind the newest that may arrive */

struct mrc_auth_key {
	__u64	k0;		/* SipHash key: bytes 0-7 of the 16, little-endian */
	__u64	k1;		/* bytes 8-15 */
	__u8	id;		/* sent as mrc_tlv.key_id; 0: slot empty */
	__u8	pad[7];
};

struct mrc_auth {
	/* set at attach, from CLOCK_REALTIME in 2^-10 s: a later attach has
	 * a later epoch (compared modulo 2^32) */
	__u32	epoch;
	__u8	tx_slot;	/* 1 + the slot of keys[] we sign with; 0: none */
	__u8	pad[3];
	struct mrc_auth_key keys[MRC_AUTH_KEYS];
};

/* tx_scratch: per-CPU array of one, where mrc_tx builds the headers it
 * writes (outer IPv6 and the TLV), which do not fit on its 512-byte stack
 * beside everything else */
struct mrc_tx_scratch {
	__u8	bytes[128] __attribute__((aligned(8)));	/* zeroed a word at a time */
};

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

#endif /* MRC_COMMON_H */
