"""The kernel's figures of BPF programs from /proc/self/fdinfo (program_stats.py)."""

from __future__ import annotations

from pathlib import Path

from offcpu_exporter.probe import program_stats
from offcpu_exporter.probe.maps import ProgramRuns

# A BPF program's fdinfo as 6.x prints it (kernel/bpf/syscall.c, bpf_prog_show_fdinfo()).
FDINFO = """pos:\t0
flags:\t02000002
mnt_id:\t15
ino:\t2074
prog_type:\t17
prog_jited:\t1
prog_tag:\t9d3e3a24e2a5a3b1
memlock:\t8192
prog_id:\t412
run_time_ns:\t{ns}
run_cnt:\t{runs}
recursion_misses:\t{skipped}
verified_insns:\t1842
"""


def test_fdinfo_fields_are_read_as_numbers_and_the_rest_left_out() -> None:
    fields = program_stats.parse_fdinfo(FDINFO.format(ns=4200, runs=7, skipped=3))
    assert fields["run_time_ns"] == 4200 and fields["run_cnt"] == 7 and fields["recursion_misses"] == 3
    assert "prog_tag" not in fields  # hexadecimal text, not a count


def test_the_programs_figures_are_summed(tmp_path: Path) -> None:
    (tmp_path / "10").write_text(FDINFO.format(ns=100, runs=2, skipped=0))
    (tmp_path / "11").write_text(FDINFO.format(ns=50, runs=1, skipped=4))
    # fd 12: a program closed meanwhile, left out
    assert program_stats.read_program_runs([10, 11, 12], fdinfo=str(tmp_path)) == ProgramRuns(150, 3, 4)
