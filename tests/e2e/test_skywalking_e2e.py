"""The SkyWalking output end to end: a real `offcpu-exporter serve` (real probe) watching a workload
with known blocking, writing to a file and streaming to a fake OAP on loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offcpu_exporter.formats.delimited import read_messages
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb
from testkit.exporter import ROOT, SOURCE_ENV, ExporterProcess
from testkit.skywalking_oap import FakeOap, Task, oap_process_id, sleep_totals
from testkit.workloads import Workload, WorkloadResult

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

# 1.5 s blocked in offcpu_sleep_ms over three flushes: user frames are symbolized while the
# process lives (the flush after its exit can only name what was resolved before).
ITERATIONS, INTERVAL_MS = 60, 25


def run_exporter(
    argv: list[str],
    workload: Workload,
    settle: float = 0.0,
    others: tuple[Workload, ...] = (),
    metrics: list[str] | None = None,
) -> WorkloadResult:
    """Runs a real `offcpu-exporter serve` watching the workload (and `others`, watched and
    running at the same time), then stops it with SIGTERM (final flush, sinks closed)."""
    pids = [arg for w in (workload, *others) for arg in ("--pid", str(w.pid))]
    metrics = [] if metrics is None else metrics
    with ExporterProcess([*pids, "--flush-interval", "0.5", *argv]) as exporter:
        time.sleep(0.5 + settle)  # targets reach the kernel filter within one targets interval
        for other in others:
            other.go()
        workload.go()
        result = workload.wait()
        for other in others:
            other.wait()
        time.sleep(1.0)  # one more flush while the exporter runs, then the final one at SIGTERM
        metrics.append(exporter.get("/metrics").decode())
        assert exporter.stop() == 0, exporter.log()
        assert "Traceback" not in exporter.log(), exporter.log()
    return result


def report(what: str, result: WorkloadResult, count: int, ns: int) -> None:
    print(
        f"{what}: offcpu_sleep_ms sent {ns / 1e9:.4f} s in {count} switches;"
        f" known {result.blocked_ns / 1e9:.4f} s in {result.calls} calls ({ns / result.blocked_ns - 1:+.2%})"
    )


def check_stacks(messages: list[pb.EBPFProfilingData]) -> None:
    for message in messages:
        types = [s.stackType for s in message.offCPU.stacks]
        assert types in ([pb.PROCESS_KERNEL_SPACE, pb.PROCESS_USER_SPACE], [pb.PROCESS_KERNEL_SPACE],
                         [pb.PROCESS_USER_SPACE])  # fmt: skip
        assert message.offCPU.switchCount > 0 or message.offCPU.duration > 0


def test_file_gets_the_workloads_blocking(tmp_path: Path) -> None:
    path = tmp_path / "offcpu.swpb"
    with Workload("sleep", iterations=ITERATIONS, interval_ms=INTERVAL_MS) as workload:
        metrics: list[str] = []
        result = run_exporter(["--skywalking.file", str(path)], workload, metrics=metrics)
    sent = re.search(r'^offcpu_exporter_sink_sent_total\{sink="skywalking"\} (\S+)$', metrics[0], re.M)
    assert sent and float(sent.group(1)) > 0  # the sink's own delivery counters are exported
    with path.open("rb") as f:
        messages = list(read_messages(f))
    check_stacks(messages)
    count, ns = sleep_totals(messages)
    report("file", result, count, ns)
    assert count == pytest.approx(result.calls, rel=0.10)
    assert ns == pytest.approx(result.blocked_ns, rel=0.10)
    sleeping = [m for m in messages if sleep_totals([m])[0]]
    kernel = [s for s in sleeping[0].offCPU.stacks if s.stackType == pb.PROCESS_KERNEL_SPACE]
    assert kernel and any("nanosleep" in symbol for symbol in kernel[0].stackSymbols)
    headers = [m.task for m in messages if m.HasField("task")]
    assert headers and all(h.processId == str(workload.pid) for h in headers)


def test_fake_oap_task_mode_gets_the_workloads_blocking() -> None:
    oap = FakeOap().start()
    try:
        with Workload("sleep", iterations=ITERATIONS, interval_ms=INTERVAL_MS) as workload:
            result = run_exporter(
                ["--skywalking.endpoint", oap.endpoint, "--skywalking.task-id", "task-e2e",
                 "--skywalking.process-id", "proc-e2e"],
                workload,
            )  # fmt: skip
        messages = oap.data()
    finally:
        oap.stop()
    check_stacks(messages)
    count, ns = sleep_totals(messages)
    report("oap task mode", result, count, ns)
    assert count == pytest.approx(result.calls, rel=0.10)
    assert ns == pytest.approx(result.blocked_ns, rel=0.10)
    for stream in oap.recorded.streams:
        assert (stream.messages[0].task.taskId, stream.messages[0].task.processId) == ("task-e2e", "proc-e2e")


def test_fake_oap_agent_mode_gets_the_task_processs_blocking() -> None:
    oap = FakeOap().start()
    try:
        with (
            Workload("sleep", iterations=ITERATIONS, interval_ms=INTERVAL_MS) as workload,
            Workload("pipe", iterations=ITERATIONS, interval_ms=INTERVAL_MS) as bystander,
        ):
            # The task exists before the exporter starts: the first poll after reporting finds it.
            process_id = oap_process_id("offcpu_workload", "e2e-host", f"workload-{workload.pid}")
            now_ms = time.time_ns() // 1_000_000
            oap.add_task(Task("task-agent", [process_id], "OFF_CPU", start_ms=now_ms, duration_s=120, update_ms=1))
            result = run_exporter(
                ["--skywalking.endpoint", oap.endpoint, "--skywalking.agent", "--skywalking.agent-id", "e2e",
                 "--skywalking.instance-name", "e2e-host", "--skywalking.process-name", "workload-{pid}",
                 "--skywalking.task-poll-interval", "0.5"],
                workload,
                settle=2.0,  # report + first poll before the workload starts blocking
                others=(bystander,),  # watched and reported, but no task: none of its data is sent
            )  # fmt: skip
        messages = oap.data()
    finally:
        oap.stop()
    reported = {p.hostProcess.pid: p.hostProcess for r in oap.recorded.reports for p in r.processes}
    assert set(reported) == {workload.pid, bystander.pid}
    assert reported[workload.pid].entity.serviceName == "offcpu_workload"
    assert not any("offcpu_pipe_read" in s.stackSymbols for m in messages for s in m.offCPU.stacks)
    check_stacks(messages)
    count, ns = sleep_totals(messages)
    report("oap agent mode", result, count, ns)
    assert count == pytest.approx(result.calls, rel=0.10)
    assert ns == pytest.approx(result.blocked_ns, rel=0.10)
    for stream in oap.recorded.streams:
        assert (stream.messages[0].task.taskId, stream.messages[0].task.processId) == ("task-agent", process_id)


def test_serve_rejects_bad_skywalking_options_with_exit_2() -> None:
    with Workload("sleep", iterations=1, interval_ms=1) as workload:
        exporter = ExporterProcess(["--pid", str(workload.pid), "--skywalking.endpoint", "127.0.0.1:1"])
        with pytest.raises(RuntimeError, match="exited with 2"):
            exporter.start()
        assert "needs --skywalking.task-id and --skywalking.process-id" in exporter.log()
        exporter.stop()


def test_skywalking_dump_prints_a_served_file(tmp_path: Path) -> None:
    path = tmp_path / "offcpu.swpb"
    with Workload("sleep", iterations=ITERATIONS, interval_ms=INTERVAL_MS) as workload:
        run_exporter(["--skywalking.file", str(path)], workload)
    out = subprocess.run(
        [sys.executable, "-m", "offcpu_exporter", "skywalking-dump", str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, **SOURCE_ENV},
    ).stdout
    assert f"process {workload.pid} started" in out
    assert "    offcpu_sleep_ms" in out and "    do_nanosleep" in out


def test_fake_oap_agent_mode_sends_only_the_task_window() -> None:
    window_s, flush_s = 2.0, 0.5
    oap = FakeOap().start()
    try:
        with Workload("sleep", iterations=160, interval_ms=INTERVAL_MS) as workload:  # 4 s of sleeps
            process_id = oap_process_id("offcpu_workload", "e2e-host", f"workload-{workload.pid}")
            argv = ["--pid", str(workload.pid), "--flush-interval", str(flush_s),
                    "--skywalking.endpoint", oap.endpoint, "--skywalking.agent",
                    "--skywalking.instance-name", "e2e-host", "--skywalking.process-name", "workload-{pid}",
                    "--skywalking.task-poll-interval", "0.25"]  # fmt: skip
            with ExporterProcess(argv) as exporter:
                assert oap.wait_for(lambda r: bool(r.reports), 20)
                workload.go()
                # A task created while the process runs, starting a little later (as from the UI).
                start_ms = time.time_ns() // 1_000_000 + 1000
                oap.add_task(
                    Task("window", [process_id], "OFF_CPU", start_ms=start_ms, duration_s=int(window_s), update_ms=7)
                )
                result = workload.wait()
                time.sleep(1.0)
                assert exporter.stop() == 0, exporter.log()
        messages = oap.data()
    finally:
        oap.stop()
    count, ns = sleep_totals(messages)
    expected = window_s * 1e9 * result.blocked_ns / result.wall_ns  # blocked share of the window
    print(
        f"task window {window_s} s of a {result.wall_ns / 1e9:.2f} s run: sent {ns / 1e9:.3f} s"
        f" in {count} switches, expected {expected / 1e9:.3f} s (within one {flush_s} s flush)"
    )
    assert abs(ns - expected) <= flush_s * 1e9 * 1.5  # edges: half a flush each, plus flush jitter
    assert ns < 0.75 * result.blocked_ns  # far from everything the process did
    for stream in oap.recorded.streams:
        task = stream.messages[0].task
        assert (task.taskId, task.processId, task.profilingStartTime) == ("window", process_id, start_ms)
