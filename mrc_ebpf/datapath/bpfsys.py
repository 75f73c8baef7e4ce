"""The bpf(2) calls of mrc-ebpf, through Debian's libbpf (libbpf.so.1).

bcc compiles; everything after goes through libbpf's low-level API
(bpf.h): create maps and load programs (build.py instantiates a build
with these), pin and open pins, look up / update / delete / iterate /
batch a map, ask the kernel an object's info and test-run a program.
libbpf keeps union bpf_attr and the syscall's number per architecture,
so nothing here is x86_64's.  What libbpf takes by pointer is an *_opts
struct whose first field `sz` says how much of it we pass: a newer
libbpf reads the rest as zero, so these twins of libbpf 1.1's (the
oldest this runs on, Debian 12's) stay valid; tests/test_layout.py checks
them against the installed bpf/bpf.h.
"""
from __future__ import annotations

import ctypes
import errno
import os

from mrc_ebpf.datapath.mirrors import KERNEL_BPF_H, LIBBPF_BPF_H, mirror

BPF_ANY = 0
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_LPM_TRIE = 11

_u32, _u64, _ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p


class BpfError(OSError):
    pass


@mirror("struct bpf_map_create_opts", LIBBPF_BPF_H, kind="libbpf")
class MapCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("btf_fd", _u32), ("btf_key_type_id", _u32),
                ("btf_value_type_id", _u32), ("btf_vmlinux_value_type_id", _u32),
                ("inner_map_fd", _u32), ("map_flags", _u32), ("map_extra", _u64),
                ("numa_node", _u32), ("map_ifindex", _u32)]


@mirror("struct bpf_prog_load_opts", LIBBPF_BPF_H, kind="libbpf")
class ProgLoadOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("attempts", ctypes.c_int),
                ("expected_attach_type", _u32), ("prog_btf_fd", _u32), ("prog_flags", _u32),
                ("prog_ifindex", _u32), ("kern_version", _u32), ("attach_btf_id", _u32),
                ("attach_prog_fd", _u32), ("attach_btf_obj_fd", _u32), ("fd_array", _ptr),
                ("func_info", _ptr), ("func_info_cnt", _u32), ("func_info_rec_size", _u32),
                ("line_info", _ptr), ("line_info_cnt", _u32), ("line_info_rec_size", _u32),
                ("log_level", _u32), ("log_size", _u32), ("log_buf", _ptr)]


@mirror("struct bpf_btf_load_opts", LIBBPF_BPF_H, kind="libbpf")
class BtfLoadOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("log_buf", _ptr), ("log_level", _u32), ("log_size", _u32)]


@mirror("struct bpf_map_batch_opts", LIBBPF_BPF_H, kind="libbpf")
class BatchOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", _u64), ("flags", _u64)]


@mirror("struct bpf_test_run_opts", LIBBPF_BPF_H, kind="libbpf")
class TestRunOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", _ptr), ("data_out", _ptr),
                ("data_size_in", _u32), ("data_size_out", _u32), ("ctx_in", _ptr), ("ctx_out", _ptr),
                ("ctx_size_in", _u32), ("ctx_size_out", _u32), ("retval", _u32),
                ("repeat", ctypes.c_int), ("duration", _u32), ("flags", _u32), ("cpu", _u32),
                ("batch_size", _u32)]


def _opts(kind, **fields):
    return kind(sz=ctypes.sizeof(kind), **fields)


