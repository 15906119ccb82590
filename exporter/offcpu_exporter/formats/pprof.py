"""Profile -> gzip-compressed pprof (perftools.profiles.Profile), as `go tool pprof`, Parca and
Pyroscope read it.

Two sample types, off-CPU nanoseconds (the default) and switch count. Labels are strings so
that Pyroscope, which ignores numeric pprof labels, keeps them too: pid, comm, tid and thread
(the thread's name; both absent when the exporter aggregates per process) and reason.

Addresses: the exporter knows each frame's offset in its file, not the runtime address, so each
mapping starts at 0 and a location's address is that file offset (address - memory_start +
file_offset is then the file offset, which is what a symbolizer needs). Mappings are shared by
all processes that map the same file. Frames are already symbolized, so mappings say
has_functions and `go tool pprof` does not try to symbolize them again.
"""

from __future__ import annotations

import gzip

from offcpu_exporter.formats.interning import Interner, StringTable
from offcpu_exporter.formats.profile import Profile
from offcpu_exporter.formats.proto import profile_pb2 as pb
from offcpu_exporter.snapshot import Frame, FrameKind

__all__ = ["SAMPLE_TYPES", "encode", "encode_message"]

# (type, unit) in value order; the first is default_sample_type.
SAMPLE_TYPES: tuple[tuple[str, str], ...] = (("off_cpu", "nanoseconds"), ("switches", "count"))

_KERNEL_MODULE = "[kernel.kallsyms]"  # perf's name for the kernel image


class _Tables:
    """Interns strings, mappings, functions and locations; every id is non-zero and unique."""

    def __init__(self, message: pb.Profile) -> None:
        self._message = message
        self.string = StringTable(message.string_table)
        self._mappings: Interner[tuple[str, str]] = Interner(first=1)
        self._functions: Interner[tuple[str, str]] = Interner(first=1)
        self._locations: Interner[Frame] = Interner(first=1)

    def mapping(self, frame: Frame) -> pb.Mapping | None:
        if frame.kind is FrameKind.PLACEHOLDER:
            return None
        module = frame.module or (_KERNEL_MODULE if frame.kind is FrameKind.KERNEL else "")
        if frame.kind is FrameKind.KERNEL and module in ("[kernel]", ""):
            module = _KERNEL_MODULE
        if not module:
            return None
        return self._message.mapping[self._mappings.index((module, frame.build_id), self._write_mapping) - 1]

    def _write_mapping(self, key: tuple[str, str], mapping_id: int) -> None:
        module, build_id = key
        self._message.mapping.add(
            id=mapping_id,
            memory_start=0,
            memory_limit=0,
            file_offset=0,
            filename=self.string(module),
            build_id=self.string(build_id),
            has_functions=True,
        )

    def function(self, frame: Frame, filename: str) -> int:
        return self._functions.index((frame.name, filename), self._write_function)

    def _write_function(self, key: tuple[str, str], function_id: int) -> None:
        name, filename = key
        name_index = self.string(name)
        self._message.function.add(
            id=function_id, name=name_index, system_name=name_index, filename=self.string(filename)
        )

    def location(self, frame: Frame) -> int:
        return self._locations.index(frame, self._write_location)

    def _write_location(self, frame: Frame, location_id: int) -> None:
        mapping = self.mapping(frame)
        filename = self._message.string_table[mapping.filename] if mapping is not None else ""
        address = frame.offset if mapping is not None else 0
        if mapping is not None and address >= mapping.memory_limit:
            mapping.memory_limit = address + 1
        location = self._message.location.add(
            id=location_id, mapping_id=mapping.id if mapping is not None else 0, address=address
        )
        location.line.add(function_id=self.function(frame, filename))


def encode_message(profile: Profile) -> pb.Profile:
    message = pb.Profile()
    tables = _Tables(message)
    for kind, unit in SAMPLE_TYPES:
        message.sample_type.add(type=tables.string(kind), unit=tables.string(unit))
    message.default_sample_type = message.sample_type[0].type
    message.time_nanos = profile.start_ns
    message.duration_nanos = profile.duration_ns
    comment = "offcpu-exporter: off-CPU time per stack"
    if profile.description:
        comment += f" ({profile.description})"
    message.comment.append(tables.string(comment))
    if profile.stack_sampled_ratio is not None:
        message.comment.append(tables.string(
            f"stack captures sampled: {profile.stack_sampled_ratio:.1%} of blocks; per-stack values are "
            "estimates that sum to the exact per-thread totals"))

    keys = {name: tables.string(name) for name in ("pid", "comm", "tid", "thread", "reason")}
    for s in profile.samples:
        sample = message.sample.add()
        sample.location_id.extend(tables.location(f) for f in s.stack.leaf_to_root())
        sample.value.extend((s.value.ns, s.value.count))
        labels = [("pid", str(s.process.pid)), ("comm", s.process.comm)]
        if s.tid:
            labels.append(("tid", str(s.tid)))
            if s.thread_name:
                labels.append(("thread", s.thread_name))
        labels.append(("reason", s.reason.label))
        for key, value in labels:
            sample.label.add(key=keys[key], str=tables.string(value))
    _main_binary_first(message, {p.exe for p in profile.processes.values() if p.exe})
    return message


def _main_binary_first(message: pb.Profile, executables: set[str]) -> None:
    """`go tool pprof` names the first mapping as the profile's "File": put the watched
    executables first, then other files, then pseudo files such as [kernel.kallsyms]."""

    def rank(mapping: pb.Mapping) -> tuple[int, int]:
        name = message.string_table[mapping.filename]
        return (0 if name in executables else 2 if name.startswith("[") else 1, mapping.id)

    ordered = sorted(message.mapping, key=rank)
    copies = [pb.Mapping() for _ in ordered]
    for copy, mapping in zip(copies, ordered, strict=True):
        copy.CopyFrom(mapping)
    del message.mapping[:]
    message.mapping.extend(copies)


def encode(profile: Profile, compresslevel: int = 6) -> bytes:
    """The gzip-compressed serialized profile (pprof files and HTTP bodies are gzipped)."""
    # mtime=0: the same profile always gives the same bytes.
    return gzip.compress(encode_message(profile).SerializeToString(), compresslevel, mtime=0)
