/* SPDX-License-Identifier: GPL-2.0 */
/* The attachment: its devices, timers and settings (the config map).
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_CONFIG_H
#define MRC_COMMON_CONFIG_H

#include "sizes.h"

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
	/* our port status, bit i: devices[i] is down (issue 29's block):
	 * written by `mrcctl ports watch`, sent in every TLV */
	__u32	ports_down;
};

#endif /* MRC_COMMON_CONFIG_H */
