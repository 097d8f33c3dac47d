"""The exception tree of ``snapshotkit.errors``: every class, its built-in base, its message, pickling.

The errors each part of snapshotkit raises are tested next to that part (``tests/take``,
``tests/restore``, ``tests/format``, ``test_app_state.py``, ``test_config.py``, ...). Those tests check
three things: the snapshotkit class, the built-in class a caller unaware of snapshotkit would catch,
and that the message names the offending value and says what to do.
"""

from __future__ import annotations

import pickle

import pytest

import snapshotkit
from snapshotkit import errors
from snapshotkit.errors import SnapshotkitError

pytestmark = pytest.mark.usefixtures("clean_env")


def test_every_error_subclasses_snapshotkit_error_and_a_builtin() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert isinstance(cls, type), name
        if cls is errors.Advice:  # what an error advises, as data: not an error
            continue
        assert issubclass(cls, SnapshotkitError), name
        if cls is SnapshotkitError:
            continue
        builtins_ = [
            base
            for base in cls.__mro__
            if not base.__module__.startswith("snapshotkit") and base not in (Exception, BaseException, object)
        ]
        assert builtins_, f"{name} derives from no built-in exception besides Exception"


def test_errors_all_is_sorted_and_complete() -> None:
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }
    assert set(errors.__all__) == defined | {"Advice"}  # and the advice an error carries
    assert list(errors.__all__) == sorted(errors.__all__)


@pytest.mark.parametrize("name", [name for name in errors.__all__ if name != "Advice"])
def test_error_str_is_the_plain_message(name: str) -> None:
    cls = getattr(errors, name)
    exc = cls("something is wrong at 'x/y'; do this")
    assert str(exc) == "something is wrong at 'x/y'; do this"
    # Errors cross process boundaries (multiprocessing, async take): they must pickle.
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is cls
    assert str(again) == str(exc)


def test_the_advice_an_error_carries_crosses_processes() -> None:
    advice = errors.Advice("a snapshot already exists at 'x'", "new_destination", ("x",))
    exc = errors.SnapshotExistsError(f"{advice.problem}. Give the take a new path").advised(advice)
    again = pickle.loads(pickle.dumps(exc))
    assert again.advice == advice and str(again) == str(exc)
    assert errors.SnapshotkitError("no advice").advice is None


def test_public_api_exposes_errors_module() -> None:
    assert snapshotkit.errors is errors
