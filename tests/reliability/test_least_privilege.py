"""`serve --drop-privileges`: after attaching, the exporter runs with only the capabilities it
still needs (every thread), no_new_privs set, and still serves correct figures."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import pytest

from offcpu_exporter.privileges import CAP_NAMES, kept_after_attach
from offcpu_exporter.probe.facts import current_capabilities
from testkit.as_nobody import NOBODY
from testkit.exporter import ROOT, ExporterProcess
from testkit.metrics_page import total
from testkit.workloads import Workload


def _status(pid: int, tid: int | None = None) -> dict[str, str]:
    path = f"/proc/{pid}/task/{tid}/status" if tid else f"/proc/{pid}/status"
    with open(path) as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _bits(mask: str) -> set[str]:
    value = int(mask, 16)
    return {CAP_NAMES.get(b, str(b)) for b in range(64) if value >> b & 1}


@pytest.mark.kernel
def test_dropped_capabilities_in_every_thread_and_figures_still_right(other_users_binary: Path) -> None:
    """The workload runs as nobody from a binary only nobody may read: its user frames are named
    only if what was kept still reads another user's maps and files."""
    with Workload("sleep", threads=1, iterations=60, interval_ms=25, binary=other_users_binary) as w, \
            ExporterProcess(["--pid", str(w.pid), "--flush-interval", "0.5", "--drop-privileges"]) as exp:
        assert exp.proc is not None
        expected = {k.name for k in kept_after_attach(exp.port)} & _bits(_status(exp.proc.pid)["CapPrm"])
        assert "CAP_BPF" not in expected and "CAP_SYS_ADMIN" not in expected  # on this 6.x kernel
        tids = [int(t.name) for t in Path(f"/proc/{exp.proc.pid}/task").iterdir()]
        assert len(tids) > 2  # web server, pipeline: threads started after the drop
        for tid in tids:
            status = _status(exp.proc.pid, tid)
            assert _bits(status["CapEff"]) == expected, (tid, status["CapEff"])
            assert _bits(status["CapPrm"]) == expected
            assert _bits(status["CapBnd"]) == expected
            assert int(status["CapInh"], 16) == 0 and int(status["CapAmb"], 16) == 0
            assert status["NoNewPrivs"].strip() == "1"
        print(f"kept after --drop-privileges: {sorted(expected)}")
        assert os.stat(f"/proc/{w.pid}").st_uid == NOBODY
        time.sleep(0.5)
        w.go()
        result = w.wait()
        time.sleep(1.2)  # two more flushes
        text = exp.get("/metrics").decode()
        assert "Traceback" not in exp.log(), exp.log()
    measured = total(text, "offcpu_stack_seconds_total", pid=str(w.pid), user_function="offcpu_sleep_ms")
    print(f"with dropped capabilities: {measured:.4f} s measured, {result.blocked_ns / 1e9:.4f} s known")
    assert measured == pytest.approx(result.blocked_ns / 1e9, rel=0.05)


def test_kept_capabilities_follow_the_kernel(tmp_path: Path) -> None:
    sysctl = tmp_path / "kernel"
    sysctl.mkdir()
    (sysctl / "kptr_restrict").write_text("0\n")
    (sysctl / "perf_event_paranoid").write_text("1\n")
    (sysctl / "unprivileged_bpf_disabled").write_text("2\n")
    names = lambda kept: {k.name for k in kept}  # noqa: E731
    assert names(kept_after_attach(9961, (6, 8), str(tmp_path))) == {
        "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_CHECKPOINT_RESTORE"}
    # Before 6.5 every bpf() call is checked; before 5.9 map_files needs CAP_SYS_ADMIN.
    assert names(kept_after_attach(9961, (6, 1), str(tmp_path))) >= {"CAP_BPF"}
    assert names(kept_after_attach(9961, (5, 4), str(tmp_path))) == {
        "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_SYS_ADMIN"}
    (sysctl / "kptr_restrict").write_text("1\n")
    assert "CAP_SYSLOG" in names(kept_after_attach(9961, (6, 8), str(tmp_path)))
    assert "CAP_NET_BIND_SERVICE" in names(kept_after_attach(443, (6, 8), str(tmp_path)))


