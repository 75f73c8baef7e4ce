/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The mrc-ebpf datapath object.  Its two programs share one set of maps
 * (lib/maps.h), so they are compiled together:
 *   mrc_tx  TC egress: SRv6 encapsulation, path choice  (mrc_tx.c)
 *   mrc_rx  XDP:       validation, decapsulation, measurement (mrc_rx.c)
 *   mrc_fb  TC ingress: feedback for one-way traffic, and the
 *           control packets generic XDP skips (mrc_fb.c)
 *   mrc_port_*  fentry on the kernel's carrier and flags changes: our
 *           port status, found in the kernel (mrc_ports.c)
 *
 * bcc rewrites map calls and finds programs only in the file it is
 * given, so the loader (mrc_ebpf/source.py) inlines the quoted includes
 * below, with #line markers that keep compiler errors pointing here.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/stddef.h>

#include "mrc_tx.c"
#include "mrc_rx.c"
#include "mrc_fb.c"
#include "mrc_ports.c"

