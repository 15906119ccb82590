"""Length-delimited protobuf framing: a base-128 varint byte length, then the message, as Java's
``writeDelimitedTo``/``parseDelimitedFrom`` (and Go's ``protodelim``) read and write it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from google.protobuf.message import DecodeError

from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb

__all__ = ["CorruptFile", "encode_varint", "frame", "read_messages"]

_MAX_MESSAGE = 64 << 20  # far above any stack message; a larger length means a corrupt file


class CorruptFile(ValueError):
    """The bytes are not a sequence of delimited messages (offset of the bad record in the text)."""


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("varint of a negative length")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def frame(message: pb.EBPFProfilingData) -> bytes:
    body = message.SerializeToString()
    return encode_varint(len(body)) + body


def _read_varint(stream: BinaryIO, offset: int) -> int | None:
    value = shift = 0
    while True:
        byte = stream.read(1)
        if not byte:
            if shift:
                raise CorruptFile(f"truncated length at byte {offset}")
            return None  # clean end of file
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise CorruptFile(f"length varint too long at byte {offset}")


def read_messages(stream: BinaryIO) -> Iterator[pb.EBPFProfilingData]:
    offset = 0
    while True:
        length = _read_varint(stream, offset)
        if length is None:
            return
        if length > _MAX_MESSAGE:
            raise CorruptFile(f"record of {length} bytes at byte {offset}")
        body = stream.read(length)
        if len(body) != length:
            raise CorruptFile(f"truncated record at byte {offset}: {len(body)} of {length} bytes")
        message = pb.EBPFProfilingData()
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise CorruptFile(f"undecodable record at byte {offset}: {exc}") from exc
        offset += len(encode_varint(length)) + length
        yield message
