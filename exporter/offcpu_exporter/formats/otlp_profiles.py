"""Snapshot -> ExportProfilesServiceRequest (OTLP profiles v1development, proto v1.10.0). Pure: no I/O.

Layout of one request (one per flush):
- one ResourceProfiles per watched process that was off CPU in the interval (process.*, container.id,
  k8s.*, host.name, service.name), each with one ScopeProfiles naming this exporter;
- per process a Profile ``off_cpu``/``nanoseconds`` (no period_type, period 0: the OpenTelemetry eBPF
  profiler's off-CPU convention, the only form Grafana Pyroscope recognises as off-CPU) and, unless
  disabled, a Profile ``off_cpu_switches``/``count`` with the same samples counted in switches;
- one ProfilesDictionary shared by all of them. Index 0 of every table is the empty entry.

A sample is one (stack, attribute set): attributes are ``thread.id``/``thread.name`` when the
snapshot is per thread and ``offcpu.reason`` (runnable, sleeping, uninterruptible, other). Its
single value is the interval's increase. Samples with equal identity are merged (the data model's
rule: identity is {stack, attribute set, link}); zero values are left out, and so are profiles without
samples and processes without profiles, so an idle interval produces no request at all
(Pyroscope rejects a request with an empty sample or without a dictionary).

Locations: ``address`` is the frame's offset in its mapped file (the mapping has memory_start 0 and
file_offset 0, so the address *is* the file offset), the mapping carries the file name and
``process.executable.build_id.gnu`` (unresolved frames in a known file keep both, so a backend
with debug files can still name them); ``profile.frame.type`` is ``kernel``, ``native`` or, for JIT
frames named from a perf map, the runtime guessed from the executable name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from offcpu_exporter import __version__
from offcpu_exporter.formats.interning import Interner, StringTable
from offcpu_exporter.snapshot import Frame, FrameKind, ProcessInfo, ProcessKey, Snapshot, Stack, StackSample

__all__ = [
    "REASON_ATTRIBUTE",
    "SCOPE_NAME",
    "EncodeOptions",
    "encode_profiles",
    "encode_profiles_split",
    "jit_runtime",
    "service_name_of",
]

SCOPE_NAME = "offcpu-exporter"
REASON_ATTRIBUTE = "offcpu.reason"
SAMPLED_RATIO_ATTRIBUTE = "offcpu.stack_sampled_ratio"  # on each profile when stack captures were sampled
FRAME_TYPE_ATTRIBUTE = "profile.frame.type"
BUILD_ID_ATTRIBUTE = "process.executable.build_id.gnu"

# JIT frames come from /tmp/perf-PID.map, which several runtimes write; the map does not say
# which one, the executable does. Values from the semantic conventions' profile.frame.type.
_JIT_RUNTIMES: tuple[tuple[str, str], ...] = (
    ("node", "v8js"),
    ("nodejs", "v8js"),
    ("deno", "v8js"),
    ("java", "jvm"),
    ("dotnet", "dotnet"),
    ("python", "cpython"),
    ("luajit", "luajit"),
    ("beam.smp", "beam"),
    ("php", "php"),
    ("perl", "perl"),
    ("ruby", "ruby"),
)


def jit_runtime(exe_name: str) -> str:
    """The `profile.frame.type` of a JIT frame in a process running `exe_name` ('native' if unknown)."""
    for prefix, runtime in _JIT_RUNTIMES:
        suffix = exe_name[len(prefix) :]
        if exe_name.startswith(prefix) and (not suffix or suffix[0] in "0123456789.-"):
            return runtime
    return "native"


@dataclass(frozen=True)
class EncodeOptions:
    host_name: str = ""
    service_name: str = "{exe}"  # template, fields as in options.SERVICE_NAME_FIELDS
    switches_profile: bool = True
    # added to every process's resource, e.g. from OTEL_RESOURCE_ATTRIBUTES (except service.name)
    extra_resource_attributes: Mapping[str, str] = field(default_factory=dict)


def service_name_of(info: ProcessInfo, template: str) -> str:
    value = template.format_map(
        {
            "exe": info.exe_name,
            "comm": info.comm,
            "pid": info.pid,
            "namespace": info.namespace,
            "pod": info.pod,
            "container": info.container,
        }
    )
    # "{namespace}/{pod}" of a process outside Kubernetes would be "/": fall back to the name
    if not value.strip(" /-_.:"):
        return info.exe_name or info.comm or "unknown_service"
    return value


class _Dictionary:
    """Interns strings, attributes, functions, mappings, locations and stacks into one dictionary.
    Every table but the strings starts with an empty entry: index 0 means "none"."""

    def __init__(self, target: pb.ProfilesDictionary) -> None:
        self.proto = target
        d = target
        d.mapping_table.add()
        d.location_table.add()
        d.function_table.add()
        d.link_table.add()
        d.attribute_table.add()
        d.stack_table.add()
        self.string = StringTable(d.string_table)
        self._attributes: Interner[tuple[str, str, str | int | float]] = Interner(first=1)
        self._functions: Interner[str] = Interner(first=1)
        self._mappings: Interner[tuple[str, str]] = Interner(first=1)
        self._locations: Interner[tuple[str, str, int, str, str, bool]] = Interner(first=1)
        self._frame_types: dict[str, int] = {}
        self._stacks: Interner[tuple[int, ...]] = Interner(first=1)
        self._stack_objects: dict[int, tuple[Stack, int]] = {}  # id(stack) -> (stack, index)

    def attribute(self, key: str, value: str | int | float) -> int:
        return self._attributes.index((key, type(value).__name__, value), self._write_attribute)

    def _write_attribute(self, ident: tuple[str, str, str | int | float], _index: int) -> None:
        key, _type, value = ident
        entry = self.proto.attribute_table.add(key_strindex=self.string(key))
        if isinstance(value, int):
            entry.value.int_value = value
        elif isinstance(value, float):
            entry.value.double_value = value
        else:
            entry.value.string_value = value

    def function(self, name: str) -> int:
        return self._functions.index(name, self._write_function)

    def _write_function(self, name: str, _index: int) -> None:
        self.proto.function_table.add(name_strindex=self.string(name))

    def mapping(self, module: str, build_id: str) -> int:
        if not module:
            return 0
        return self._mappings.index((module, build_id), self._write_mapping)

    def _write_mapping(self, ident: tuple[str, str], _index: int) -> None:
        module, build_id = ident
        attrs = [self.attribute(BUILD_ID_ATTRIBUTE, build_id)] if build_id else []
        self.proto.mapping_table.add(filename_strindex=self.string(module), attribute_indices=attrs)

    def location(self, frame: Frame, frame_type: str) -> int:
        # keyed by plain fields: hashing the frozen Frame would hash its enum in Python code.
        # An unresolved frame in a known file ("[unknown] libfoo.so+0x1a2b") keeps its mapping and
        # address, so that a backend with the debug file can still name it; a lost stack has neither.
        placeholder = frame.kind is FrameKind.PLACEHOLDER and not frame.module
        ident = (frame.name, frame.module, frame.offset, frame.build_id, frame_type, placeholder)
        return self._locations.index(ident, self._write_location)

    def _write_location(self, ident: tuple[str, str, int, str, str, bool], _index: int) -> None:
        name, module, offset, build_id, frame_type, placeholder = ident
        type_attr = self._frame_types.get(frame_type)
        if type_attr is None:
            type_attr = self._frame_types[frame_type] = self.attribute(FRAME_TYPE_ATTRIBUTE, frame_type)
        loc = self.proto.location_table.add(
            mapping_index=0 if placeholder else self.mapping(module, build_id),
            address=0 if placeholder else offset,
            attribute_indices=(type_attr,),
        )
        loc.lines.add(function_index=self.function(name))

    def stack_of(self, stack: Stack, jit: str) -> int:
        """Stacks repeat across threads and reasons; the snapshot shares their objects."""
        cached = self._stack_objects.get(id(stack))
        if cached is not None and cached[0] is stack:
            return cached[1]
        kernel = tuple(self.location(f, "kernel") for f in stack.kernel)
        user = tuple(self.location(f, _user_frame_type(f, jit)) for f in stack.user)
        index = self.stack(kernel + user)  # leaf first: kernel leaf .. entry, then user leaf .. root
        self._stack_objects[id(stack)] = (stack, index)
        return index

    def stack(self, locations: tuple[int, ...]) -> int:
        return self._stacks.index(locations, self._write_stack)

    def _write_stack(self, locations: tuple[int, ...], _index: int) -> None:
        self.proto.stack_table.add(location_indices=locations)

def _user_frame_type(frame: Frame, jit: str) -> str:
    """The kernel half is always "kernel"; in the user half a frame may still be one (vDSO
    entry code symbolized from the kernel), JIT code, or native code and placeholders."""
    kind = frame.kind
    if kind is FrameKind.KERNEL:
        return "kernel"
    if kind is FrameKind.JIT:
        return jit
    return "native"  # native code and user-half placeholders ([unknown], [lost stack])


def _resource(info: ProcessInfo, options: EncodeOptions) -> Resource:
    attrs: dict[str, str | int] = dict(options.extra_resource_attributes)
    attrs.pop("service.name", None)  # one service per watched process, not the exporter's own
    attrs.update({"process.pid": info.pid, "process.executable.name": info.exe_name})
    if info.exe:
        attrs["process.executable.path"] = info.exe
    if info.cmdline:
        attrs["process.command"] = info.cmdline[0]
    if options.host_name:
        attrs["host.name"] = options.host_name
    for key, value in (
        ("container.id", info.container_id),
        ("k8s.namespace.name", info.namespace),
        ("k8s.pod.name", info.pod),
        ("k8s.pod.uid", info.pod_uid),
        ("k8s.container.name", info.container),
    ):
        if value:
            attrs[key] = value
    attrs["service.name"] = service_name_of(info, options.service_name)
    return Resource(attributes=[_key_value(k, v) for k, v in attrs.items()])


def _key_value(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _profile_id(snapshot: Snapshot, key: ProcessKey, sample_type: str, host_name: str) -> bytes:
    """Deterministic and unique per (host, process, flush, type); never all zeroes (invalid)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{host_name}\0{key.pid}\0{key.start_ticks}\0{snapshot.start_time_ns}\0".encode())
    h.update(f"{snapshot.sequence}\0{sample_type}".encode())
    digest = h.digest()
    return digest if any(digest) else b"\x01" + digest[1:]


