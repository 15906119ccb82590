"""Exact and sampled figures, split over stacks.

Every block adds to its key's exact (count, ns); a block whose stacks were captured (all of them,
or a bounded sample: see bpf/offcpu.bpf.c) also adds its weight (1 / the probability of its
capture) times its figures to the weighted pair. Per thread (or process) and reason, each flush
splits the exact increase over the stacks in proportion to their weighted increases (a ratio
estimate: unbiased as the sample grows, and the stacks always sum to the exact total); what no
captured stack carries is shown as `[stack not sampled]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from offcpu_exporter.in_progress import Credit
from offcpu_exporter.probe.maps import CounterKey, CounterValue
from offcpu_exporter.snapshot import Counter
from offcpu_exporter.stack_names import FOLDED, IN_PROGRESS, NOT_SAMPLED, StackIds

__all__ = ["Group", "GroupKey", "add_credits", "add_row", "apportion"]

GroupKey = tuple[int, int, int]  # (tgid, tid, reason)


@dataclass(slots=True)
class Group:
    """One thread's (or process's) blocks for one reason in one flush: the exact increase and the
    weighted increase of each stack."""

    blocks: int = 0
    ns: int = 0
    stacks: dict[StackIds, list[int]] = field(default_factory=dict)  # ids -> [weighted blocks, weighted ns]

    def weigh(self, ids: StackIds, blocks: int, ns: int) -> None:
        w = self.stacks.get(ids)
        if w is None:
            self.stacks[ids] = [blocks, ns]
        else:
            w[0] += blocks
            w[1] += ns

    def split(self) -> list[tuple[StackIds, Counter]]:
        """The exact increase over the stacks, in proportion to their weights; the rest (blocks no
        captured stack carries) under NOT_SAMPLED."""
        if len(self.stacks) == 1:
            # Most groups (a thread or process blocking at one place): apportion() of one weight
            # gives all or nothing, without its lists.
            ((only, (weighted_blocks, weighted_ns)),) = self.stacks.items()
            its_blocks = self.blocks if self.blocks > 0 and weighted_blocks > 0 else 0
            its_ns = self.ns if self.ns > 0 and weighted_ns > 0 else 0
            one = [(only, Counter(its_blocks, its_ns))]
            if its_blocks != self.blocks or its_ns != self.ns:
                one.append((NOT_SAMPLED, Counter(self.blocks - its_blocks, self.ns - its_ns)))
            return one
        ids = list(self.stacks)
        blocks = apportion(self.blocks, [self.stacks[i][0] for i in ids])
        nss = apportion(self.ns, [self.stacks[i][1] for i in ids])
        rows = [(i, Counter(b, n)) for i, b, n in zip(ids, blocks, nss, strict=True)]
        rest = Counter(self.blocks - sum(blocks), self.ns - sum(nss))
        if rest:
            rows.append((NOT_SAMPLED, rest))
        return rows


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights`, in integers that sum to `total` exactly (largest
    remainders get the units left over). All-zero weights get nothing."""
    if len(weights) == 1:  # most groups: one stack
        return [total if total > 0 and weights[0] > 0 else 0]
    whole = sum(weights)
    if whole <= 0 or total <= 0:
        return [0] * len(weights)
    shares = [total * w // whole for w in weights]
    left = total - sum(shares)
    if left:
        by_remainder = sorted(range(len(weights)), key=lambda i: (total * weights[i]) % whole, reverse=True)
        for i in by_remainder[:left]:
            shares[i] += 1
    return shares


def add_row(groups: dict[GroupKey, Group], key: CounterKey, inc: CounterValue) -> None:
    """A kernel counter's increase, into its thread's (or process's) group."""
    if len(key) == 5:  # wakers off (see CounterKey)
        tgid, tid, reason, user_stack, kernel_stack = key
        waker = None
    else:
        tgid, tid, reason, user_stack, kernel_stack = key[:5]
        waker = key.waker
    blocks, ns, weighted_blocks, weighted_ns = inc
    gkey = (tgid, tid, reason)
    group = groups.get(gkey)
    if group is None:
        group = groups[gkey] = Group()
    group.blocks += blocks
    group.ns += ns
    if user_stack or kernel_stack:
        # With wakers on, the waker goes with the stacks: the pair is what the time is split over.
        ids: StackIds = (user_stack, kernel_stack) if waker is None else (user_stack, kernel_stack, waker)
        group.weigh(ids, weighted_blocks, weighted_ns)
    elif weighted_blocks or weighted_ns:
        # Captured blocks whose own counter could not be created (the map was full).
        group.weigh(FOLDED, weighted_blocks, weighted_ns)


def add_credits(groups: dict[GroupKey, Group], credits: list[Credit], *, kprobe: bool, per_thread: bool) -> None:
    """The time of blocks in progress counted by this flush, into their groups."""
    for tid, block, ns in credits:
        _, user_stack, kernel_stack, tgid, reason, weight = block
        # Keyed as the kernel keys its counters: without --per-thread, tid 0.
        gkey = (tgid, tid if per_thread else 0, reason)
        group = groups.get(gkey)
        if group is None:
            group = groups[gkey] = Group()
        group.ns += ns
        if weight and user_stack:
            group.weigh((user_stack, kernel_stack), 0, ns * weight)
        elif kprobe:
            group.weigh(IN_PROGRESS, 0, ns)
        # Else a block whose stacks were not sampled: its time is spread like the thread's
        # other unsampled blocks, over its sampled stacks.
