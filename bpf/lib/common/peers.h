/* SPDX-License-Identifier: GPL-2.0 */
/* Peers and what the loader writes about them: the prefix trie, the
 * spray lists, templates and classes, the peer cache.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_PEERS_H
#define MRC_COMMON_PEERS_H

#include "sizes.h"

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
#define MRC_POLICY_BYTES	5	/* round robin by bytes (the default): a turn a largest packet */
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
	/* bytes policy: the most one turn carries (the largest packet TC can
	 * be handed; 0: not turns of bytes).  A turn is as long as the peer's
	 * recent largest packet, within this (lib/path_select.h), so it is a
	 * segment or a burst by what the granularity lets through now */
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

/* peer_by_sid: hash, a peer's SID -> peer_id, to file incoming feedback.
 * Every path may end at a SID of its own, and every peer of a template
 * has one; allocated as used (BPF_F_NO_PREALLOC), so the size costs
 * nothing until paths need it (but its buckets). */
#define MRC_MAX_PEER_SIDS	MRC_MAX_PEER_PREFIXES

/*
 * peer_floor: array by peer_id, MRC's ev_min_active: the datapath takes
 * no path out that would leave the peer fewer than config.min_active
 * usable ones (lib/floor.h).  How many it has taken out is learnt state:
 * mrc_row_state.floor_out.
 */
/* a struct, not __u64[N][M], so bcc's ctypes for maps get it right */
struct mrc_plane_paths {
	__u64	ids[MRC_MAX_PATHS / 64];	/* bit i: path i */
};

struct mrc_peer_floor {
	__u64	usable;		/* loader: the peer's paths in state UP (not denied) */
	/* loader: the paths (UP) that leave by config.devices[p], for each
	 * plane p: what a peer's port status takes out (issue 29's block,
	 * lib/ports.h) */
	struct mrc_plane_paths	plane_paths[MRC_MAX_DEVICES];
};

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

#endif /* MRC_COMMON_PEERS_H */