def _declare(lib):
    """libbpf's prototypes (bpf.h, btf.h of 1.1), as ctypes must know them."""
    i, p, c = ctypes.c_int, _ptr, ctypes.c_char_p
    pu32 = ctypes.POINTER(_u32)
    for name, res, args in (
            ("bpf_map_create", i, [i, c, _u32, _u32, _u32, p]),
            ("bpf_prog_load", i, [i, c, c, p, ctypes.c_size_t, p]),
            ("bpf_btf_load", i, [p, ctypes.c_size_t, p]),
            ("bpf_obj_pin", i, [i, c]),
            ("bpf_obj_get", i, [c]),
            ("bpf_obj_get_info_by_fd", i, [i, p, pu32]),
            ("bpf_prog_get_fd_by_id", i, [_u32]),
            ("bpf_map_get_fd_by_id", i, [_u32]),
            ("bpf_map_lookup_elem", i, [i, p, p]),
            ("bpf_map_update_elem", i, [i, p, p, _u64]),
            ("bpf_map_delete_elem", i, [i, p]),
            ("bpf_map_get_next_key", i, [i, p, p]),
            ("bpf_map_lookup_batch", i, [i, p, p, p, p, pu32, p]),
            ("bpf_map_update_batch", i, [i, p, p, pu32, p]),
            ("bpf_map_delete_batch", i, [i, p, pu32, p]),
            ("bpf_prog_test_run_opts", i, [i, p]),
            ("bpf_raw_tracepoint_open", i, [c, i]),
            ("btf__load_vmlinux_btf", p, []),
            ("btf__find_by_name_kind", ctypes.c_int32, [p, c, _u32]),
            ("btf__type_by_id", p, [p, _u32]),
            ("btf__name_by_offset", c, [p, _u32]),
            ("btf__load_from_kernel_by_id", p, [_u32]),
            ("btf__raw_data", p, [p, pu32]),
            ("btf__free", None, [p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


_lib = None


def libbpf():
    """Debian's libbpf1 (bcc's own dependency), loaded on first use."""
    global _lib
    if _lib is None:
        try:
            _lib = _declare(ctypes.CDLL("libbpf.so.1", use_errno=True))
        except OSError as e:
            raise BpfError(errno.ENOENT, f"libbpf.so.1 not found ({e}): apt-get install libbpf1")
    return _lib


def _check(ret: int) -> int:
    """libbpf 1.x returns -errno on failure (and sets errno)."""
    if ret < 0:
        raise BpfError(-ret, os.strerror(-ret))
    return ret


def _ref(obj) -> int | None:
    return None if obj is None else ctypes.addressof(obj)


def obj_get(path: str) -> int:
    return _check(libbpf().bpf_obj_get(path.encode()))


def pinned_prog_id(path: str) -> int:
    """The id of the program pinned at PATH, or 0 when nothing is."""
    try:
        fd = obj_get(path)
    except BpfError:
        return 0
    try:
        return prog_info(fd).id
    finally:
        os.close(fd)


def obj_pin(fd: int, path: str) -> None:
    _check(libbpf().bpf_obj_pin(fd, path.encode()))


def prog_fd_by_id(prog_id: int) -> int:
    return _check(libbpf().bpf_prog_get_fd_by_id(prog_id))


def map_fd_by_id(map_id: int) -> int:
    return _check(libbpf().bpf_map_get_fd_by_id(map_id))


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, name: str,
               flags: int = 0, btf_fd: int = 0, btf_key_type_id: int = 0,
               btf_value_type_id: int = 0) -> int:
    """A new map (an fd); with BTF_FD and the type ids, bpftool prints its
    entries by field."""
    opts = _opts(MapCreateOpts, map_flags=flags, btf_fd=btf_fd, btf_key_type_id=btf_key_type_id,
                 btf_value_type_id=btf_value_type_id)
    return _check(libbpf().bpf_map_create(map_type, name.encode()[:15], key_size, value_size,
                                          max_entries, ctypes.byref(opts)))


BPF_MAP_TYPE_ARRAY_OF_MAPS = 12


def wait_for_programs() -> None:
    """Return only when every BPF program running at the call has
    finished (an RCU grace period): after a map write, no program still
    works from what it read before.  The kernel waits so on an update of
    a map-in-map (syscall.c, maybe_wait_bpf_programs: synchronize_rcu(),
    since Linux 4.19), so update a throwaway one."""
    inner = map_create(BPF_MAP_TYPE_ARRAY, 4, 4, 1, "mrc_grace_in")
    try:
        opts = _opts(MapCreateOpts, inner_map_fd=inner)
        outer = _check(libbpf().bpf_map_create(BPF_MAP_TYPE_ARRAY_OF_MAPS, b"mrc_grace", 4, 4, 1,
                                               ctypes.byref(opts)))
        try:
            map_update(outer, _u32(0), _u32(inner))
        finally:
            os.close(outer)
    finally:
        os.close(inner)


class VerifierError(BpfError):
    """A program the kernel refused; .log is the verifier's log (the
    retry's, with log level 1), maybe cut short."""
    log = ""


LOG_SIZE = 1 << 24


def prog_load(prog_type: int, insns: bytes, license: str, name: str,
              expected_attach_type: int = 0, flags: int = 0, log: bool = True,
              attach_btf_id: int = 0) -> int:
    """Load ready instructions (map references already fds): a program's
    fd.  A refusal is loaded again with the verifier's log on (LOG), and
    raises VerifierError carrying it.  ATTACH_BTF_ID: a tracing program's
    kernel function (its id in the kernel's BTF)."""
    code = ctypes.create_string_buffer(insns, len(insns))
    args = (prog_type, name.encode()[:15], license.encode(), code, len(insns) // 8)
    opts = _opts(ProgLoadOpts, expected_attach_type=expected_attach_type, prog_flags=flags,
                 attach_btf_id=attach_btf_id)
    ret = libbpf().bpf_prog_load(*args, ctypes.byref(opts))
    if ret >= 0:
        return ret
    if not log:
        raise VerifierError(-ret, os.strerror(-ret))
    buf = ctypes.create_string_buffer(LOG_SIZE)
    opts = _opts(ProgLoadOpts, expected_attach_type=expected_attach_type, prog_flags=flags,
                 attach_btf_id=attach_btf_id, log_level=1, log_size=LOG_SIZE, log_buf=ctypes.addressof(buf))
    again = libbpf().bpf_prog_load(*args, ctypes.byref(opts))
    if again >= 0:          # refused once, accepted with the log on: take it
        return again
    err = VerifierError(-ret, os.strerror(-ret))
    err.log = buf.value.decode(errors="replace")
    raise err


def tracing_attach(prog_fd: int) -> int:
    """A loaded fentry/fexit program attached to its kernel function: the
    link's fd (pinned, it outlives this process; unpinned and closed, the
    program comes off)."""
    return _check(libbpf().bpf_raw_tracepoint_open(None, prog_fd))


def raw_tracepoint_attach(prog_fd: int, tracepoint: str) -> int:
    """A loaded raw tracepoint program attached to TRACEPOINT: the link's fd."""
    return _check(libbpf().bpf_raw_tracepoint_open(tracepoint.encode(), prog_fd))


def btf_load(data: bytes) -> int:
    """Load BTF (types of a build's maps): its fd."""
    buf = ctypes.create_string_buffer(data, len(data))
    return _check(libbpf().bpf_btf_load(buf, len(data), None))


def btf_raw(btf_id: int) -> bytes:
    """The BTF object BTF_ID as the kernel holds it, raw (bcc's, say)."""
    lib = libbpf()
    btf = lib.btf__load_from_kernel_by_id(btf_id)
    if not btf:
        err = ctypes.get_errno() or errno.ENOENT
        raise BpfError(err, f"BTF {btf_id}: {os.strerror(err)}")
    try:
        size = _u32()
        data = lib.btf__raw_data(btf, ctypes.byref(size))
        if not data:
            raise BpfError(errno.ENOMEM, f"BTF {btf_id}: no raw data")
        return ctypes.string_at(data, size.value)
    finally:
        lib.btf__free(btf)


def map_lookup(fd: int, key, value) -> bool:
    """VALUE filled with KEY's; False when there is no such key."""
    ret = libbpf().bpf_map_lookup_elem(fd, _ref(key), _ref(value))
    if ret == -errno.ENOENT:
        return False
    _check(ret)
    return True


def map_update(fd: int, key, value, flags: int = BPF_ANY) -> None:
    _check(libbpf().bpf_map_update_elem(fd, _ref(key), _ref(value), flags))


def map_delete(fd: int, key) -> bool:
    """False when KEY was not there."""
    ret = libbpf().bpf_map_delete_elem(fd, _ref(key))
    if ret == -errno.ENOENT:
        return False
    _check(ret)
    return True


def lookup_batch(fd: int, in_batch, out_batch, keys, values, count: int) -> tuple[int, bool]:
    """One BPF_MAP_LOOKUP_BATCH into the buffers: (entries read, whether
    the map is done).  IN_BATCH None starts at the beginning."""
    n = _u32(count)
    ret = libbpf().bpf_map_lookup_batch(fd, _ref(in_batch), _ref(out_batch), _ref(keys),
                                        _ref(values), ctypes.byref(n), None)
    if ret == -errno.ENOENT:
        return n.value, True
    try:
        _check(ret)
    except BpfError as e:
        e.done = n.value
        raise
    return n.value, False


@mirror("struct bpf_prog_info", KERNEL_BPF_H, kind="prefix")
class ProgInfo(ctypes.Structure):
    """Head of struct bpf_prog_info (uapi/linux/bpf.h): enough for id/name."""
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("tag", ctypes.c_uint8 * 8), ("jited_prog_len", ctypes.c_uint32),
                ("xlated_prog_len", ctypes.c_uint32), ("jited_prog_insns", ctypes.c_uint64),
                ("xlated_prog_insns", ctypes.c_uint64), ("load_time", ctypes.c_uint64),
                ("created_by_uid", ctypes.c_uint32), ("nr_map_ids", ctypes.c_uint32),
                ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16)]


@mirror("struct bpf_map_info", KERNEL_BPF_H, kind="prefix")
class MapInfo(ctypes.Structure):
    """Head of struct bpf_map_info: the shape, and the BTF it was made with."""
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16), ("ifindex", ctypes.c_uint32),
                ("btf_vmlinux_value_type_id", ctypes.c_uint32), ("netns_dev", ctypes.c_uint64),
                ("netns_ino", ctypes.c_uint64), ("btf_id", ctypes.c_uint32),
                ("btf_key_type_id", ctypes.c_uint32), ("btf_value_type_id", ctypes.c_uint32)]


