/* SPDX-License-Identifier: GPL-2.0 */
/*
 * PORT: our port status found in the kernel (issue 29; MRC's Port Status
 * Update).  Three tracing programs (fentry) on the functions the kernel
 * runs when a device's carrier or flags change: netif_carrier_off,
 * netif_carrier_on, and __dev_notify_flags (admin up and down).  They run
 * in the context of whoever changed the link, the instant it changes (no
 * link-watch work queue, no netlink message, no user-space wake-up in
 * between), for every device of every namespace: one of ours (its ifindex
 * in config.devices and its namespace our cookie, mrc_port_hook) flips
 * its plane's bit in config.ports_down at once.  From then on:
 *   - every TLV we send carries it (lib/outer.h), so the next feedback to
 *     each peer tells it, and that feedback is owed at once, whatever
 *     fb_interval (lib/feedback.h): with the next packet from each peer;
 *   - our own paths through the dead plane are taken out peer by peer
 *     with that same packet (lib/ports.h files ours with the peer's);
 *   - the event (MRC_EV_OWN_PORT_DOWN/UP) rings the event ring, which
 *     wakes `mrcctl ports watch` to send one feedback-only packet to each
 *     peer without waiting for a packet (control/ports.py).
 * The loader (datapath/port_hook.py) attaches them where the kernel lets
 * it (BTF and fentry: Debian's 6.1).  A kernel that refuses tracing
 * programs (this 6.18: EPERM) still runs raw tracepoints: the link-watch
 * hooks below read our devices' state when the kernel queues, arms or
 * runs its link-watch work, which every carrier change queues (at once
 * when no such work is pending, else it joins the pending one).  Where
 * neither attaches, the watcher finds the change from netlink as before.
 */
#include "lib/maps.h"
#include "lib/event_log.h"

#define PORT_IFF_UP	0x1	/* include/uapi/linux/if.h */

/* Plane PLANE's device is DOWN (1) or up: config.ports_down and, on a
 * change, the event and the hook's own record. */
static __always_inline void port_set(struct mrc_port_hook *h, struct mrc_config *cfg, __u32 plane, int down)
{
	__u32 bit = 1U << (plane & (MRC_MAX_DEVICES - 1)), was = cfg->ports_down;
	__u64 now;

	if (!!(was & bit) == down)
		return;		/* no change (carrier off on a device already down) */
	/* not atomic (bcc's clang has no 32-bit atomic or/and): two of our
	 * devices changing on two CPUs at once could lose one bit until its
	 * next change; the kernel changes one device's link under the RTNL */
	cfg->ports_down = down ? was | bit : was & ~bit;
	now = bpf_ktime_get_ns();
	h->last_ns = now;
	h->mask = was ^ bit;
	__sync_fetch_and_add(&h->changes, 1);
	failover_event_log(MRC_EV_NO_PEER, MRC_EV_PLANE + (plane & (MRC_MAX_DEVICES - 1)),
			   down ? MRC_EV_OWN_PORT_DOWN : MRC_EV_OWN_PORT_UP, now, 0);
}

/* The plane of the struct net_device at DEV if it is ours (its ifindex in
 * config.devices, its namespace ours), else MRC_MAX_DEVICES. */
static __always_inline __u32 port_plane(struct mrc_port_hook *h, struct mrc_config *cfg, __u64 dev)
{
	__u32 ifindex = 0, plane = MRC_MAX_DEVICES, i;
	__u64 net = 0, cookie = 0;

	if (!dev || bpf_probe_read_kernel(&ifindex, sizeof(ifindex), (void *)(dev + (h->off_ifindex & 0xffff))))
		return MRC_MAX_DEVICES;
#pragma unroll
	for (i = 0; i < MRC_MAX_DEVICES; i++) {
		if (i < cfg->n_devices && cfg->devices[i].ifindex == ifindex && plane == MRC_MAX_DEVICES)
			plane = i;
	}
	if (plane >= MRC_MAX_DEVICES)
		return MRC_MAX_DEVICES;
	if (bpf_probe_read_kernel(&net, sizeof(net), (void *)(dev + (h->off_nd_net & 0xffff))) || !net ||
	    bpf_probe_read_kernel(&cookie, sizeof(cookie), (void *)(net + (h->off_net_cookie & 0xffff))) ||
	    cookie != h->netns_cookie)
		return MRC_MAX_DEVICES;		/* a device of that ifindex in another namespace */
	return plane;
}

/* The device at DEV down now (admin down or no carrier), or -1 if unread;
 * CARRIER 0 or 1 overrides its carrier bit (read at the change's entry). */
