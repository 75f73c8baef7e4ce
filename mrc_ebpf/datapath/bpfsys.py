"""The bpf(2) calls the loader needs on pinned objects, through ctypes.

bcc compiles and loads; every later command works on pinned maps and
programs from a new process, without compiling, so it needs only these:
open a pin, pin, look up / update / delete / iterate a map, and ask the
kernel an object's id; and to load a kept build without bcc
(build_cache.py), create a map and load a program.
"""
from __future__ import annotations

import ctypes
import errno
import os

from mrc_ebpf.datapath.mirrors import KERNEL_BPF_H, mirror

_libc = ctypes.CDLL(None, use_errno=True)
_NR_BPF = 321  # x86_64

BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_TEST_RUN = 10
BPF_MAP_LOOKUP_BATCH = 24
BPF_MAP_UPDATE_BATCH = 26
BPF_MAP_DELETE_BATCH = 27

BPF_ANY = 0
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_LPM_TRIE = 11


class BpfError(OSError):
    pass


@mirror("union bpf_attr", KERNEL_BPF_H, kind="member")
class MapElemAttr(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


@mirror("union bpf_attr", KERNEL_BPF_H, kind="member", member="batch")
class BatchAttr(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


@mirror("union bpf_attr", KERNEL_BPF_H, kind="member")
class _MapCreateAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
                ("numa_node", ctypes.c_uint32), ("map_name", ctypes.c_char * 16)]


@mirror("union bpf_attr", KERNEL_BPF_H, kind="member")
class _ProgLoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
                ("prog_ifindex", ctypes.c_uint32), ("expected_attach_type", ctypes.c_uint32)]


@mirror("union bpf_attr", KERNEL_BPF_H, kind="member")
class _ObjAttr(ctypes.Structure):
    _fields_ = [("pathname", ctypes.c_uint64), ("bpf_fd", ctypes.c_uint32),
                ("file_flags", ctypes.c_uint32)]


@mirror("union bpf_attr", KERNEL_BPF_H, kind="member", member="info")
class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


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
    """Head of struct bpf_map_info."""
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


@mirror("union bpf_attr", KERNEL_BPF_H, kind="member", member="test")
class _TestRunAttr(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


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
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(packet), data_size_out=len(data_out),
                        data_in=ctypes.addressof(data_in), data_out=ctypes.addressof(data_out),
                        repeat=repeat)
    if ctx is not None:
        attr.ctx_size_in, attr.ctx_in = ctypes.sizeof(ctx), ctypes.addressof(ctx)
    bpf(BPF_PROG_TEST_RUN, attr)
    return attr.retval, attr.duration, data_out.raw[:attr.data_size_out]


def bpf(cmd: int, attr: ctypes.Structure) -> int:
    ret = _libc.syscall(_NR_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, os.strerror(err))
    return ret


def obj_get(path: str) -> int:
    raw = path.encode()
    attr = _ObjAttr(pathname=ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p).value)
    return bpf(BPF_OBJ_GET, attr)


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, name: str,
               flags: int = 0) -> int:
    """A new map (an fd), without BTF: state Python alone keeps beside the
    datapath's maps, or a cached build's maps (build_cache.py)."""
    attr = _MapCreateAttr(map_type=map_type, key_size=key_size, value_size=value_size,
                          max_entries=max_entries, map_flags=flags, map_name=name.encode()[:15])
    return bpf(BPF_MAP_CREATE, attr)


