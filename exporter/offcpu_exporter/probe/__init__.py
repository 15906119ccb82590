"""The BPF probe: kernel capability checks (`kernel`), the C layouts (`layout`), the loader (`loader`)."""
