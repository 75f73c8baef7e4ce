/* SPDX-License-Identifier: GPL-2.0 */
/* Congestion apart from failure: trimming and port status (issue 29). */
#ifndef MRC_COMMON_CONGESTION_H
#define MRC_COMMON_CONGESTION_H

/* Trimming (UET's packet trimming, NDP's cut payload): a switch whose
 * queue passes a threshold cuts an MRC packet to its headers (outer
 * IPv6, SRH or Destination Options with the MRC TLV, inner IP header)
 * and sets the outer DSCP to this code point, from the pool for local
 * use (RFC 2474: xxxx11), so the receiver tells a trimmed packet from a
 * broken one (bpf/lab/trim.c, bpf/lib/trim.h). */
#define MRC_TRIM_DSCP		51
/* XDP metadata of a trimmed packet mrc_rx hands to mrc_fb (TC ingress),
 * which answers it with feedback at once and drops it */
#define MRC_TRIM_META		0x4d525452
/* Port status (MRC's Port Status Update, its port_status_mask): a host
 * whose plane device goes down (carrier or admin) says so in every TLV
 * (mrc_tlv.ports_down, bit i: its attachment's devices[i]; planes are
 * numbered alike on every host, as `fabric attach` attaches eth0 eth1
 * ...) and in one feedback-only packet to each peer it has state for
 * (`mrcctl ports watch`, control/ports.py); a peer takes its paths
 * whose own device is of that plane out at once (MRC_EV_PORT_DOWN), and
 * probes them at once when the bit clears (lib/ports.h). */

#endif