def prog_load(prog_type: int, insns: bytes, license: str, name: str,
              expected_attach_type: int = 0, flags: int = 0) -> int:
    """BPF_PROG_LOAD of ready instructions (map references already fds):
    a program's fd, or BpfError with the verifier's errno."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license.encode())
    attr = _ProgLoadAttr(prog_type=prog_type, insn_cnt=len(insns) // 8,
                         insns=ctypes.addressof(code), license=ctypes.addressof(lic),
                         prog_flags=flags, prog_name=name.encode()[:15],
                         expected_attach_type=expected_attach_type)
    return bpf(BPF_PROG_LOAD, attr)


def obj_pin(fd: int, path: str) -> None:
    raw = path.encode()
    attr = _ObjAttr(pathname=ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p).value, bpf_fd=fd)
    bpf(BPF_OBJ_PIN, attr)


def _info(fd: int, info_type):
    info = info_type()
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
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

    def _elem(self, cmd, key, value=None, flags=0):
        attr = MapElemAttr(map_fd=self.fd, key=ctypes.addressof(key),
                           value=ctypes.addressof(value) if value is not None else 0,
                           flags=flags)
        return bpf(cmd, attr)

    def lookup(self, key):
        value = self.value_type()
        try:
            self._elem(BPF_MAP_LOOKUP_ELEM, key, value)
        except BpfError as e:
            if e.errno == errno.ENOENT:
                return None
            raise
        return value

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
            self._elem(BPF_MAP_UPDATE_ELEM, key, value, flags)
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
        try:
            self._elem(BPF_MAP_DELETE_ELEM, key)
        except BpfError as e:
            if e.errno == errno.ENOENT:
                return False
            raise
        return True

    # ---- many elements in one bpf(2) call (hash maps since 5.6, LPM tries
    # since 5.13: both kernels this runs on).  Keys and values are packed
    # bytes, one after the other.  They bypass the journal: callers that
    # need all-or-nothing record their own (cheap) undo (control/bulk.py).

    def _batch(self, cmd: int, keys: bytes, values: bytes | None, count: int, flags=BPF_ANY) -> int:
        """One batch call; returns how many elements were done before an
        error (raised as BpfError with `.done` set)."""
        kbuf = ctypes.create_string_buffer(keys, len(keys))
        vbuf = ctypes.create_string_buffer(values, len(values)) if values is not None else None
        attr = BatchAttr(keys=ctypes.addressof(kbuf), values=ctypes.addressof(vbuf) if vbuf else 0,
                         count=count, map_fd=self.fd, elem_flags=flags)
        try:
            bpf(cmd, attr)
        except BpfError as e:
            e.done = attr.count
            raise
        return attr.count

    def _update_batch(self, keys: bytes, values: bytes, count: int, flags=BPF_ANY) -> None:
        """Write COUNT packed keys and values; on an error the first
        `e.done` of them are written.  Falls back to one call per element
        where the kernel has no batch update for the map type (EINVAL /
        ENOTSUPP before anything was written)."""
        if not count:
            return
        ks, vs = ctypes.sizeof(self.key_type), ctypes.sizeof(self.value_type)
        try:
            self._batch(BPF_MAP_UPDATE_BATCH, keys, values, count, flags)
        except BpfError as e:
            if e.errno in (errno.EINVAL, errno.ENOTSUP, 524) and not e.done:   # 524: ENOTSUPP
                self._each(BPF_MAP_UPDATE_ELEM, keys, values, count, ks, vs, flags)
            elif e.errno == errno.E2BIG:
                raise self._full(e)
            else:
                raise
        if self._exact is not None:
            self._exact.update(keys[i * ks:(i + 1) * ks] for i in range(count))

    def update(self, *args, **kw):
        try:
            return self._update(*args, **kw)
        finally:
            if self.after_write is not None:
                self.after_write()

    def delete(self, *args, **kw):
        try:
            return self._delete(*args, **kw)
        finally:
            if self.after_write is not None:
                self.after_write()

    def update_batch(self, *args, **kw):
        try:
            return self._update_batch(*args, **kw)
        finally:
            if self.after_write is not None:
                self.after_write()

    def delete_batch(self, *args, **kw):
        try:
            return self._delete_batch(*args, **kw)
        finally:
            if self.after_write is not None:
                self.after_write()

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
                self._batch(BPF_MAP_DELETE_BATCH, keys[start * ks:count * ks], None, count - start)
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
        k = ctypes.create_string_buffer(key, len(key))
        try:
            bpf(BPF_MAP_DELETE_ELEM, MapElemAttr(map_fd=self.fd, key=ctypes.addressof(k)))
        except BpfError as e:
            if e.errno != errno.ENOENT or not missing_ok:
                raise

    def _each(self, cmd, keys: bytes, values: bytes, count: int, ks: int, vs: int, flags) -> None:
        kbuf = ctypes.create_string_buffer(keys, len(keys))
        vbuf = ctypes.create_string_buffer(values, len(values))
        k0, v0 = ctypes.addressof(kbuf), ctypes.addressof(vbuf)
        attr = MapElemAttr(map_fd=self.fd, flags=flags)
        for i in range(count):
            attr.key, attr.value = k0 + i * ks, v0 + i * vs
            try:
                bpf(cmd, attr)
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
            attr = BatchAttr(in_batch=0 if first else ctypes.addressof(token_in),
                             out_batch=ctypes.addressof(token_out), keys=ctypes.addressof(kbuf),
                             values=ctypes.addressof(vbuf), count=chunk, map_fd=self.fd)
            done = False
            try:
                bpf(BPF_MAP_LOOKUP_BATCH, attr)
            except BpfError as e:
                if e.errno == errno.ENOENT:
                    done = True
                elif e.errno in (errno.EINVAL, errno.ENOTSUP, 524) and first:
                    return self._dump_walk()
                else:
                    raise
            n = attr.count
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
        while True:
            attr = MapElemAttr(map_fd=self.fd, key=ctypes.addressof(key) if key is not None else 0,
                               value=ctypes.addressof(nxt))
            try:
                bpf(BPF_MAP_GET_NEXT_KEY, attr)
            except BpfError as e:
                if e.errno == errno.ENOENT:
                    return
                raise
            key = self.key_type.from_buffer_copy(nxt)
            yield key

    def items(self):
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                yield key, value
