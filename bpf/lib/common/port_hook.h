/* SPDX-License-Identifier: GPL-2.0 */
/* Port status found in the kernel: the hooks on a device's carrier and
 * flags changes (bpf/mrc_ports.c).  Part of mrc_common.h. */
#ifndef MRC_COMMON_PORT_HOOK_H
#define MRC_COMMON_PORT_HOOK_H

/* port_hook.hooked: which kernel functions a hook of ours is on (fentry) */
#define MRC_PORT_HOOK_CARRIER_OFF	0x1	/* netif_carrier_off */
#define MRC_PORT_HOOK_CARRIER_ON	0x2	/* netif_carrier_on */
#define MRC_PORT_HOOK_FLAGS		0x4	/* __dev_notify_flags: admin up/down */
/* where the kernel refuses tracing programs (6.18 here), raw tracepoints
 * on the link-watch work that a carrier change queues: */
#define MRC_PORT_HOOK_LW_QUEUE		0x8	/* workqueue_queue_work */
#define MRC_PORT_HOOK_LW_TIMER		0x10	/* timer_start (a delayed queueing) */
#define MRC_PORT_HOOK_LW_RUN		0x20	/* workqueue_execute_start */

/* peers the datapath tells of a change of our port status itself, from
 * the next packet that reaches us from any of them (lib/port_tell.h): a
 * slot a peer, peer_id & (MRC_PORT_TELL - 1) (a power of two) */
#define MRC_PORT_TELL		16

/* A peer we heard from lately, as lib/port_tell.h learns it. */
struct mrc_port_tell {
	__u8	addr[16];	/* its data's source address (IPv4-mapped for IPv4) */
	__u32	peer_id1;	/* its peer_id + 1 (0: an empty slot) */
	__u32	row;		/* its row of paths (mrc_peer.template_id) */
};

/*
 * port_hook: array of one, written by the loader (datapath/port_hook.py)
 * when it attaches the hooks.  The hooks run for every device of every
 * network namespace: a device is ours if its ifindex is one of
 * config.devices and its namespace's cookie is ours.  struct net_device
 * is the kernel's own and its layout differs between kernels, so the
 * offsets of the fields read come from the running kernel's BTF (the
 * hooks read them with bpf_probe_read_kernel, one source for 6.1 and
 * 6.18 alike).
 */
struct mrc_port_hook {
	__u64	netns_cookie;	/* our network namespace (0: hooks off) */
	__u32	off_ifindex;	/* struct net_device: ifindex */
	__u32	off_flags;	/* flags (IFF_UP) */
	__u32	off_state;	/* state (bit nocarrier_bit) */
	__u32	off_nd_net;	/* nd_net (struct net *) */
	__u32	off_net_cookie;	/* struct net: net_cookie */
	__u32	nocarrier_bit;	/* __LINK_STATE_NOCARRIER */
	__u32	hooked;		/* MRC_PORT_HOOK_*: attached (the loader says) */
	__u32	mask;		/* ports_down as a hook last left it */
	__u64	calls;		/* hook runs for one of our devices */
	__u64	changes;	/* of them, those that changed ports_down */
	__u64	last_ns;	/* when a hook last changed it (CLOCK_MONOTONIC) */
	/* The link-watch hooks (raw tracepoints): a carrier change queues
	 * the kernel's link-watch work (linkwatch_event) at once or on a
	 * timer; when that work is queued, armed or run, the hooks read our
	 * devices' state through their struct net_device, whose addresses
	 * a learning hook took from our own frames (net_dev_start_xmit). */
	__u64	lw_func;	/* linkwatch_event (kallsyms) */
	__u64	dwork_timer_fn;	/* delayed_work_timer_fn (kallsyms) */
	__u32	off_work_func;	/* struct work_struct: func */
	__u32	off_timer_fn;	/* struct timer_list: function */
	__u32	off_dwork_timer;	/* struct delayed_work: timer */
	__u32	off_dwork_work;	/* struct delayed_work: work */
	__u64	devs[MRC_MAX_DEVICES];	/* our devices' struct net_device (0: not learnt) */
	/* config.ports_down as the datapath last told every peer of tell[]
	 * (lib/port_tell.h): the next packet in tells them when it differs */
	__u64	told;
	struct mrc_port_tell tell[MRC_PORT_TELL];
};

#endif /* MRC_COMMON_PORT_HOOK_H */
