"""The BPF probe: what the kernel offers (`facts`), the C layouts (`layout`), the program's text
and flags (`compile`), its hook (`attach`), its maps (`access`, typed for the rest of the exporter
by `maps.KernelMaps`), all held by `loader.Probe`."""
