/* Gray-failure injection on the receiving end of a link: a TC ingress
 * (clsact, direct-action) program that drops IPv4 and IPv6 packets, all of
 * them or each with a probability, and counts what it judged.  Loaded and
 * explained by mrc_ebpf/lab/faults.py; this file is compiled on its own. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ipv6.h>

/* fault_config.mode */
#define FAULT_MODE_BLACKHOLE	1
#define FAULT_MODE_LOSS		2

/* Mirrored by faults.Config: only `threshold` is read here, the rest is
 * what `status` and `heal` need to know later from the pin alone. */
struct fault_config {
	__u64	threshold;	/* drop when prandom_u32() < threshold: 1 << 32 drops all */
	__u32	mode;		/* FAULT_MODE_* */
	__u32	flags;		/* MRC_DEV_F_CLSACT_OURS (bpf/mrc_common.h) or 0 */
	__u64	loss;		/* the requested loss: a double, written and read by Python */
	__u64	netns_cookie;	/* tells stale pins of a deleted namespace from live ones */
	__u32	ifindex;
	__u32	pad;
};

/* FAULT_FIRST_DROP_NS is no counter: per CPU, the kernel time of its first
 * drop (the earliest over CPUs is when the failure began to bite) */
enum fault_counter { FAULT_DROPPED, FAULT_PASSED, FAULT_DROPPED_SKBS, FAULT_FIRST_DROP_NS, FAULT_NR_COUNTERS };

BPF_ARRAY(config, struct fault_config, 1);
BPF_PERCPU_ARRAY(counters, __u64, FAULT_NR_COUNTERS);

static __always_inline int is_neighbour_discovery(struct __sk_buff *skb)
{
	__u8 nexthdr = 0, type = 0;
	/* ND never carries extension headers (RFC 4861), so the ICMPv6 type
	 * sits right after the fixed header when it is ND at all. */
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, nexthdr), &nexthdr, 1) < 0 ||
	    nexthdr != IPPROTO_ICMPV6)
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr), &type, 1) < 0)
		return 0;
	return type >= 133 && type <= 137;   /* RS, RA, NS, NA, redirect */
}

int fault_ingress(struct __sk_buff *skb)
{
	__u32 key = 0;
	struct fault_config *cfg = config.lookup(&key);
	if (!cfg)
		return TC_ACT_OK;
	if (skb->protocol == htons(ETH_P_IPV6)) {
		if (is_neighbour_discovery(skb))
			return TC_ACT_OK;
	} else if (skb->protocol != htons(ETH_P_IP)) {
		return TC_ACT_OK;
	}
	/* One decision per skb: a GSO/GRO super-packet stands for gso_segs
	 * wire packets and is dropped or passed whole; count what it stands for. */
	__u64 segs = skb->gso_segs ? skb->gso_segs : 1;
	int drop = (__u64)bpf_get_prandom_u32() < cfg->threshold;
	__u32 idx = drop ? FAULT_DROPPED : FAULT_PASSED;
	__u64 *n = counters.lookup(&idx);
	if (n)
		*n += segs;
	if (!drop)
		return TC_ACT_OK;
	idx = FAULT_DROPPED_SKBS;
	n = counters.lookup(&idx);
	if (n)
		*n += 1;
	idx = FAULT_FIRST_DROP_NS;
	n = counters.lookup(&idx);
	if (n && !*n)
		*n = bpf_ktime_get_ns();
	return TC_ACT_SHOT;
}
