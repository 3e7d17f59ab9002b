"""fastload/_loading/seams.py declares what the delivery loop asks of a plan and of a
transport: the plans and transports the engine hands ``_core.Iteration`` have every member
(at run time) and satisfy the protocols (under mypy, which flags a class that does not)."""

from pathlib import Path

import numpy as np
import pytest
from helpers import mypy_on

import fastload
from fastload._loading.engine import _Rechecked
from fastload._loading.plan import ItemPlan, StepPlan, make_plan
from fastload._loading.processes import _Transport
from fastload._loading.schedule import Schedule
from fastload._loading.seams import Feed, Plan, Transport
from fastload._storage.feeds import DatasetFeed
from fastload._storage.readahead import ReadAhead

ROOT = Path(fastload.__file__).resolve().parent.parent


def members(protocol):
    """The names a protocol declares: its attributes and its methods."""
    methods = {name for name, value in vars(protocol).items() if callable(value)}
    return (set(protocol.__annotations__) | methods) - {n for n in methods if n.startswith("_")}


def test_the_plans_have_every_member_of_the_plan_protocol():
    item = make_plan(np.zeros((6, 2)), Schedule(np.arange(6), 4))
    step = make_plan(np.zeros((6, 2)), Schedule(np.arange(0), 4))
    assert isinstance(item, ItemPlan) and isinstance(step, StepPlan)
    declared = members(Plan)
    assert {"rows", "fields", "signature", "allocate", "assemble", "load_error"} <= declared
    for plan in (item, step):
        assert not {name for name in declared if not hasattr(plan, name)}, type(plan)


def test_the_transports_have_every_member_of_the_transport_protocol():
    assert members(Transport) == {"next", "lend", "copied", "close"}
    for transport in (_Transport, _Rechecked):
        assert all(callable(getattr(transport, name, None)) for name in members(Transport))


def test_the_feeds_have_every_member_of_the_feed_protocol():
    assert members(Feed) == {"gate", "start", "check", "delivered", "ensure", "close"}
    for feed in (DatasetFeed(None, [], []), ReadAhead(None, np.arange(4), 2, 0, None)):
        assert not {name for name in members(Feed) if not hasattr(feed, name)}, type(feed)


SEAMS_CODE = """\
from fastload._loading.engine import _Rechecked
from fastload._loading.plan import ItemPlan, StepPlan
from fastload._loading.processes import _Transport
from fastload._loading.seams import Feed, Plan, Transport
from fastload._storage.feeds import DatasetFeed


def feeds(dataset: DatasetFeed) -> Feed:
    return dataset


def plans(item: ItemPlan, step: StepPlan) -> tuple[Plan, Plan]:
    return item, step


def transports(workers: _Transport, rechecked: _Rechecked) -> tuple[Transport, Transport]:
    return workers, rechecked


class NextOnly:
    def next(self, release: int) -> None: ...


not_a_transport: Transport = NextOnly()  # error
"""


@pytest.mark.slow
def test_mypy_checks_the_plans_and_transports_against_the_protocols(tmp_path):
    pytest.importorskip("mypy.api")
    report, flagged, expected = mypy_on(SEAMS_CODE, tmp_path)
    assert flagged == expected, report
