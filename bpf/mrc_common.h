/* SPDX-License-Identifier: GPL-2.0 */
/*
 * mrc-ebpf: the one place where the wire format, the map layouts and the
 * counters are defined, one concern a header under lib/common/, all of
 * them included here.  The datapath (bpf/mrc*.c) and its loader
 * (mrc_ebpf/) both read them: Python parses the #defines and the
 * `enum mrc_counter` from this file and what it includes at run time
 * (mrc_ebpf/datapath/source.py), and tests/test_layout.py checks the
 * ctypes mirrors (mrc_ebpf/datapath/mirrors.py) against the structs as
 * bcc compiles them.  A new definition goes into the header of its
 * concern; a new header is included here.
 */
#ifndef MRC_COMMON_H
#define MRC_COMMON_H

#include "lib/common/sizes.h"		/* sizes, skb marks */
#include "lib/common/wire.h"		/* the MRC TLV, SRH and uSID encapsulation */
#include "lib/common/peers.h"		/* peers, spray lists, templates, classes, peer cache */
#include "lib/common/paths.h"		/* paths: configured, live, reported health */
#include "lib/common/auth.h"		/* authenticated feedback: keys, MAC state */
#include "lib/common/peer_state.h"	/* what the datapath learns per peer */
#include "lib/common/rx.h"		/* what the receiver tracks per sender and path */
#include "lib/common/events.h"		/* the event log of path state changes */
#include "lib/common/config.h"		/* the attachment: devices, timers, settings */
#include "lib/common/tx.h"		/* TX flows, header scratch room */
#include "lib/common/counters.h"	/* enum mrc_counter */
#include "lib/common/shared_fate.h"	/* first hops and the paths through them */
#include "lib/common/congestion.h"	/* trimming and port status */
#include "lib/common/port_hook.h"	/* port status found in the kernel */
#include "lib/common/roce.h"		/* RoCEv2: queue pairs and their counters */

#endif /* MRC_COMMON_H */
