"""The order xdist hands the test files out in (tests/helpers/schedule.py, applied by tests/conftest.py): the files
measured heaviest first, each file whole, and xdist told not to re-sort them by their number of tests."""

from __future__ import annotations

from dataclasses import dataclass

from helpers.schedule import HEAVIEST_FIRST, TESTS, file_of, heaviest_first, keep_collection_order


@dataclass
class Item:
    nodeid: str


def test_every_file_the_order_names_exists_and_is_named_once():
    assert HEAVIEST_FIRST and len(set(HEAVIEST_FIRST)) == len(HEAVIEST_FIRST)
    assert [n for n in HEAVIEST_FIRST if not (TESTS / n).is_file()] == []


def test_named_files_come_first_in_their_order_and_every_file_stays_whole_and_in_order():
    ids = ["tests/a/test_a.py::t1", "tests/a/test_a.py::t2", "tests/b/test_b.py::t1", "tests/c/test_c.py::t1[x]",
           "tests/c/test_c.py::t2", "tests/d/test_d.py::t1"]
    got = [i.nodeid for i in heaviest_first([Item(n) for n in ids], order=("c/test_c.py", "b/test_b.py", "z/test_gone.py"))]
    assert got == ["tests/c/test_c.py::t1[x]", "tests/c/test_c.py::t2", "tests/b/test_b.py::t1",
                   "tests/a/test_a.py::t1", "tests/a/test_a.py::t2", "tests/d/test_d.py::t1"]
    assert file_of("tests/c/test_c.py::t1[x::y]") == "c/test_c.py"


def test_xdist_keeps_the_order_only_where_it_schedules():
    class Options:
        loadscopereorder = True

    class Config:
        option = Options()

    keep_collection_order(Config)
    assert Config.option.loadscopereorder is False

    class Bare:
        option = type("O", (), {})()

    keep_collection_order(Bare)  # no xdist: nothing to set, nothing fails
    assert not hasattr(Bare.option, "loadscopereorder")


def test_this_run_was_ordered_so(request):
    """This run's own items: the named files it collected come first, in the named order, each whole."""
    files = []
    for item in request.session.items:
        name = file_of(item.nodeid)
        if not files or files[-1] != name:
            files.append(name)
    assert len(files) == len(set(files)), "a file's tests were split"
    named = [n for n in files if n in HEAVIEST_FIRST]
    assert files[:len(named)] == named == [n for n in HEAVIEST_FIRST if n in files]
    option = request.config.option
    assert getattr(option, "loadscopereorder", False) is False
