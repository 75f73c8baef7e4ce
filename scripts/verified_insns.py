#!/usr/bin/env python3
"""How many instructions the verifier processed for each datapath program
(bpf_prog_info.verified_insns, Linux 5.16+), compiled from this tree on
the running kernel: mrc_tx is near the 1M limit, so a change to TX says
its count.  Usage: .venv/bin/python scripts/verified_insns.py"""
import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mrc_ebpf.datapath import bpfsys, loader  # noqa: E402

u32, u64 = ctypes.c_uint32, ctypes.c_uint64


class _FullProgInfo(ctypes.Structure):
    # uapi/linux/bpf.h struct bpf_prog_info, up to verified_insns
    _fields_ = [("type", u32), ("id", u32), ("tag", ctypes.c_uint8 * 8), ("jited_prog_len", u32),
                ("xlated_prog_len", u32), ("jited_prog_insns", u64), ("xlated_prog_insns", u64),
                ("load_time", u64), ("created_by_uid", u32), ("nr_map_ids", u32), ("map_ids", u64),
                ("name", ctypes.c_char * 16), ("ifindex", u32), ("gpl_compatible", u32),
                ("netns_dev", u64), ("netns_ino", u64), ("nr_jited_ksyms", u32),
                ("nr_jited_func_lens", u32), ("jited_ksyms", u64), ("jited_func_lens", u64),
                ("btf_id", u32), ("func_info_rec_size", u32), ("func_info", u64),
                ("nr_func_info", u32), ("nr_line_info", u32), ("line_info", u64),
                ("jited_line_info", u64), ("nr_jited_line_info", u32), ("line_info_rec_size", u32),
                ("jited_line_info_rec_size", u32), ("nr_prog_tags", u32), ("prog_tags", u64),
                ("run_time_ns", u64), ("run_cnt", u64), ("recursion_misses", u64),
                ("verified_insns", u32)]


def _port_hooks(module) -> list:
    """The kernel hooks of bpf/mrc_ports.c loaded (not attached) on MODULE's maps."""
    from mrc_ebpf.datapath import build, port_hook
    made = build.capture(module, loader.PROGRAM_TYPES)
    btf = port_hook.Btf()
    try:
        ids = {f: btf.find(kernel_fn, 12) for f, (kernel_fn, _) in port_hook.HOOKS.items()}
    finally:
        btf.close()
    out = []
    raw = {f: 0 for f in (*port_hook.LW_HOOKS, port_hook.LEARN[0])}
    for hooks, kind in ((ids, port_hook.BPF_TRACE_FENTRY), (raw, 0)):
        try:
            inst = build.instantiate(made, build.module_maps(module), {f: kind for f in hooks}, list(hooks), hooks)
        except bpfsys.BpfError as e:      # a kernel that refuses BPF tracing (6.18 here: EPERM)
            print(json.dumps({"port hooks": f"{', '.join(hooks)} not loaded: {e}"}), file=sys.stderr)
            continue
        out += [(f, inst.programs[f]) for f in hooks]
    return out


def main() -> None:
    module, tx, rx, fb = loader.compile_datapath()
    out = {}
    for name, fn in (("mrc_tx", tx), ("mrc_rx", rx), ("mrc_fb", fb), *_port_hooks(module)):
        info, size = _FullProgInfo(), u32(ctypes.sizeof(_FullProgInfo))
        if bpfsys.libbpf().bpf_obj_get_info_by_fd(fn.fd, ctypes.byref(info), ctypes.byref(size)):
            raise SystemExit(f"bpf_obj_get_info_by_fd({name}) failed")
        out[name] = info.verified_insns
    print(json.dumps(out))


if __name__ == "__main__":
    main()
