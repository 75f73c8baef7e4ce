/* The test fabric's switches mark ECN, as datacenter switches do: a TC
 * egress (clsact, direct-action) program on each rate-limited leaf-spine
 * device sets CE on an ECN-capable packet when the device's queue holds
 * more than a threshold.  This kernel has no marking qdisc (no RED,
 * fq_codel or pie), so the queue is modelled, not read: the tbf on the
 * same device drains at a known rate, and a virtual queue draining at
 * that rate (HULL's phantom queue, at the link's own rate) holds what the
 * tbf holds, give or take its burst.  Test equipment like fault.c, not
 * part of the datapath; loaded and explained by mrc_ebpf/ecn_marks.py,
 * compiled on its own.
 *
 * The program runs before the qdisc (clsact egress), so a packet is
 * judged by the queue it joins: the backlog in front of it. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#define ECN_MASK	3
#define ECN_CE		3

/* One entry per marking device, keyed by its MAC address: the source
 * address of every frame it sends, and unique across the fabric's
 * namespaces where ifindexes are not.  Mirrored by ecn_marks.Queue
 * (tests/test_layout.py checks it against this one). */
struct ecn_queue_key {
	__u8	mac[ETH_ALEN];
	__u16	pad;
};

struct ecn_queue {
	__u64	ns_per_kbyte;	/* the link's rate: ns to send 1000 bytes */
	__u64	threshold_ns;	/* mark when this much is queued in front */
	__u64	busy_until;	/* when the virtual queue will have drained */
	__u64	packets;	/* sent by the device, every kind */
	__u64	ect;		/* of them ECN-capable (ECT(0), ECT(1) or CE) */
	__u64	marked;		/* of them given CE here */
};

BPF_HASH(queues, struct ecn_queue_key, struct ecn_queue, 4096);

/* The ECN field of the packet's IP header, or -1 for no IP header. */
static __always_inline int ecn_field(struct ethhdr *eth, void *data_end)
{
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return -1;
		return (ip6->flow_lbl[0] >> 4) & ECN_MASK;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);

		if ((void *)(ip4 + 1) > data_end)
			return -1;
		return ip4->tos & ECN_MASK;
	}
	return -1;
}

/* Sets CE on an ECN-capable header ecn_field() read. */
static __always_inline void mark_ce(struct __sk_buff *skb, void *data_end, struct ethhdr *eth)
{
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return;
		ip6->flow_lbl[0] |= ECN_CE << 4;	/* no IPv6 header checksum */
	} else {
		struct iphdr *ip4 = (void *)(eth + 1);
		__u16 old, new;

		if ((void *)(ip4 + 1) > data_end)
			return;
		old = *(__u16 *)ip4;
		ip4->tos |= ECN_CE;
		new = *(__u16 *)ip4;
		/* may move the packet's data: nothing is read after it */
		bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old, new, 2);
	}
}

int ecn_mark(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ecn_queue_key key = {};
	struct ecn_queue *q;
	__u64 now, busy, backlog;
	int ecn;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	__builtin_memcpy(key.mac, eth->h_source, ETH_ALEN);
	q = queues.lookup(&key);
	if (!q)
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	/* An idle queue restarts from now.  The reset can race another CPU's
	 * add (both saw it idle), losing at most one packet's time; the add
	 * itself is atomic, so concurrent senders queue behind each other. */
	if (q->busy_until < now)
		q->busy_until = now;
	busy = __sync_fetch_and_add(&q->busy_until, (__u64)skb->len * q->ns_per_kbyte / 1000);
	backlog = busy > now ? busy - now : 0;
	__sync_fetch_and_add(&q->packets, 1);
	ecn = ecn_field(eth, data_end);
	if (ecn <= 0)			/* not IP, or Not-ECT: left for the tbf to drop */
		return TC_ACT_OK;
	__sync_fetch_and_add(&q->ect, 1);
	if (ecn == ECN_CE || backlog <= q->threshold_ns)
		return TC_ACT_OK;
	mark_ce(skb, data_end, eth);
	__sync_fetch_and_add(&q->marked, 1);
	return TC_ACT_OK;
}
