from __future__ import annotations

import pytest

from offcpu_exporter.snapshot import Snapshot
from testkit.snapshots import make_after, make_before


@pytest.fixture
def before() -> Snapshot:
    return make_before()


@pytest.fixture
def after() -> Snapshot:
    return make_after()
