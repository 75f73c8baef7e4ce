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
 * it (BTF and fentry: 6.1 and 6.18 here); where it cannot, the watcher
 * finds the change from netlink as before.
 */
#include "lib/maps.h"
#include "lib/event_log.h"

#define PORT_IFF_UP	0x1	/* include/uapi/linux/if.h */

/*
 * CARRIER: 0, the carrier is going off (netif_carrier_off); 1, going on
 * (netif_carrier_on); -1, as it is (__dev_notify_flags, after the flags
 * changed).  Reads the device's fields at the running kernel's offsets.
 */
static __always_inline int port_hook(__u64 *ctx, int carrier)
{
	__u32 zero = 0, ifindex = 0, flags = 0, plane = MRC_MAX_DEVICES, bit, was, i;
	__u64 dev = 0, net = 0, cookie = 0, state = 0, now;
	struct mrc_port_hook *h = mrc_port_hook.lookup(&zero);
	struct mrc_config *cfg = mrc_config.lookup(&zero);
	int down;

	if (!h || !cfg || !h->netns_cookie)
		return 0;
	/* the argument as a number (struct net_device *): its fields are
	 * read at offsets known only at load */
	if (bpf_probe_read_kernel(&dev, sizeof(dev), ctx) || !dev)
		return 0;
	if (bpf_probe_read_kernel(&ifindex, sizeof(ifindex), (void *)(dev + (h->off_ifindex & 0xffff))))
		return 0;
#pragma unroll
	for (i = 0; i < MRC_MAX_DEVICES; i++) {
		if (i < cfg->n_devices && cfg->devices[i].ifindex == ifindex && plane == MRC_MAX_DEVICES)
			plane = i;
	}
	if (plane >= MRC_MAX_DEVICES)
		return 0;
	if (bpf_probe_read_kernel(&net, sizeof(net), (void *)(dev + (h->off_nd_net & 0xffff))) || !net ||
	    bpf_probe_read_kernel(&cookie, sizeof(cookie), (void *)(net + (h->off_net_cookie & 0xffff))) ||
	    cookie != h->netns_cookie)
		return 0;	/* a device of that ifindex in another namespace */
	if (bpf_probe_read_kernel(&flags, sizeof(flags), (void *)(dev + (h->off_flags & 0xffff))) ||
	    bpf_probe_read_kernel(&state, sizeof(state), (void *)(dev + (h->off_state & 0xffff))))
		return 0;
	if (carrier < 0)
		down = !(flags & PORT_IFF_UP) || ((state >> (h->nocarrier_bit & 63)) & 1);
	else
		down = !(flags & PORT_IFF_UP) || !carrier;
	__sync_fetch_and_add(&h->calls, 1);
	bit = 1U << plane;
	was = cfg->ports_down;
	if (!!(was & bit) == down)
		return 0;	/* no change (carrier off on a device already down) */
	/* not atomic (bcc's clang has no 32-bit atomic or/and): two of our
	 * devices changing on two CPUs at once could lose one bit until its
	 * next change; the kernel changes one device's link under the RTNL */
	cfg->ports_down = down ? was | bit : was & ~bit;
	now = bpf_ktime_get_ns();
	h->last_ns = now;
	h->mask = was ^ bit;
	__sync_fetch_and_add(&h->changes, 1);
	failover_event_log(MRC_EV_NO_PEER, MRC_EV_PLANE + plane,
			   down ? MRC_EV_OWN_PORT_DOWN : MRC_EV_OWN_PORT_UP, now, 0);
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
