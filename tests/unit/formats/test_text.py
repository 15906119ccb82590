from __future__ import annotations

from offcpu_exporter.formats import Profile, render
from offcpu_exporter.formats import text as text_format
from offcpu_exporter.snapshot import Snapshot
from testkit.snapshots import WORKLOAD_PIPE, WORKLOAD_SLEEP


def test_bcc_layout(before: Snapshot, after: Snapshot) -> None:
    out = render("text", Profile.between(before, after)).decode()
    lines = out.splitlines()
    assert lines[0].startswith("Off-CPU time (us) by kernel + user stack, 5.0 s from ")
    # The largest stack comes last, as in bcc: kernel leaf..entry, "--", user leaf..root.
    block_end = max(i for i, line in enumerate(lines) if line.strip() == "1500000")
    who = lines[block_end - 1]
    assert who.split()[:3] == ["-", "offcpu_workload", "(4242)"]
    assert "[sleeping, 15 switches]" in who
    frames = [
        line.strip()
        for line in lines[block_end - 2 - len(WORKLOAD_SLEEP.kernel) - 1 - len(WORKLOAD_SLEEP.user) + 1 : block_end - 1]
    ]
    assert frames == [f.name for f in WORKLOAD_SLEEP.kernel] + ["--"] + [f.name for f in WORKLOAD_SLEEP.user]
    assert "2 processes, off-CPU total:" in lines
    assert "    offcpu_workload (4242): 1751235 us, 22 switches" in lines
    assert "    other<script> (777): 40000 us, 2 switches" in lines


def test_top_limits_the_stacks(before: Snapshot, after: Snapshot) -> None:
    out = text_format.encode(Profile.between(before, after), top=2).decode()
    assert "2 smaller stacks not shown (of 4)." in out
    assert WORKLOAD_PIPE.user[0].name in out  # the second largest is kept
    assert "[lost user stack]" not in out