def _group_by_process(samples: Iterable[StackSample]) -> dict[ProcessKey, list[StackSample]]:
    grouped: dict[ProcessKey, list[StackSample]] = {}
    for sample in samples:
        if sample.increase:
            grouped.setdefault(sample.process, []).append(sample)
    return grouped


def encode_profiles(
    snapshot: Snapshot,
    options: EncodeOptions | None = None,
    processes: Collection[ProcessKey] | None = None,
) -> ExportProfilesServiceRequest | None:
    """The request for one snapshot's increases (of `processes` only, if given), or None when
    nothing was off CPU in the interval."""
    options = options or EncodeOptions()
    grouped = _group_by_process(snapshot.changed())
    if processes is not None:
        grouped = {k: v for k, v in grouped.items() if k in processes}
    if snapshot.sequence == 0 or not grouped:
        return None
    request = ExportProfilesServiceRequest()
    d = _Dictionary(request.dictionary)
    scope = InstrumentationScope(name=SCOPE_NAME, version=__version__)
    duration = max(0, snapshot.time_ns - snapshot.interval_start_ns)
    kinds: list[tuple[str, str, bool]] = [("off_cpu", "nanoseconds", False)]
    if options.switches_profile:
        kinds.append(("off_cpu_switches", "count", True))

    # Sampled captures: the share of the interval's blocks captured, on every profile (its per-stack
    # values are estimates that sum to the exact per-thread totals).
    health = snapshot.health
    sampling = [d.attribute(SAMPLED_RATIO_ATTRIBUTE, float(health.stack_sampled_ratio))] \
        if health.stack_sampling else []
    for key in sorted(grouped, key=lambda k: (k.pid, k.start_ticks)):
        view = snapshot.processes.get(key)
        info = view.info if view is not None else ProcessInfo(key=key, comm="")
        jit = jit_runtime(info.exe_name)
        # identity {stack, attribute set} -> [ns, count]; no links are produced
        merged: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for sample in grouped[key]:
            attrs = []
            if sample.tid:
                attrs.append(d.attribute("thread.id", sample.tid))
                if sample.thread_name:
                    attrs.append(d.attribute("thread.name", sample.thread_name))
            attrs.append(d.attribute(REASON_ATTRIBUTE, sample.reason.label))
            ident = (d.stack_of(sample.stack, jit), tuple(sorted(attrs)))
            slot = merged.setdefault(ident, [0, 0])
            slot[0] += sample.increase.ns
            slot[1] += sample.increase.count

        profiles = []
        for type_name, unit, is_count in kinds:
            profile = pb.Profile(
                sample_type=pb.ValueType(type_strindex=d.string(type_name), unit_strindex=d.string(unit)),
                time_unix_nano=snapshot.interval_start_ns,
                duration_nano=duration,
                profile_id=_profile_id(snapshot, key, type_name, options.host_name),
                attribute_indices=sampling,
            )
            for (stack_index, attr_key), (ns, count) in merged.items():
                value = count if is_count else ns
                if value > 0:
                    profile.samples.add(stack_index=stack_index, attribute_indices=attr_key, values=[value])
            if profile.samples:
                profiles.append(profile)
        if not profiles:
            continue
        rp = request.resource_profiles.add(resource=_resource(info, options))
        rp.scope_profiles.add(scope=scope, profiles=profiles)

    return request if request.resource_profiles else None


def encode_profiles_split(
    snapshot: Snapshot, options: EncodeOptions | None = None, max_bytes: int = 4 << 20
) -> list[ExportProfilesServiceRequest]:
    """Like `encode_profiles`, as several requests (one per process) when one would exceed
    `max_bytes`: collectors and Pyroscope refuse gRPC messages over 4 MiB by default."""
    request = encode_profiles(snapshot, options)
    if request is None:
        return []
    if request.ByteSize() <= max_bytes or len(request.resource_profiles) == 1:
        return [request]
    keys = sorted({s.process for s in snapshot.changed()}, key=lambda k: (k.pid, k.start_ticks))
    parts = (encode_profiles(snapshot, options, processes={key}) for key in keys)
    return [part for part in parts if part is not None]
