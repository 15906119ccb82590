"""The map calls bcc's table objects make slowly or not at all, straight through libbpf
(bcc.libbcc.lib): a whole map read (or taken) in batches, one entry taken, keys deleted in batches."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from offcpu_exporter.probe.config import ProbeError

__all__ = ["Convert", "Entry", "WordsLookup", "delete_batch", "lookup_and_delete", "lookup_batch"]

_ENOTSUPP = 524  # the kernel-internal "operation not supported" some map types return
_T = TypeVar("_T")
Convert = Callable[[Iterator[tuple[Any, ...]], Iterator[tuple[Any, ...]]], Iterable[_T]]


class Entry(NamedTuple):
    """How a map's keys and values unpack (bpf/offcpu.h's structs, little-endian x86-64 layout:
    the sizes are checked against the compiled program's at each read)."""

    key: struct.Struct
    value: struct.Struct


def lookup_batch(lib: Any, table: Any, name: str, entry: Entry, convert: Convert[_T], *,
                 delete: bool = False) -> list[_T]:
    """Every entry of a hash map (bcc's `table`, `name` in errors), in a few BPF_MAP_LOOKUP_BATCH
    calls (BPF_MAP_LOOKUP_AND_DELETE_BATCH with `delete`), unpacked by `entry` (its keys' and
    values' struct formats) a batch at a time and `convert`ed from the two iterators of tuples.
    Walking a hash map with get_next_key while the kernel deletes entries restarts from the first
    bucket when the current key is gone (htab_map_get_next_key()): entries are skipped or read
    twice. The batch walk resumes from a bucket index instead. (bcc's items_lookup_batch passes one
    variable as both the resume token and the count.) Unpacking raw bytes with `struct` rather than
    reading ctypes fields one entry at a time is what keeps a read of 50,000 entries in milliseconds."""
    key_size, value_size = ctypes.sizeof(table.Key), ctypes.sizeof(table.Leaf)
    if (entry.key.size, entry.value.size) != (key_size, value_size):
        raise ProbeError(f"map {name}: entries of {key_size} + {value_size} bytes, "
                         f"read as {entry.key.size} + {entry.value.size}")
    call = lib.bpf_lookup_and_delete_batch if delete else lib.bpf_lookup_batch
    size = max(64, min(table.max_entries, 4096))
    keys, values = ctypes.create_string_buffer(size * key_size), ctypes.create_string_buffer(size * value_size)
    out: list[_T] = []
    token_in, token_out, count = ctypes.c_uint32(0), ctypes.c_uint32(0), ctypes.c_uint32(0)
    first = True
    while True:
        count.value = size
        rc = call(table.map_fd, None if first else ctypes.byref(token_in), ctypes.byref(token_out),
                  keys, values, ctypes.byref(count))
        err = ctypes.get_errno()
        n = count.value
        if n:
            # Read before the buffers are reused by the next call.
            out.extend(convert(entry.key.iter_unpack(memoryview(keys)[: n * key_size]),
                               entry.value.iter_unpack(memoryview(values)[: n * value_size])))
        if rc != 0:
            if err == errno.ENOENT:
                return out  # the end of the map
            if err == errno.ENOSPC and n == 0:
                # One bucket holds more entries than the buffer: a bigger one.
                size *= 4
                keys = ctypes.create_string_buffer(size * key_size)
                values = ctypes.create_string_buffer(size * value_size)
                continue
            raise OSError(err, f"BPF_MAP_LOOKUP{'_AND_DELETE' if delete else ''}_BATCH on {name}: "
                               f"{os.strerror(err)}")
        token_in.value = token_out.value
        first = False


class WordsLookup:
    """One entry at a time of a map with u64 keys and values of u64 words (the stack map), read
    with bpf_lookup_elem into one reused buffer and unpacked in C. bcc's `table[key]` makes ctypes
    objects for the key and the value, whose words are then read one Python step each: about twice
    the time, for every stack named or freed at a flush (thousands a flush beside a JIT)."""

    def __init__(self, lib: Any, table: Any) -> None:
        if ctypes.sizeof(table.Key) != 8 or ctypes.sizeof(table.Leaf) % 8:
            raise ProbeError(f"map of {ctypes.sizeof(table.Key)}-byte keys and {ctypes.sizeof(table.Leaf)}-byte "
                             "values read as u64 keys and u64 words")
        self._lookup = lib.bpf_lookup_elem
        self._fd = table.map_fd
        self._key = ctypes.c_uint64()
        self._key_ref = ctypes.byref(self._key)
        self._value = ctypes.create_string_buffer(ctypes.sizeof(table.Leaf))
        self._words = memoryview(self._value).cast("B").cast("Q")

    def __call__(self, key: int) -> list[int] | None:
        """The words of `key`'s value, None when the map has no such key."""
        self._key.value = key
        if self._lookup(self._fd, self._key_ref, self._value) != 0:
            return None
        return self._words.tolist()


def lookup_and_delete(lib: Any, fd: int, key: ctypes.Structure | ctypes.c_uint32,
                      value: ctypes.Structure | ctypes.c_uint64) -> bool:
    """Delete an entry and read its value as it was at the moment of deletion (an increment
    between a read and a delete would be lost); False when the key is not there."""
    rc = lib.bpf_lookup_and_delete(fd, ctypes.byref(key), ctypes.byref(value))
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOENT or rc == -errno.ENOENT:
        return False
    if err not in (errno.EINVAL, errno.EOPNOTSUPP, _ENOTSUPP):
        raise OSError(err, f"BPF_MAP_LOOKUP_AND_DELETE_ELEM: {os.strerror(err)}")
    # Hash maps take it since 5.14; before, an increment between the two calls is lost.
    if lib.bpf_lookup_elem(fd, ctypes.byref(key), ctypes.byref(value)) != 0:
        return False
    lib.bpf_delete_elem(fd, ctypes.byref(key))
    return True


def delete_batch(lib: Any, fd: int, name: str, keys: Sequence[int],
                 key_type: type[ctypes.c_uint32] | type[ctypes.c_uint64] = ctypes.c_uint32) -> None:
    """Delete integer `keys` (u32, or `key_type`) from a hash map in BPF_MAP_DELETE_BATCH calls.
    The kernel stops at a key that is not there (-ENOENT, `count` saying how many went before it):
    skip it, go on."""
    if not keys:
        return
    raw = (key_type * len(keys))(*keys)
    done = 0
    while done < len(keys):
        count = ctypes.c_uint32(len(keys) - done)
        if lib.bpf_delete_batch(fd, ctypes.byref(raw, done * ctypes.sizeof(key_type)),
                                ctypes.byref(count)) == 0:
            return
        err = ctypes.get_errno()
        if err != errno.ENOENT:
            raise OSError(err, f"BPF_MAP_DELETE_BATCH on {name}: {os.strerror(err)}")
        done += count.value + 1
