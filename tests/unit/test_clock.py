import itertools
import random
import time

from offcpu_exporter.clock import WallClock, ktime_ns, wall_ns_at


class Clocks:
    """A kernel clock that advances 100 ns a read, and a wall clock 7 s ahead of it whose reads
    land anywhere between the kernel reads around them."""

    def __init__(self, seed: int) -> None:
        self.now = 1_000_000_000
        self.ahead = 7_000_000_000
        self.stall_next = 0
        self._random = random.Random(seed)

    def kernel(self) -> int:
        self.now += 100 + self.stall_next
        self.stall_next = 0
        return self.now

    def wall(self) -> int:
        return self.now + self.ahead + self._random.randrange(0, 100)


def test_wall_durations_are_kernel_durations_whatever_the_jitter_of_the_reads() -> None:
    clocks = Clocks(seed=1)
    clock = WallClock(wall=clocks.wall, kernel=clocks.kernel)
    instants = sorted(random.Random(2).randrange(0, 10**12) for _ in range(200))
    walls = [clock.wall_ns(k) for k in instants]
    for (k1, w1), (k2, w2) in itertools.pairwise(zip(instants, walls, strict=True)):
        assert w2 - w1 == k2 - k1
    assert abs(walls[0] - instants[0] - clocks.ahead) <= 100


def test_a_step_of_the_wall_clock_is_followed() -> None:
    clocks = Clocks(seed=3)
    clock = WallClock(wall=clocks.wall, kernel=clocks.kernel)
    before = clock.wall_ns(5_000)
    clocks.ahead -= 3_600_000_000_000  # the wall clock stepped an hour back
    after = clock.wall_ns(5_000)
    assert abs(before - after - 3_600_000_000_000) <= 100


def test_an_interrupted_read_is_taken_again() -> None:
    clocks = Clocks(seed=4)
    real = WallClock(wall=clocks.wall, kernel=clocks.kernel).wall_ns(0)
    reads = 0

    def preempted_once() -> int:
        # Preempted for 10 ms between the first kernel read and the wall read: the difference
        # taken from that reading would be 5 ms off.
        nonlocal reads
        reads += 1
        if reads == 1:
            clocks.now += 10_000_000
        return clocks.wall()

    assert abs(WallClock(wall=preempted_once, kernel=clocks.kernel).wall_ns(0) - real) <= 100
    assert reads == 2


def test_the_shared_clock_dates_now_as_the_wall_clock_does() -> None:
    assert abs(wall_ns_at(ktime_ns()) - time.time_ns()) < 50_000_000
