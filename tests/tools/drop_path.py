"""The tests' own loss on a fabric link: an XDP program that drops the
packets of one MRC path (SRH or uSID) whose path_seq % MOD == REM, and
counts them.

    ip netns exec R python drop_path.py IFACE PATH_ID MOD REM
    ip netns exec R python drop_path.py IFACE all        # a black hole for all
                                                          # but ICMPv6 (ND)

Prints "ready" once attached; when stdin closes it prints the number it
dropped and the kernel time (CLOCK_MONOTONIC ns) of the first drop,
detaches and exits.  (No netem on this kernel: loss is ours.)
"""
import sys

from bcc import BPF

from mrc_ebpf.datapath.source import COMMON_HEADER

iface = sys.argv[1]
drop_all = sys.argv[2] == "all"
path_id, mod, rem = (0, 1, 0) if drop_all else (int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
text = f'''
#include <uapi/linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ipv6.h>
#include "{COMMON_HEADER}"
BPF_ARRAY(dropped, u64, 2);   /* [0] count, [1] time of the first */
static __always_inline int drop_it(void) {{
    u32 zero = 0, one = 1;
    u64 *n = dropped.lookup(&zero), *first = dropped.lookup(&one);
    if (n) *n += 1;
    if (first && !*first) *first = bpf_ktime_get_ns();
    return XDP_DROP;
}}
int drop(struct xdp_md *ctx) {{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    __u8 *srh = (void *)(ip6 + 1);
    if ({int(drop_all)} && (void *)(ip6 + 1) <= end && eth->h_proto == htons(ETH_P_IPV6) &&
        ip6->nexthdr != 58)
        return drop_it();
    if ((void *)(srh + 8) > end || eth->h_proto != htons(ETH_P_IPV6))
        return XDP_PASS;
    struct mrc_tlv *tlv;
    if (ip6->nexthdr == 60) {{           /* uSID path: the TLV is an option */
        tlv = (void *)(srh + 2);
        if ((void *)(tlv + 1) > end || tlv->type != MRC_OPT_TYPE) return XDP_PASS;
    }} else if (ip6->nexthdr == 43) {{
        __u32 off = 8 + 16 * ((__u32)srh[4] + 1);
        if (off > 8 + 16 * MRC_MAX_SEGMENTS) return XDP_PASS;
        tlv = (void *)(srh + off);
        if ((void *)(tlv + 1) > end || tlv->type != MRC_TLV_TYPE) return XDP_PASS;
    }} else {{
        return XDP_PASS;
    }}
    if (ntohs(tlv->path_id) != {path_id} || ntohl(tlv->path_seq) % {mod} != {rem}) return XDP_PASS;
    return drop_it();
}}
'''
b = BPF(text=text.encode())
fn = b.load_func("drop", BPF.XDP)
b.attach_xdp(iface, fn, BPF.XDP_FLAGS_SKB_MODE)
print("ready", flush=True)
try:
    sys.stdin.read()
finally:
    values = [v.value for v in b["dropped"].values()]
    print(values[0], values[1], flush=True)
    b.remove_xdp(iface, BPF.XDP_FLAGS_SKB_MODE)
