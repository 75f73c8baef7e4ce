/* The test fabric's switches trim, as Ultra Ethernet's (and NDP's) do:
 * a TC egress (clsact, direct-action) program on each rate-limited
 * leaf-spine device that, when the device's queue holds more than a
 * threshold, cuts an MRC packet to its headers instead of letting the
 * queue grow until the tbf drops it.  Kept: the outer IPv6 header, its
 * SRH or Destination Options (with the MRC TLV, untouched, so its MAC
 * still verifies) and the inner IP header (whose addresses the receiver
 * answers, bpf/lib/trim.h); cut: the rest.  The outer payload length
 * is set to what is left and the outer DSCP to MRC_TRIM_DSCP, so the
 * receiver tells a trimmed packet from a broken one (and its ECN field
 * is kept).  The queue is modelled as bpf/lab/ecn_mark.c models it (a
 * virtual queue draining at the link's rate); a trimmed packet joins
 * it at its trimmed length.  Packets that are not MRC's, and GSO
 * super-packets (one trim would cut a whole burst: attach
 * --granularity packet), are left for the tbf to queue or drop.
 * Test equipment like fault.c; loaded by mrc_ebpf/lab/trims.py.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include "mrc_common.h"

/* headers kept after the outer fixed header: an SRH or Destination
 * Options header plus the inner IP header, at most this many bytes */
#define TRIM_KEEP_MAX	256
#define TRIM_CUT_STEP	0xfff	/* bpf_skb_adjust_room() moves at most this a call */
#define TRIM_CUT_STEPS	4	/* a 9000-byte frame at most: GSO is not trimmed */

/* One entry per trimming device, keyed by its MAC address (as
 * ecn_mark.c's; mirrored by trims.Queue, checked by tests/test_layout.py) */
struct trim_queue_key {
	__u8	mac[ETH_ALEN];
	__u16	pad;
};

struct trim_queue {
	__u64	ns_per_kbyte;	/* the link's rate: ns to send 1000 bytes */
	__u64	threshold_ns;	/* trim when this much is queued in front */
	__u64	busy_until;	/* when the virtual queue will have drained */
	__u64	packets;	/* sent by the device, every kind */
	__u64	mrc;		/* of them MRC packets (outer IPv6, SRH or DOH) */
	__u64	trimmed;	/* of them cut to their headers here */
	__u64	trimmed_bytes;	/* bytes cut */
	__u64	untrimmable;	/* over the threshold but left whole (GSO, odd headers) */
};

BPF_HASH(queues, struct trim_queue_key, struct trim_queue, 4096);

/* per CPU: the headers kept while the room behind them is cut */
struct trim_scratch {
	__u8	bytes[TRIM_KEEP_MAX];
};
BPF_PERCPU_ARRAY(scratch, struct trim_scratch, 1);

/* Bytes after the outer fixed header that a trim keeps, or 0 when the
 * packet is no MRC packet this program can trim. */
static __always_inline __u32 trim_keep(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	__u8 *ext = (void *)(ip6 + 1);
	__u32 ext_len, inner_len;
	__u8 inner0 = 0;

	if ((void *)(ext + 2) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6) ||
	    (ip6->nexthdr != IPPROTO_ROUTING && ip6->nexthdr != IPPROTO_DSTOPTS))
		return 0;
	ext_len = (ext[1] + 1) * 8;
	if (ext[0] == IPPROTO_IPV6)
		inner_len = sizeof(struct ipv6hdr);
	else if (ext[0] == IPPROTO_IPIP) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(*ip6) + ext_len, &inner0, 1))
			return 0;
		inner_len = (inner0 & 0xf) * 4;
		if (inner_len < sizeof(struct iphdr))
			return 0;
	} else {
		return 0;
	}
	return ext_len + inner_len <= TRIM_KEEP_MAX ? ext_len + inner_len : 0;
}

/* Cuts the packet to Ethernet + outer IPv6 + `keep` bytes and marks it;
 * returns the bytes cut, or 0 when it was left whole. */
static __always_inline __u32 trim(struct __sk_buff *skb, __u32 keep)
{
	__u32 zero = 0, off = ETH_HLEN + sizeof(struct ipv6hdr), cut, left, step, i;
	struct trim_scratch *buf = scratch.lookup(&zero);
	struct ipv6hdr *ip6;
	void *data_end;
	__u16 payload;
	__u8 ecn;

	if (!buf || keep == 0 || keep > TRIM_KEEP_MAX || skb->len <= off + keep)
		return 0;
	if (bpf_skb_load_bytes(skb, off, buf->bytes, keep))
		return 0;
	/* shrinking at the network layer removes the bytes right after the
	 * outer fixed header: the kept headers are written back after */
	cut = skb->len - off - keep;
	left = cut;
	for (i = 0; i < TRIM_CUT_STEPS; i++) {
		if (!left)
			break;
		step = left > TRIM_CUT_STEP ? TRIM_CUT_STEP : left;
		if (bpf_skb_adjust_room(skb, -(__s32)step, BPF_ADJ_ROOM_NET, 0))
			return 0;	/* cannot happen after a first success: sizes are checked */
		left -= step;
	}
	if (left || bpf_skb_store_bytes(skb, off, buf->bytes, keep, 0))
		return 0;
	ip6 = (void *)(long)skb->data + ETH_HLEN;
	data_end = (void *)(long)skb->data_end;
	if ((void *)(ip6 + 1) > data_end)
		return 0;
	payload = keep;
	ip6->payload_len = bpf_htons(payload);
	/* traffic class: DSCP in its 6 high bits, ECN kept */
	ecn = (ip6->flow_lbl[0] >> 4) & 3;
	ip6->priority = MRC_TRIM_DSCP >> 2;
	ip6->flow_lbl[0] = (ip6->flow_lbl[0] & 0x0f) | (((MRC_TRIM_DSCP & 3) << 2 | ecn) << 4);
	return cut;
}

int trim_queue(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct trim_queue_key key = {};
	struct trim_queue *q;
	__u64 now, busy, backlog, len = skb->len;
	__u32 keep, cut;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	__builtin_memcpy(key.mac, eth->h_source, ETH_ALEN);
	q = queues.lookup(&key);
	if (!q)
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	/* the backlog in front of this packet, as ecn_mark.c reads it */
	busy = q->busy_until;
	backlog = busy > now ? busy - now : 0;
	__sync_fetch_and_add(&q->packets, 1);
	keep = trim_keep(skb);
	if (keep)
		__sync_fetch_and_add(&q->mrc, 1);
	if (keep && backlog > q->threshold_ns && skb->len > ETH_HLEN + sizeof(struct ipv6hdr) + keep) {
		cut = skb->gso_size ? 0 : trim(skb, keep);
		if (cut) {
			__sync_fetch_and_add(&q->trimmed, 1);
			__sync_fetch_and_add(&q->trimmed_bytes, cut);
			len -= cut;
		} else {
			__sync_fetch_and_add(&q->untrimmable, 1);
		}
	}
	/* an idle queue restarts from now (the race is ecn_mark.c's: at most
	 * one packet's time lost); the packet joins at the length it has now */
	if (q->busy_until < now)
		q->busy_until = now;
	__sync_fetch_and_add(&q->busy_until, len * q->ns_per_kbyte / 1000);
	return TC_ACT_OK;
}
