"""What the loader derives from ProbeConfig: the program's -D defines."""

from __future__ import annotations

from offcpu_exporter.probe.loader import ProbeConfig


def _defines(config: ProbeConfig) -> dict[str, str]:
    return dict(flag[2:].split("=", 1) for flag in config.cflags("tracepoint") if flag.startswith("-D") and "=" in flag)


def test_sampling_budgets_are_given_per_window() -> None:
    defines = _defines(ProbeConfig(stack_budget_thread=1000, stack_budget_cpu=5000, sample_window_ns=100_000_000))
    assert (defines["STACK_SAMPLING"], defines["THREAD_BUDGET"], defines["CPU_BUDGET"]) == ("1", "100", "500")
    assert defines["SAMPLE_WINDOW_NS"] == "100000000ULL"
    # A budget below one capture per window still captures one.
    assert _defines(ProbeConfig(stack_budget_thread=1))["THREAD_BUDGET"] == "1"
    assert _defines(ProbeConfig(stack_sampling=False))["STACK_SAMPLING"] == "0"


def test_blocks_in_progress_are_credited_unless_max_block_is_set() -> None:
    assert ProbeConfig().in_progress_credit
    assert ProbeConfig(min_block_ns=1_000).in_progress_credit
    assert not ProbeConfig(max_block_ns=5_000_000).in_progress_credit