static __always_inline int port_down(struct mrc_port_hook *h, __u64 dev, int carrier)
{
	__u32 flags = 0;
	__u64 state = 0;

	if (bpf_probe_read_kernel(&flags, sizeof(flags), (void *)(dev + (h->off_flags & 0xffff))) ||
	    bpf_probe_read_kernel(&state, sizeof(state), (void *)(dev + (h->off_state & 0xffff))))
		return -1;
	if (carrier >= 0)
		return !(flags & PORT_IFF_UP) || !carrier;
	return !(flags & PORT_IFF_UP) || ((state >> (h->nocarrier_bit & 63)) & 1);
}

/*
 * fentry: CARRIER 0, the carrier is going off (netif_carrier_off); 1,
 * going on (netif_carrier_on); -1, as it is (__dev_notify_flags, after
 * the flags changed).
 */
static __always_inline int port_hook(__u64 *ctx, int carrier)
{
	__u32 zero = 0, plane;
	__u64 dev = 0;
	struct mrc_port_hook *h = mrc_port_hook.lookup(&zero);
	struct mrc_config *cfg = mrc_config.lookup(&zero);
	int down;

	if (!h || !cfg || !h->netns_cookie)
		return 0;
	/* the argument as a number (struct net_device *): its fields are
	 * read at offsets known only at load */
	if (bpf_probe_read_kernel(&dev, sizeof(dev), ctx))
		return 0;
	plane = port_plane(h, cfg, dev);
	if (plane >= MRC_MAX_DEVICES)
		return 0;
	down = port_down(h, dev, carrier);
	if (down < 0)
		return 0;
	__sync_fetch_and_add(&h->calls, 1);
	port_set(h, cfg, plane, down);
	return 0;
}

int mrc_port_off(__u64 *ctx)
{
	return port_hook(ctx, 0);
}

int mrc_port_on(__u64 *ctx)
{
	return port_hook(ctx, 1);
}

int mrc_port_flags(__u64 *ctx)
{
	return port_hook(ctx, -1);
}

/* Link watch: if WORK (a struct work_struct) is the kernel's link-watch
 * work, our learnt devices' state read now, each plane's bit set to it. */
static __always_inline int port_lw(__u64 work)
{
	__u32 zero = 0, i;
	__u64 func = 0, dev;
	struct mrc_port_hook *h = mrc_port_hook.lookup(&zero);
	struct mrc_config *cfg;
	int down;

	if (!h || !h->lw_func || !work ||
	    bpf_probe_read_kernel(&func, sizeof(func), (void *)(work + (h->off_work_func & 0xffff))) ||
	    func != h->lw_func)
		return 0;
	cfg = mrc_config.lookup(&zero);
	if (!cfg)
		return 0;
	__sync_fetch_and_add(&h->calls, 1);
#pragma unroll
	for (i = 0; i < MRC_MAX_DEVICES; i++) {
		dev = h->devs[i];
		if (i >= cfg->n_devices || !dev)
			continue;
		down = port_down(h, dev, -1);
		if (down >= 0)
			port_set(h, cfg, i, down);
	}
	return 0;
}

/* workqueue_queue_work(req_cpu, pwq, work): queued now */
int mrc_port_lwq(struct bpf_raw_tracepoint_args *ctx)
{
	return port_lw(ctx->args[2]);
}

/* workqueue_execute_start(work): run now (it also covers a carrier change
 * that joined work already pending) */
int mrc_port_lwx(struct bpf_raw_tracepoint_args *ctx)
{
	return port_lw(ctx->args[0]);
}

/* timer_start(timer, ...): queued later, by a delayed work's timer */
int mrc_port_lwt(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0;
	__u64 timer = ctx->args[0], fn = 0;
	struct mrc_port_hook *h = mrc_port_hook.lookup(&zero);

	if (!h || !h->dwork_timer_fn || !timer ||
	    bpf_probe_read_kernel(&fn, sizeof(fn), (void *)(timer + (h->off_timer_fn & 0xffff))) ||
	    fn != h->dwork_timer_fn)
		return 0;
	return port_lw(timer - (h->off_dwork_timer & 0xffff) + (h->off_dwork_work & 0xffff));
}

/* net_dev_start_xmit(skb, dev): learns our devices' struct net_device from
 * a frame the loader sends on each (attached only meanwhile) */
int mrc_port_learn(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0, plane;
	__u64 dev = ctx->args[1];
	struct mrc_port_hook *h = mrc_port_hook.lookup(&zero);
	struct mrc_config *cfg = mrc_config.lookup(&zero);

	if (!h || !cfg || !h->netns_cookie)
		return 0;
	plane = port_plane(h, cfg, dev);
	if (plane < MRC_MAX_DEVICES)
		h->devs[plane] = dev;
	return 0;
}