@mirror("struct __sk_buff", KERNEL_BPF_H, kind="prefix")
class SkbHead(ctypes.Structure):
    """Head of struct __sk_buff: enough to give a TC test run its mark."""
    _fields_ = [("len", ctypes.c_uint32), ("pkt_type", ctypes.c_uint32), ("mark", ctypes.c_uint32)]


def prog_test_run(prog_fd: int, packet: bytes, repeat: int,
                  ctx: ctypes.Structure | None = None) -> tuple[int, int, bytes]:
    """BPF_PROG_TEST_RUN: (return value, mean ns per run, packet out);
    CTX, if given, is the program's context in (e.g. SkbHead)."""
    data_in = ctypes.create_string_buffer(packet, len(packet))
    data_out = ctypes.create_string_buffer(len(packet) + 512)
    opts = _opts(TestRunOpts, data_in=ctypes.addressof(data_in), data_out=ctypes.addressof(data_out),
                 data_size_in=len(packet), data_size_out=len(data_out), repeat=repeat)
    if ctx is not None:
        opts.ctx_size_in, opts.ctx_in = ctypes.sizeof(ctx), ctypes.addressof(ctx)
    _check(libbpf().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)))
    return opts.retval, opts.duration, data_out.raw[:opts.data_size_out]


def _info(fd: int, info_type):
    info = info_type()
    size = _u32(ctypes.sizeof(info))
    _check(libbpf().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)))
    return info


