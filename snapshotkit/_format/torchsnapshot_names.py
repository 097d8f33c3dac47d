"""torchsnapshot's attribute names on our manifest entries, as read-only properties.

Code written against ``torchsnapshot.manifest`` reads ``entry.type``, ``entry.location``,
``entry.get_value()`` and so on. Each entry class inherits the mixin here whose names mean
the same thing for it; our own fields keep their names and stay the source of truth. Names
whose torchsnapshot meaning has no counterpart here are left out (see ``docs/torchsnapshot.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from snapshotkit._format.pieces import Piece

__all__ = [
    "DictNames",
    "ListNames",
    "ObjectNames",
    "PrimitiveNames",
    "ShardedTensorNames",
    "TensorNames",
    "TupleNames",
]


class TensorNames:
    """``type``, ``location``, ``byte_range`` and ``byte_range_tuple`` of a tensor entry.

    ``dtype``, ``shape``, ``serializer`` and ``replicated`` are fields already (``dtype`` is
    spelled ``"float32"``, not ``"torch.float32"``; ``serializer`` is ``"raw"`` where
    torchsnapshot says ``"buffer_protocol"``).
    """

    __slots__ = ()
    if TYPE_CHECKING:  # the entry's field, read here
        pieces: tuple[Piece, ...]

    @property
    def type(self) -> str:
        """``"Tensor"``."""
        return "Tensor"

    @property
    def location(self) -> str:
        """The data object holding the tensor's bytes.

        Raises:
            AttributeError: the tensor is stored in several pieces (or none, when empty), like a
                torchsnapshot ``ChunkedTensorEntry``, which has no location either: read
                ``pieces``.
        """
        return _only_piece(self).location

    @property
    def byte_range(self) -> list[int]:
        """``[start, end)`` of the tensor's bytes in :attr:`location` (same ``AttributeError``)."""
        start, end = _only_piece(self).byte_range
        return [start, end]

    @property
    def byte_range_tuple(self) -> tuple[int, int]:
        """:attr:`byte_range` as a tuple."""
        return _only_piece(self).byte_range


def _only_piece(entry: TensorNames) -> Piece:
    if len(entry.pieces) != 1:
        raise AttributeError(
            f"this tensor is stored in {len(entry.pieces)} pieces, so it has no single location or "
            "byte_range; read entry.pieces (each has location, byte_range and checksum)"
        )
    return entry.pieces[0]


class ShardedTensorNames:
    """``type`` of a sharded tensor entry (``shards`` is a field already)."""

    __slots__ = ()

    @property
    def type(self) -> str:
        """``"ShardedTensor"``."""
        return "ShardedTensor"


class ObjectNames:
    """``type``, ``location`` and ``serializer`` of an object entry (``obj_type`` and
    ``replicated`` are fields already)."""

    __slots__ = ()
    if TYPE_CHECKING:  # the entry's field, read here
        piece: Piece

    @property
    def type(self) -> str:
        """``"object"``."""
        return "object"

    @property
    def location(self) -> str:
        """The data object holding the pickled bytes; they are ``piece.byte_range`` of it (a
        torchsnapshot object has a file of its own)."""
        return self.piece.location

    @property
    def serializer(self) -> str:
        """``"torch_save"``: objects are stored as ``torch.save`` bytes."""
        return "torch_save"


class PrimitiveNames:
    """``type``, ``readable`` and ``get_value()`` of an inline primitive entry (``replicated``
    is a field already)."""

    __slots__ = ()
    if TYPE_CHECKING:  # the entry's fields, read here
        value_type: str
        value: Any

    @property
    def type(self) -> str:
        """The value's type name: ``"int"``, ``"float"``, ``"str"``, ``"bool"``, ``"bytes"``, or
        ``"none"`` (torchsnapshot stores ``None`` as an object)."""
        return self.value_type

    @property
    def readable(self) -> str | None:
        """``repr()`` of a float (its exact value is stored as hex), else None."""
        return repr(self.value) if self.value_type == "float" else None

    def get_value(self) -> Any:
        """The value (the ``value`` field)."""
        return self.value


class DictNames:
    """``type`` of a dict entry (``keys`` is a field already)."""

    __slots__ = ()
    if TYPE_CHECKING:  # the entry's field, read here
        ordered: bool

    @property
    def type(self) -> str:
        """``"OrderedDict"`` for an ordered dict, else ``"dict"``."""
        return "OrderedDict" if self.ordered else "dict"


class ListNames:
    """``type`` of a list entry."""

    __slots__ = ()

    @property
    def type(self) -> str:
        """``"list"``."""
        return "list"


class TupleNames(ListNames):
    """``type`` of a tuple entry (torchsnapshot pickles tuples as objects; ours are containers)."""

    __slots__ = ()

    @property
    def type(self) -> str:
        """``"tuple"``."""
        return "tuple"
