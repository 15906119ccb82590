"""pyproject.toml lists the packages (discovery cannot see the top-level bpf/ it maps into the
package): the list must name every package of the source tree, and the BPF sources must be found
where the probe looks for them."""

import tomllib
from pathlib import Path

from offcpu_exporter.probe import layout
from offcpu_exporter.unwind import layout as unwind_layout

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_of_the_source_tree_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    source = ROOT / "exporter"
    on_disk = {".".join(p.parent.relative_to(source).parts) for p in source.rglob("__init__.py")}
    assert set(config["packages"]) == on_disk | {"offcpu_exporter.bpf"}
    assert config["package-dir"] == {"": "exporter", "offcpu_exporter.bpf": "bpf"}


def test_the_probe_reads_its_sources_from_the_top_level_bpf_directory() -> None:
    assert layout.BPF_DIR == ROOT / "bpf"
    for name in (layout.SOURCE, layout.HEADER, unwind_layout.HEADER, unwind_layout.WALK_HEADER):
        assert (layout.BPF_DIR / name).is_file(), name
    assert not (ROOT / "exporter" / "offcpu_exporter" / "bpf").exists()