def test_current_capabilities_reads_status() -> None:
    assert current_capabilities("CapEff") <= current_capabilities("CapPrm")


def test_exporter_never_runs_programs() -> None:
    """Nothing in offcpu_exporter/ starts a process (so nothing from a watched process is executed):
    no subprocess, os.system/exec*/spawn*/popen, no ctypes-loaded library from a target."""
    forbidden_modules = {"subprocess", "pty", "multiprocessing"}
    forbidden_calls = {"system", "popen", "execv", "execve", "execvp", "execl", "execlp", "execle", "execvpe",
                       "spawnv", "spawnve", "spawnl", "posix_spawn", "posix_spawnp", "fork", "forkpty"}
    found = []
    for path in (ROOT / "exporter" / "offcpu_exporter").rglob("*.py"):
        if "/proto/" in str(path) and path.name.endswith("_pb2_grpc.py"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{path}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in forbidden_modules]
            elif isinstance(node, ast.Attribute) and node.attr in forbidden_calls and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{path}:{node.lineno} os.{node.attr}")
    # The SkyWalking proto generator runs protoc at development time only (not imported at run time).
    found = [f for f in found if "/proto/generate.py" not in f]
    # The one exception: unwind tables are parsed in a child of the exporter's own interpreter
    # running its own module (test_the_only_child_is_the_exporters_own_table_builder).
    found = [f for f in found if "/offcpu_exporter/unwind/build.py:" not in f]
    assert not found, found


def test_the_only_child_is_the_exporters_own_table_builder() -> None:
    """offcpu_exporter/unwind/build.py starts one kind of process: this interpreter running the
    exporter's own table builder, which parses (never runs) the file it is given."""
    path = ROOT / "exporter" / "offcpu_exporter" / "unwind" / "build.py"
    tree = ast.parse(path.read_text(), str(path))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"]
    assert [c.func.attr for c in calls] == ["Popen"]  # type: ignore[attr-defined]
    argv = calls[0].args[0]
    assert isinstance(argv, ast.List)
    head = [ast.unparse(e) for e in argv.elts[:3]]
    assert head == ["sys.executable", "'-m'", "'offcpu_exporter.unwind.build'"], head


def test_doctor_names_the_capabilities_kept_after_attach() -> None:
    import io

    from offcpu_exporter.doctor import run_doctor

    out = io.StringIO()
    run_doctor(out=out)
    lines = out.getvalue().splitlines()
    for kept in kept_after_attach():
        line = next((x for x in lines if f"] {kept.name}:" in x), None)
        assert line is not None, lines
        assert kept.why in line


def test_drop_privileges_from_a_config_file(tmp_path: Path) -> None:
    from offcpu_exporter.cli import parse_args

    path = tmp_path / "c.yml"
    path.write_text("drop-privileges: true\n")
    assert parse_args(["serve", "--config.file", str(path)]).drop_privileges is True
    assert parse_args(["serve"]).drop_privileges is False


def test_the_drop_refuses_to_run_beside_another_thread() -> None:
    """A thread started before the drop would keep its capabilities (they are per thread): the
    drop names it and changes nothing. In a child process: success would drop the test runner's."""
    import subprocess
    import sys

    code = """if True:
        import threading
        from offcpu_exporter.privileges import PrivilegeError, drop_capabilities
        from offcpu_exporter.probe.facts import current_capabilities
        before = current_capabilities("CapEff")
        stop = threading.Event()
        threading.Thread(target=stop.wait, name="early-bird").start()
        try:
            drop_capabilities([])
        except PrivilegeError as e:
            print(e)
        finally:
            stop.set()
        print(current_capabilities("CapEff") == before)
    """
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2, out
    assert "early-bird" in lines[0] and "would keep every capability" in lines[0]
    assert lines[1] == "True"
