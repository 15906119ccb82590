"""What every benchmark here shares: building its C workload, summary statistics, the machine's
facts, reading a process's CPU time and peak RSS, and the rows of the results table."""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = Path(__file__).resolve().parent / "workloads"
BUILD = Path(os.environ.get("OFFCPU_BENCH_BUILD", Path(tempfile.gettempdir()) / "offcpu-bench-build"))
CLK_TCK = os.sysconf("SC_CLK_TCK")



def python_path(tree: Path) -> str:
    """The PYTHONPATH that runs `tree`'s exporter and testkit: its src layout's exporter/ and the tree
    itself, or only the tree for a checkout from before the src layout (a "before" side of a
    side-by-side run)."""
    source = tree / "exporter"
    return os.pathsep.join((str(source), str(tree))) if source.is_dir() else str(tree)


for _entry in reversed(python_path(ROOT).split(os.pathsep)):
    if _entry not in sys.path:
        sys.path.insert(0, _entry)


def build_c(source: Path, name: str | None = None, extra_flags: Sequence[str] = ()) -> Path:
    """Compile a workload once per source content (-O0 and frame pointers, so that stacks walk)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    out = BUILD / (name or source.stem)
    if not out.exists() or out.stat().st_mtime < source.stat().st_mtime:
        tmp = out.with_suffix(".tmp")
        subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-pthread", *extra_flags, "-o", str(tmp),
                        str(source)], check=True)
        tmp.replace(out)
    return out


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median and spread (min, max, quartiles) of a few measurements."""
    vals = sorted(values)
    if not vals:
        return {"n": 0, "median": float("nan"), "min": float("nan"), "max": float("nan"),
                "q1": float("nan"), "q3": float("nan")}
    if len(vals) >= 2:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    else:
        q1 = q3 = vals[0]
    return {"n": len(vals), "median": statistics.median(vals), "min": vals[0], "max": vals[-1], "q1": q1, "q3": q3}


def load_average() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"nproc": os.cpu_count(), "model": model, "kernel": platform.release(),
            "memory_gib": round(mem_kb / 2**20, 1), "python": platform.python_version()}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        # comm may hold spaces and parentheses: the fields start after the last ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid: int, field_name: str) -> int:
    """A `kB` field of /proc/PID/status (VmHWM: peak RSS, VmRSS: RSS now)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


class Stopwatch:
    """Wall time and the machine's load around one benchmark, so the table can say how shared
    the machine was while the figure was taken."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.load_start = load_average()

    def done(self) -> dict[str, float]:
        return {"seconds": round(time.monotonic() - self.start, 1), "load_start": self.load_start,
                "load_end": load_average()}


def shared(context: dict[str, float], ours: float) -> bool:
    """Was the machine busy with other work? The 1-minute load average beyond what this
    benchmark itself puts on it (`ours` runnable tasks) is other jobs."""
    return max(context["load_start"], context["load_end"]) > ours + 0.5


@dataclass
class Row:
    """One line of the results table."""

    benchmark: str
    measure: str
    value: str
    spread: str = ""
    target: str = ""
    met: bool | None = None
    shared: bool = False
    note: str = ""


@dataclass
class Result:
    name: str
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rows": [asdict(r) for r in self.rows], "details": self.details}


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| benchmark | measure | value | spread | target | met | shared |",
             "| --- | --- | ---: | --- | --- | --- | --- |"]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        measure = f"{r.measure} ({r.note})" if r.note else r.measure
        lines.append(f"| {r.benchmark} | {measure} | {r.value} | {r.spread} | {r.target} | {met} | "
                     f"{'shared' if r.shared else ''} |")
    return "\n".join(lines) + "\n"


def write_outputs(results: Sequence[Result], out: str | None, table: str | None, echo: bool = True) -> None:
    rows = [r for res in results for r in res.rows]
    text = markdown_table(rows)
    if echo:
        print(text)
    if out:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        Path(out).write_text(json.dumps({"machine": machine(), "time": stamp,
                                         "results": [r.to_json() for r in results]}, indent=2) + "\n")
    if table:
        Path(table).write_text(text)


def stop_exporter(exporter: subprocess.Popen[Any]) -> dict[str, Any]:
    """SIGTERM (it flushes once more on the way out), SIGKILL after 60 s; how long it took."""
    start = time.monotonic()
    killed = False
    if exporter.poll() is None:
        exporter.send_signal(signal.SIGTERM)
        try:
            exporter.wait(timeout=60)
        except subprocess.TimeoutExpired:
            exporter.kill()
            exporter.wait()
            killed = True
    return {"exporter_stop_seconds": time.monotonic() - start, "exporter_returncode": exporter.returncode,
            "exporter_killed": killed}