def prog_info(fd: int) -> ProgInfo:
    return _info(fd, ProgInfo)


def map_info(fd: int) -> MapInfo:
    return _info(fd, MapInfo)


def possible_cpus() -> int:
    """Per-CPU maps hold one value per possible CPU (not online)."""
    text = open("/sys/devices/system/cpu/possible").read().strip()
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


class PinnedMap:
    """A map opened from its pin, with ctypes key and value types.

    With a journal (journal.Journal) set, update and delete record how to
    undo themselves."""

    fd = -1
    journal = None
    # called after every write (update, delete, batches), also one that
    # failed part-way: the peers map bumps peers_gen with it, which
    # invalidates the datapath's cache of the trie (lib/peer_cache.h)
    after_write = None

    def __init__(self, path: str, key_type, value_type, percpu: bool = False, fd: int | None = None):
        self.path = path
        fd = obj_get(path) if fd is None else fd
        self.key_type = key_type
        self.percpu = percpu
        self.value_type = value_type * possible_cpus() if percpu else value_type
        info = map_info(fd)
        if info.key_size != ctypes.sizeof(key_type) or \
                info.value_size != ctypes.sizeof(value_type):
            os.close(fd)
            raise BpfError(errno.EPROTO, f"{path}: map layout differs from this mrcctl "
                           f"(key {info.key_size}/{ctypes.sizeof(key_type)}, value "
                           f"{info.value_size}/{ctypes.sizeof(value_type)} bytes)")
        self.max_entries = info.max_entries
        self.map_type = info.type
        self.name = os.path.basename(path)
        self.fd = fd
        # an LPM trie's exact keys, once walked: its lookup answers the
        # longest match, and walking it for every journaled write made a
        # bulk add quadratic (kept up to date by our own writes; the
        # datapath never writes a trie, and one writer holds the lock)
        self._exact: set[bytes] | None = None

    @classmethod
    def from_fd(cls, fd: int, key_type, value_type, percpu: bool = False, name: str = "map"):
        """A map this process loaded itself (e.g. bcc's), not pinned: works
        on a duplicate of `fd`, closed with this object."""
        return cls(name, key_type, value_type, percpu, fd=os.dup(fd))

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        self.close()

    def lookup(self, key):
        value = self.value_type()
        return value if map_lookup(self.fd, key, value) else None

    def lookup_exact(self, key):
        """The value stored under exactly KEY (an LPM trie's lookup
        answers the longest matching prefix instead)."""
        if self.map_type != BPF_MAP_TYPE_LPM_TRIE:
            return self.lookup(key)
        if self._exact is None:
            self._exact = {bytes(k) for k in self.keys()}
        return self.lookup(key) if bytes(key) in self._exact else None

    def _journal(self, key, what: str) -> None:
        self.journal.before_write(f"{what} {self.name}")
        raw = bytes(key)
        old = self.lookup_exact(self.key_type.from_buffer_copy(raw))
        if old is None:
            self.journal.record_map(self.path, delete=raw)
        else:
            self.journal.record_map(self.path, keys=raw, values=bytes(old))

    def _update(self, key, value, flags=BPF_ANY):
        if self.journal is not None:
            self._journal(key, "update")
        try:
            map_update(self.fd, key, value, flags)
        except BpfError as e:
            if e.errno == errno.E2BIG:
                raise BpfError(e.errno, f"map {self.name} is full ({self.max_entries} entries)")
            raise BpfError(e.errno, f"map {self.name}: update: {e.strerror}")
        if self._exact is not None:
            self._exact.add(bytes(key))

    def _delete(self, key) -> bool:
        if self.journal is not None:
            self._journal(key, "delete")
        if self._exact is not None:
            self._exact.discard(bytes(key))
        return map_delete(self.fd, key)

    # ---- many elements in one bpf(2) call (hash maps since 5.6, LPM tries
    # since 5.13: both kernels this runs on).  Keys and values are packed
    # bytes, one after the other.  They bypass the journal: callers that
    # need all-or-nothing record their own (cheap) undo (control/bulk.py).

    def _batch(self, keys: bytes, values: bytes | None, count: int, flags=BPF_ANY) -> int:
        """One batch update (VALUES) or delete (None); returns how many
        elements were done, or raises BpfError with `.done` set."""
        kbuf = ctypes.create_string_buffer(keys, len(keys))
        n = _u32(count)
        opts = _opts(BatchOpts, elem_flags=flags)
        if values is None:
            ret = libbpf().bpf_map_delete_batch(self.fd, kbuf, ctypes.byref(n), ctypes.byref(opts))
        else:
            vbuf = ctypes.create_string_buffer(values, len(values))
            ret = libbpf().bpf_map_update_batch(self.fd, kbuf, vbuf, ctypes.byref(n), ctypes.byref(opts))
        try:
            _check(ret)
        except BpfError as e:
            e.done = n.value
            raise
        return n.value

    def _update_batch(self, keys: bytes, values: bytes, count: int, flags=BPF_ANY) -> None:
        """Write COUNT packed keys and values; on an error the first
        `e.done` of them are written.  Falls back to one call per element
        where the kernel has no batch update for the map type (EINVAL /
        ENOTSUPP before anything was written)."""
        if not count:
            return
        ks, vs = ctypes.sizeof(self.key_type), ctypes.sizeof(self.value_type)
        try:
            self._batch(keys, values, count, flags)
        except BpfError as e:
            if e.errno in (errno.EINVAL, errno.ENOTSUP, 524) and not e.done:   # 524: ENOTSUPP
                self._each(keys, values, count, ks, vs, flags)
            elif e.errno == errno.E2BIG:
                raise self._full(e)
            else:
                raise
        if self._exact is not None:
            self._exact.update(keys[i * ks:(i + 1) * ks] for i in range(count))

    def update_many(self, items: list, what: str = "update") -> None:
        """Write ITEMS ((key, value) ctypes objects) in one batch, journaled
        as one undo step (one log write where one a key fsync'd the log
        4,400 times for a host's 8 templates of 256 paths: seconds on a
        disk), and counted against MRC_FAIL_WRITE element by element (a
        failure at the Nth writes the N-1 before it)."""
        if not items:
            return
        ks, vs = ctypes.sizeof(self.key_type), ctypes.sizeof(self.value_type)
        keys = b"".join(bytes(k) for k, _ in items)
        values = b"".join(bytes(v) for _, v in items)
        at = None
        if self.journal is not None:
            new, old_keys, old_values = [], [], []
            for k, _ in items:
                raw = bytes(k)
                old = self.lookup_exact(self.key_type.from_buffer_copy(raw))
                if old is None:
                    new.append(raw)
                else:
                    old_keys.append(raw)
                    old_values.append(bytes(old))
            at = self.journal.reserve(len(items), f"{what} {self.name}")
            failing = self.journal.writes
            self.journal.record_map(self.path, b"".join(new), b"".join(old_keys), b"".join(old_values))
        if at is not None:
            self.update_batch(keys[:at * ks], values[:at * vs], at)
            # the journal's own error (bpfsys sits below the journal)
            raise self.journal.injected(f"failure injected at write {failing} ({what} {self.name}, "
                                        f"element {at + 1} of {len(items)}) by MRC_FAIL_WRITE")
        self.update_batch(keys, values, len(items))

    def _written(self, op, *args, **kw):
        """Run a write, then after_write whatever became of it."""
        try:
            return op(*args, **kw)
        finally:
            if self.after_write is not None:
                self.after_write()

    def update(self, *args, **kw):
        return self._written(self._update, *args, **kw)

    def delete(self, *args, **kw):
        return self._written(self._delete, *args, **kw)

    def update_batch(self, *args, **kw):
        return self._written(self._update_batch, *args, **kw)

    def delete_batch(self, *args, **kw):
        return self._written(self._delete_batch, *args, **kw)

    def _full(self, e: BpfError) -> BpfError:
        full = BpfError(e.errno, f"map {self.name} is full ({self.max_entries} entries)")
        full.done = getattr(e, "done", 0)
        return full

    def _delete_batch(self, keys: bytes, count: int, missing_ok: bool = True) -> None:
        """Delete COUNT packed keys; keys not in the map are skipped
        (MISSING_OK) or an error."""
        ks = ctypes.sizeof(self.key_type)
        start = 0
        while start < count:
            try:
                self._batch(keys[start * ks:count * ks], None, count - start)
                break
            except BpfError as e:
                if e.errno in (errno.EINVAL, errno.ENOTSUP, 524) and not e.done:
                    for i in range(start, count):
                        self._delete_raw(keys[i * ks:(i + 1) * ks], missing_ok)
                    break
                if e.errno != errno.ENOENT or not missing_ok:
                    raise
                start += e.done + 1         # the missing one is skipped
        if self._exact is not None:
            self._exact.difference_update(keys[i * ks:(i + 1) * ks] for i in range(count))

    def _delete_raw(self, key: bytes, missing_ok: bool) -> None:
        if not map_delete(self.fd, ctypes.create_string_buffer(key, len(key))) and not missing_ok:
            raise BpfError(errno.ENOENT, os.strerror(errno.ENOENT))

    def _each(self, keys: bytes, values: bytes, count: int, ks: int, vs: int, flags) -> None:
        kbuf = ctypes.create_string_buffer(keys, len(keys))
        vbuf = ctypes.create_string_buffer(values, len(values))
        k0, v0 = ctypes.addressof(kbuf), ctypes.addressof(vbuf)
        update = libbpf().bpf_map_update_elem
        for i in range(count):
            try:
                _check(update(self.fd, k0 + i * ks, v0 + i * vs, flags))
            except BpfError as e:
                e.done = i
                if e.errno == errno.E2BIG:
                    raise self._full(e)
                raise

    def dump(self, chunk: int = 8192) -> tuple[bytes, bytes, int]:
        """Every key and value, packed (BPF_MAP_LOOKUP_BATCH; the key
        walk where the kernel has none)."""
        ks, vs = ctypes.sizeof(self.key_type), ctypes.sizeof(self.value_type)
        keys, values, total = [], [], 0
        kbuf = ctypes.create_string_buffer(ks * chunk)
        vbuf = ctypes.create_string_buffer(vs * chunk)
        token_in = ctypes.create_string_buffer(max(ks, 8))
        token_out = ctypes.create_string_buffer(max(ks, 8))
        first = True
        while True:
            try:
                n, done = lookup_batch(self.fd, None if first else token_in, token_out, kbuf, vbuf,
                                       chunk)
            except BpfError as e:
                if e.errno in (errno.EINVAL, errno.ENOTSUP, 524) and first:
                    return self._dump_walk()
                raise
            keys.append(kbuf.raw[:n * ks])
            values.append(vbuf.raw[:n * vs])
            total += n
            if done:
                return b"".join(keys), b"".join(values), total
            ctypes.memmove(token_in, token_out, len(token_out))
            first = False

    def _dump_walk(self) -> tuple[bytes, bytes, int]:
        keys, values = [], []
        for k, v in self.items():
            keys.append(bytes(k))
            values.append(bytes(v))
        return b"".join(keys), b"".join(values), len(keys)

    def keys(self):
        key, nxt = None, self.key_type()
        next_key = libbpf().bpf_map_get_next_key
        while True:
            ret = next_key(self.fd, _ref(key), ctypes.byref(nxt))
            if ret == -errno.ENOENT:
                return
            _check(ret)
            key = self.key_type.from_buffer_copy(nxt)
            yield key

    def items(self):
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                yield key, value
