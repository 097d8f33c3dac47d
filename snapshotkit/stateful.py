"""What can go into an app_state: the :class:`Stateful` protocol, :class:`StateDict` and :class:`RNGState`."""

from __future__ import annotations

import random
from collections import UserDict
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["AppState", "RNGState", "StateDict", "Stateful"]


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state_dict)``.

    ``nn.Module``, optimizers and LR schedulers already are; so is any object of yours that
    defines the two methods. This is the same shape torchsnapshot and DCP use.
    """

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any) -> Any: ...


AppState = dict[str, Stateful]


class StateDict(UserDict):  # type: ignore[type-arg]
    """A dict that is :class:`Stateful`: for counters, configs and other loose state.

    ``state_dict()`` returns the dict itself (so in-place restore reaches its tensors) and
    ``load_state_dict(sd)`` updates it.
    """

    def __init__(self, dict: Any = None, /, **kwargs: Any) -> None:  # UserDict's and torchsnapshot's name
        cls = type(self)
        if type(dict) is _DICT and cls.__setitem__ is _SETITEM and cls.update is _UPDATE:
            # UserDict adds a dict's items one __setitem__ call each; here that call stores the
            # item, so one copy in C gives the same dict (a restore of many tensors builds one)
            self.data = _DICT(dict)
            if kwargs:
                self.update(kwargs)
        else:
            super().__init__(dict, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.data

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.data.update(state_dict)


_SETITEM, _UPDATE, _DICT = UserDict.__setitem__, UserDict.update, dict


class RNGState:
    """The random number generators of the process, as one :class:`Stateful`.

    Captures torch's CPU generator, every CUDA device's generator when CUDA is initialized,
    Python's :mod:`random`, and NumPy's global generator when NumPy is installed.

    Guarantee: after ``Snapshot(path).restore(app_state)`` the generators are in exactly the
    state they had when ``Snapshot.take`` returned, even if other objects' ``state_dict()`` or
    ``load_state_dict()`` draw random numbers: take captures this state before any other
    ``state_dict()`` and puts it back afterwards; restore loads it last.
    """

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss_next = random.getstate()
        state: dict[str, Any] = {
            "torch_cpu": torch.get_rng_state(),
            "python": {
                "version": version,
                "internal": torch.tensor(internal, dtype=torch.int64),
                "gauss_next": gauss_next,
            },
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
        numpy_state = _numpy_state()
        if numpy_state is not None:
            state["numpy"] = numpy_state
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch_cpu"])
        python = state_dict.get("python")
        if python is not None:
            internal = tuple(int(v) for v in python["internal"].tolist())
            random.setstate((python["version"], internal, python["gauss_next"]))
        cuda_states = state_dict.get("torch_cuda")
        if cuda_states is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda_states)
        numpy_state = state_dict.get("numpy")
        if numpy_state is not None:
            _set_numpy_state(numpy_state)


def _numpy_state() -> dict[str, Any] | None:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency today; kept optional here
        return None
    state = np.random.get_state(legacy=True)
    assert isinstance(state, tuple)  # legacy=True: (kind, keys, pos, has_gauss, cached_gaussian)
    kind, keys, pos, has_gauss, cached_gaussian = state
    return {
        "kind": str(kind),
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def _set_numpy_state(state: dict[str, Any]) -> None:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["kind"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"]))
