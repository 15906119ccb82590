"""Command lines may carry secrets: the Prometheus exposition never shows them, whichever
label options are on."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from offcpu_exporter.series.selection import Selection
from offcpu_exporter.sinks.prometheus.collector import OffCPUCollector
from testkit.snapshots import Builder, process, stack

SECRET = "hunter2-s3cr3t"


@pytest.mark.parametrize("stack_label", [False, True])
def test_command_lines_are_not_in_the_exposition(stack_label: bool) -> None:
    b = Builder()
    info = dataclasses.replace(process(42, "app"), cmdline=("app", f"--password={SECRET}", f"DB_TOKEN={SECRET}"))
    b.add(info, stack("wait_for_db"), 1.5)
    snap = b.snapshot()
    assert any(SECRET in arg for v in snap.processes.values() for arg in v.info.cmdline)  # the data has it
    reg = CollectorRegistry()
    reg.register(OffCPUCollector(lambda: snap, lambda: [], Selection(), stack_label=stack_label, bcc="x"))
    text = generate_latest(reg).decode()
    assert 'comm="app"' in text and "wait_for_db" in text
    assert SECRET not in text and "password" not in text
