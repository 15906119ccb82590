"""Appends batches to a file as length-delimited `EBPFProfilingData` (see `delimited`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from offcpu_exporter.formats.delimited import frame
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb
from offcpu_exporter.formats.skywalking import TaskMetadata, with_task

__all__ = ["FileTransport"]


class FileTransport:
    """Each batch is written with one `write` of whole records and flushed, so a reader never sees
    half a batch from a healthy writer; a failed write (disk full) is truncated back to the last
    whole batch, so the file stays a valid sequence and the batch can be written again."""

    name = "file"

    def __init__(self, path: str) -> None:
        self.path = path
        # Opened on first use and reopened after an error (the file may be rotated away).
        self._fd: int | None = None

    def send(self, task: TaskMetadata, messages: Sequence[pb.EBPFProfilingData], timeout: float) -> None:
        if not messages:
            return
        data = b"".join(frame(message) for message in with_task(task, messages))
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            finally:
                os.close(self._fd)
                self._fd = None
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
