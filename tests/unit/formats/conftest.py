from __future__ import annotations

import pytest
from synthetic import make_after, make_before

from exporter.snapshot import Snapshot


@pytest.fixture
def before() -> Snapshot:
    return make_before()


@pytest.fixture
def after() -> Snapshot:
    return make_after()
