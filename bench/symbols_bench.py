"""Symbolizer benchmark, side by side with bcc's native symbolizer (libbcc's BPF.sym/BPF.ksym) on
the same addresses, in one run.

    python bench/symbols_bench.py [--functions 100000] [--out bench-symbols.json]

Measures, for a generated C binary with --functions functions (compiled once, cached):
- cold: a fresh symbolizer's first lookup in the binary (maps read + all symbols loaded), median of runs;
- first sight: distinct addresses each looked up once after the file is loaded (new stacks in a flush);
- warm: the same addresses again (stacks seen before);
- kernel warm: kallsyms addresses (ours vs BPF.ksym).
Targets (issue 4): cold load of 100k symbols < 2 s; warm rate >= half of bcc's.
Needs root (bcc reads /proc/PID/maps and map_files; kallsyms addresses).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from offcpu_exporter.symbols import Symbolizer

BUILD = Path(os.environ.get("OFFCPU_BENCH_BUILD", Path(tempfile.gettempdir()) / "offcpu-bench-build"))


def generate_binary(functions: int) -> Path:
    BUILD.mkdir(parents=True, exist_ok=True)
    binary = BUILD / f"many_functions_{functions}"
    if binary.exists():
        return binary
    source = BUILD / f"many_functions_{functions}.c"
    with open(source, "w") as f:
        f.write("#include <stdio.h>\n")
        for i in range(functions):
            # Distinct bodies, no inlining: every function keeps its own symbol and size.
            f.write(f"__attribute__((noinline)) int bench_fn_{i}(int x) {{ return x * {i % 97 + 3} + {i}; }}\n")
        f.write("typedef int (*fn)(int);\nstatic fn table[] = {\n")
        f.write(",\n".join(f"bench_fn_{i}" for i in range(functions)))
        f.write("};\nint main(void) {\n  setvbuf(stdout, NULL, _IOFBF, 1 << 20);\n")
        f.write(f'  for (int i = 0; i < {functions}; i++) printf("%p\\n", (void *)table[i]);\n')
        f.write('  printf("ready\\n"); fflush(stdout);\n  getchar();\n  return 0;\n}\n')
    print(f"compiling {functions} functions (once; cached in {BUILD}) ...", file=sys.stderr)
    subprocess.run(["gcc", "-O0", "-o", str(binary), str(source)], check=True)
    return binary


def start(binary: Path) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    addresses = []
    for line in proc.stdout:
        line = line.strip()
        if line == "ready":
            break
        addresses.append(int(line, 16))
    return proc, addresses


def rate(fn: Callable[[int], object], addresses: Sequence[int], min_seconds: float = 1.0) -> float:
    """Lookups per second, one address per call (as BPF.sym is called)."""
    done = 0
    t0 = time.perf_counter()
    while True:
        for a in addresses:
            fn(a)
        done += len(addresses)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return done / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--functions", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=10_000, help="distinct addresses to look up")
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--out", help="write the results as JSON here")
    options = parser.parse_args(argv)

    try:
        from bcc import BPF
    except ImportError:
        print("bcc (Debian python3-bpfcc) is needed for the comparison", file=sys.stderr)
        return 2

    binary = generate_binary(options.functions)
    proc, function_addresses = start(binary)
    results: dict[str, object] = {"functions": options.functions, "binary_bytes": binary.stat().st_size}
    try:
        pid = proc.pid
        rng = random.Random(4)
        # Inside functions, not only at their starts (return addresses are inside).
        sample = [a + rng.randrange(0, 8) for a in rng.sample(function_addresses, options.lookups)]

        # -- cold ------------------------------------------------------------------------------
        ours_cold = []
        for _ in range(options.cold_runs):
            sym = Symbolizer()
            t0 = time.perf_counter()
            sym.user(pid, [sample[0]])
            ours_cold.append(time.perf_counter() - t0)
        bcc_cold = []
        for _ in range(options.cold_runs):
            BPF._sym_caches.pop(pid, None)
            t0 = time.perf_counter()
            BPF.sym(sample[0], pid)
            bcc_cold.append(time.perf_counter() - t0)

        # -- first sight: file loaded, addresses new -------------------------------------------
        sym = Symbolizer()
        sym.user(pid, [sample[0]])
        t0 = time.perf_counter()
        ours_frames = [sym.user(pid, [a])[0] for a in sample]
        ours_first = len(sample) / (time.perf_counter() - t0)
        BPF._sym_caches.pop(pid, None)
        BPF.sym(sample[0], pid)
        t0 = time.perf_counter()
        bcc_names = [BPF.sym(a, pid) for a in sample]
        bcc_first = len(sample) / (time.perf_counter() - t0)
        agree = sum(f.name == n.decode() for f, n in zip(ours_frames, bcc_names, strict=True)) / len(sample)

        # -- warm ------------------------------------------------------------------------------
        ours_warm = rate(lambda a: sym.user(pid, (a,)), sample)
        bcc_warm = rate(lambda a: BPF.sym(a, pid), sample)
        stack = sample[:20]
        ours_warm_stacks = rate(lambda _a: sym.user(pid, stack), range(500)) * len(stack)

        # -- kernel ----------------------------------------------------------------------------
        with open("/proc/kallsyms") as f:
            ktext = [int(p[0], 16) for p in (line.split() for line in f) if p[1] in "tT" and len(p) == 3]
        ksample = [a + 4 for a in rng.sample(ktext, min(options.lookups, len(ktext)))]
        kernel_ok = bool(ksample) and ksample[0] > 4
        ours_k = bcc_k = 0.0
        kagree = 0.0
        if kernel_ok:
            ours_k_frames = sym.kernel(ksample)
            bcc_k_names = [BPF.ksym(a) for a in ksample]
            kagree = sum(f.name == n.decode() for f, n in zip(ours_k_frames, bcc_k_names, strict=True)) / len(ksample)
            ours_k = rate(lambda a: sym.kernel((a,)), ksample)
            bcc_k = rate(lambda a: BPF.ksym(a), ksample)
    finally:
        proc.kill()
        proc.wait()

    targets = {
        "cold_under_2s": statistics.median(ours_cold) < 2.0,
        "warm_at_least_half_of_bcc": ours_warm >= bcc_warm / 2,
    }
    results.update(
        cold_seconds={"ours": statistics.median(ours_cold), "bcc": statistics.median(bcc_cold)},
        first_sight_per_second={"ours": ours_first, "bcc": bcc_first},
        warm_per_second={"ours": ours_warm, "bcc": bcc_warm},
        warm_per_second_in_stacks_of_20={"ours": ours_warm_stacks},
        kernel_warm_per_second={"ours": ours_k, "bcc": bcc_k},
        name_agreement={"user": agree, "kernel": kagree},
        targets=targets,
    )
    rows = [
        (f"cold load, {options.functions} symbols (s)", statistics.median(ours_cold), statistics.median(bcc_cold)),
        ("first-sight lookups/s", ours_first, bcc_first),
        ("warm lookups/s (1 address a call)", ours_warm, bcc_warm),
        ("warm lookups/s (stacks of 20)", ours_warm_stacks, float("nan")),
        ("kernel warm lookups/s", ours_k, bcc_k),
    ]
    print("(rates: higher is better; seconds: lower is better)")
    print(f"{'':40} {'ours':>14} {'bcc':>14} {'ours/bcc':>9}")
    for label, ours, theirs in rows:
        ratio = ours / theirs if theirs == theirs and theirs else float("nan")
        print(f"{label:40} {ours:>14,.3f} {theirs:>14,.3f} {ratio:>9.2f}")
    print(f"names agreeing with bcc: user {agree:.1%}, kernel {kagree:.1%}")
    for name, ok in targets.items():
        print(f"target {name}: {'met' if ok else 'MISSED'}")
    if options.out:
        Path(options.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
