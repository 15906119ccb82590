"""The kernel programs: offcpu.bpf.c (the probe, compiled by bcc when the exporter starts), unwind.h
(the user-stack walk it includes) and the layouts both share with the Python side (offcpu.h,
unwind_table.h). They live at the top of the repository and are installed as the package data of
`offcpu_exporter.bpf` (pyproject.toml maps this directory there); this file only makes them
findable, in an installed package and in an editable checkout alike."""

from pathlib import Path

__all__ = ["SOURCE_DIR"]

SOURCE_DIR = Path(__file__).resolve().parent
