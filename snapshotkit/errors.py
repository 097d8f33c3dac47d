"""The exceptions snapshotkit raises.

Every error snapshotkit raises on purpose derives from :class:`SnapshotkitError`, and each class
also derives from the built-in exception a caller would naturally catch, so ``except
FileNotFoundError`` keeps working for code that does not know snapshotkit::

    SnapshotkitError
    ├── SnapshotNotFoundError          (FileNotFoundError)  nothing committed at the path
    │   ├── IncompleteSnapshotError                        data objects but no manifest
    │   └── ForeignCheckpointError                         another library's checkpoint is there
    ├── SnapshotExistsError            (FileExistsError)    take onto an existing snapshot
│   └── FolderOfSnapshotsError                         take into a folder of step_<n> snapshots
    ├── ExportExistsError              (FileExistsError)    export onto an existing file or directory
    ├── InvalidAppStateError           (TypeError)          app_state value is not Stateful
    ├── InvalidArgumentError           (TypeError)          an argument of the wrong type (path=None)
    ├── LogicalPathNotFoundError       (KeyError)           unknown logical path / missing key
    │   └── AppStateKeyNotFoundError   (also AssertionError) an app_state key the snapshot lacks
    ├── StateMismatchError             (ValueError)         shape/dtype differs (strict)
    ├── ManifestError                  (ValueError)         malformed manifest
    │   ├── UnsupportedFormatVersionError                   written by a newer snapshotkit
    │   ├── UnsafeLocationError                             location leaves the snapshot
    │   └── ManifestIntegrityError     (also IntegrityError) manifest bytes fail their integrity check
    ├── IntegrityError                 (ValueError)         stored bytes are not what was written
    │   ├── ChecksumMismatchError                           checksum differs
    │   ├── TruncatedDataError                              data object shorter than the manifest says
    │   └── BaseSnapshotError                               an incremental snapshot's base is gone or replaced
    ├── RestoreMemoryError             (MemoryError)        a new tensor for a read does not fit in memory
    ├── UnsafeObjectError              (pickle.UnpicklingError) object refused by weights_only loading
    ├── UnsupportedValueError          (TypeError)          a leaf snapshotkit cannot store
    ├── ConfigError                    (ValueError)         bad argument or SNAPSHOTKIT_* variable
    ├── ImportSourceError              (ValueError)         import_snapshot cannot read its source
    ├── RankFailedError                (RuntimeError)       another rank of a multi-rank take/restore failed
    ├── PartialRestoreError            (RuntimeError)       restore_latest restored nothing, but changed the state
    ├── CollectiveTimeoutError         (TimeoutError)       other ranks did not arrive in time
    ├── WaitTimeoutError               (TimeoutError)       PendingSnapshot.wait(timeout) ran out
    ├── CheckpointDaemonError          (RuntimeError)       the async_take daemon process died
    └── StorageError                   (OSError)            a storage plugin failed
        ├── UnknownStorageSchemeError  (ValueError)         no plugin for a URI scheme
        ├── StoragePermissionError     (PermissionError)    credentials refused (403): not retried
        ├── BucketNotFoundError        (FileNotFoundError)  the bucket does not exist: not retried
        ├── RetriesExhaustedError                           transient failures outlasted the retries
        ├── CommitOutcomeUnknownError                       the manifest write failed and its outcome is unknown
        └── UnsafeStorageObjectError                        object is a symlink out of the root or not a file

Messages say what was wrong, the offending value, and what to do next. Where the advice is worded
for the Python API (an argument, a method), the error's ``advice`` also holds it as data
(:class:`Advice`), which the command line words in its own vocabulary.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover - Python 3.10
    from typing_extensions import Self

__all__ = [
    "Advice",
    "AppStateKeyNotFoundError",
    "BaseSnapshotError",
    "BucketNotFoundError",
    "CheckpointDaemonError",
    "ChecksumMismatchError",
    "CollectiveTimeoutError",
    "CommitOutcomeUnknownError",
    "ConfigError",
    "ExportExistsError",
    "FolderOfSnapshotsError",
    "ForeignCheckpointError",
    "ImportSourceError",
    "IncompleteSnapshotError",
    "IntegrityError",
    "InvalidAppStateError",
    "InvalidArgumentError",
    "LogicalPathNotFoundError",
    "ManifestError",
    "ManifestIntegrityError",
    "PartialRestoreError",
    "RankFailedError",
    "RestoreMemoryError",
    "RetriesExhaustedError",
    "SnapshotExistsError",
    "SnapshotNotFoundError",
    "SnapshotkitError",
    "StateMismatchError",
    "StorageError",
    "StoragePermissionError",
    "TruncatedDataError",
    "UnknownStorageSchemeError",
    "UnsafeLocationError",
    "UnsafeObjectError",
    "UnsafeStorageObjectError",
    "UnsupportedFormatVersionError",
    "UnsupportedValueError",
    "WaitTimeoutError",
]


@dataclasses.dataclass(frozen=True)
class Advice:
    """What to do next about an error, as data, for an interface that says it in its own words.

    A message says what was wrong and then what to do, in the words of the Python API (its
    arguments, classes, methods). Where that advice names Python, the error also carries it as an
    ``Advice``: the message up to the advice (``problem``), which advice it is (``action``) and the
    values it names, so that another interface (the ``snapshotkit`` command line) can say the same
    in its own vocabulary (its arguments, its commands).

    Attributes:
        problem: the message without its advice: what was wrong, with the offending value.
        action: which advice: ``"new_destination"`` (write to a path that holds nothing yet; the
            destination is the one argument the call writes to), ``"open_a_snapshot"`` (the path
            is a folder of snapshots: open one of them; ``paths`` holds the folder and its latest
            snapshot, ``managed`` whether they are a manager's ``step_<n>``), ``"remove_leftovers"``
            (a take never committed: restore from an earlier snapshot; ``paths`` holds the folder
            the leftovers are in, ``managed`` whether it is a manager's step), ``"restore_another"``
            (stored bytes are damaged: restore from another snapshot), ``"name_the_format"`` (an
            import source whose format is not recognized; ``paths`` holds the formats it reads),
            ``"format_given"`` (the import source is not in the format the caller named; ``paths``
            holds that format's name), ``"strip_the_name"`` (an export for transformers whose every key starts with an
            ``app_state`` name: strip it; ``paths`` holds that name and ``/``).
        paths: the paths the advice names, as ``action`` says.
        managed: whether ``paths`` are a ``SnapshotManager``'s (``step_<n>`` under its root).
    """

    problem: str
    action: str
    paths: tuple[str, ...] = ()
    managed: bool = False


class SnapshotkitError(Exception):
    """Root of every error snapshotkit raises on purpose.

    Attributes:
        advice: what to do next as data (:class:`Advice`), where the message words it for the
            Python API; None otherwise (the message's advice then suits every interface).
    """

    advice: Advice | None = None

    def advised(self, advice: Advice) -> Self:
        """Attach ``advice`` (what the message advises, as data) and return this error."""
        self.advice = advice
        return self


class SnapshotNotFoundError(SnapshotkitError, FileNotFoundError):
    """No committed snapshot exists at the given path."""

    def __str__(self) -> str:  # FileNotFoundError would format errno-style tuples
        return str(self.args[0]) if self.args else ""


class IncompleteSnapshotError(SnapshotNotFoundError):
    """The path holds snapshot data but no manifest: the take never committed."""


class ForeignCheckpointError(SnapshotNotFoundError):
    """The path holds another library's checkpoint (torchsnapshot, DCP, safetensors, ``torch.save``),
    not a snapshot; ``snapshotkit import`` converts it.

    Attributes:
        source_format: what was found, as ``import_snapshot(source=...)`` and
            ``snapshotkit import --from`` name it (``"dcp"``, ``"torchsnapshot"``...).
    """

    def __init__(self, message: str, source_format: str = "") -> None:
        super().__init__(message)
        self.source_format = source_format


class SnapshotExistsError(SnapshotkitError, FileExistsError):
    """A take was asked to write onto a path that already holds a snapshot."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FolderOfSnapshotsError(SnapshotExistsError):
    """A take was asked to write into a folder that holds ``step_<n>`` snapshots below it (a
    :class:`~snapshotkit.SnapshotManager`'s root), most likely with the ``/step_<n>`` forgotten:
    its snapshot would sit beside them, where neither the manager nor ``snapshotkit ls`` counts
    it. Refused before anything is written.

    Attributes:
        steps: the committed steps found below the path, ascending.
    """

    def __init__(self, message: str, steps: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.steps = steps


class ExportExistsError(SnapshotkitError, FileExistsError):
    """An export was asked to write onto a path that already exists (it never overwrites)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidAppStateError(SnapshotkitError, TypeError):
    """An app_state value does not implement ``state_dict``/``load_state_dict``."""


class InvalidArgumentError(SnapshotkitError, TypeError):
    """An argument has a type snapshotkit cannot use (``path=None``, ``obj_out=[1, 2]``)."""


class LogicalPathNotFoundError(SnapshotkitError, KeyError):
    """A logical path (or app_state key) is not in the snapshot."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class AppStateKeyNotFoundError(LogicalPathNotFoundError, AssertionError):
    """An ``app_state`` key (of :meth:`~snapshotkit.Snapshot.restore` or
    :meth:`~snapshotkit.Snapshot.get_state_dict_for_key`) is not in the snapshot for this rank.

    Also an ``AssertionError``, which is what torchsnapshot raises there, so ``except
    AssertionError`` in code written for it keeps working.
    """


class StateMismatchError(SnapshotkitError, ValueError):
    """A stored tensor does not match its in-place destination (shape or dtype)."""


class ManifestError(SnapshotkitError, ValueError):
    """The manifest (``.snapshot_metadata``) is malformed."""


class UnsupportedFormatVersionError(ManifestError):
    """The manifest was written by a newer snapshotkit with a format this one cannot read."""


class UnsafeLocationError(ManifestError):
    """A manifest location tries to leave the snapshot (``..``, absolute paths)."""


class IntegrityError(SnapshotkitError, ValueError):
    """Stored bytes differ from what the take wrote."""


class ManifestIntegrityError(ManifestError, IntegrityError):
    """The manifest's bytes fail its integrity check (damaged or edited after the take)."""


class ChecksumMismatchError(IntegrityError):
    """The checksum of a stored piece differs from the manifest's."""


class TruncatedDataError(IntegrityError):
    """A data object is shorter than the byte range the manifest records."""


class BaseSnapshotError(IntegrityError):
    """An incremental snapshot's base, which holds bytes it references, is gone, damaged or no
    longer the snapshot it referenced (deleted and replaced by another of the same name)."""


class RestoreMemoryError(SnapshotkitError, MemoryError):
    """A value read from the snapshot does not fit in memory (restore it in place instead)."""


class UnsafeObjectError(SnapshotkitError, pickle.UnpicklingError):
    """A stored object cannot be loaded with ``weights_only=True``."""


class UnsupportedValueError(SnapshotkitError, TypeError):
    """A value in the state cannot be stored by snapshotkit."""


class ConfigError(SnapshotkitError, ValueError):
    """An argument or ``SNAPSHOTKIT_*`` environment variable has an invalid value."""


class ImportSourceError(SnapshotkitError, ValueError):
    """``import_snapshot`` cannot read its source: nothing is there, its format is not recognized (or
    is not the one ``source=`` names), or the checkpoint is malformed."""


class RankFailedError(SnapshotkitError, RuntimeError):
    """Another rank of a multi-rank take or restore failed; its error is the ``__cause__``.

    Attributes:
        rank: the rank that failed (the lowest, if several did).
    """

    def __init__(self, message: str, rank: int = -1) -> None:
        super().__init__(message)
        self.rank = rank


class PartialRestoreError(SnapshotkitError, RuntimeError):
    """:meth:`SnapshotManager.restore_latest <snapshotkit.SnapshotManager.restore_latest>` restored
    no snapshot, and a failed attempt may already have written into the objects of ``app_state``
    (on this rank or another): they hold part of a snapshot, so training on from them would be
    wrong. The last attempt's error is the ``__cause__``.

    Attributes:
        attempts: ``(step, why it failed)`` of each snapshot tried, newest first.
    """

    def __init__(self, message: str, attempts: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(message)
        self.attempts = attempts


class CollectiveTimeoutError(SnapshotkitError, TimeoutError):
    """Other ranks did not reach a collective step of a take or restore in time."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class WaitTimeoutError(SnapshotkitError, TimeoutError):
    """``PendingSnapshot.wait(timeout)`` returned before the snapshot was committed."""


class CheckpointDaemonError(SnapshotkitError, RuntimeError):
    """The checkpoint daemon process of ``async_take(executor="process")`` died or cannot be reached."""


class StorageError(SnapshotkitError, OSError):
    """A storage plugin failed to read or write."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownStorageSchemeError(StorageError, ValueError):
    """No storage plugin handles the URI's scheme."""


class StoragePermissionError(StorageError, PermissionError):
    """The storage service refused the credentials or the request (HTTP 403); never retried."""


class BucketNotFoundError(StorageError, FileNotFoundError):
    """The bucket named in the URI does not exist; never retried."""


class RetriesExhaustedError(StorageError):
    """A request kept failing transiently (resets, 5xx, throttling) until its retries ran out."""


class CommitOutcomeUnknownError(StorageError):
    """The manifest write of a take failed in a way that leaves unknown whether it was committed
    (an interrupt, a timeout, or a store that could not be asked afterwards). Every rank kept its
    data: open the path to see whether the snapshot exists; if it does not, the leftovers are an
    incomplete snapshot that ``SnapshotManager`` and ``snapshotkit cleanup`` remove."""


class UnsafeStorageObjectError(StorageError):
    """A stored object is not a regular file inside the snapshot (a symlink leading out of it, a
    FIFO, a socket, a device): refused without reading it or blocking on it."""
