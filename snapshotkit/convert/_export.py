"""``export_snapshot``: a snapshot -> files another library loads with its own API.

Order of work: the arguments are checked (a bad one reads and writes nothing), the snapshot's
manifest is read and the selection made (which may still refuse: a ``strip_prefix`` a selected
path lacks, two paths giving one key, nothing selected), and only then is anything written.
The output is written under a temporary name next to ``dst`` (a hidden directory,
``.<dst name>.export-<random>``) and moved into place last: a file is hard-linked to ``dst``
(which fails if ``dst`` appeared meanwhile), a directory renamed. A failed or interrupted export
removes the temporary directory: it leaves nothing at ``dst`` and nothing else behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from snapshotkit._config import Config, snapshot_path
from snapshotkit._format.entries import Entry
from snapshotkit._runtime.filewrite import fsync_path
from snapshotkit._runtime.frames import drop_frames
from snapshotkit._runtime.progress import ByteProgress, check_progress
from snapshotkit.convert import _to_safetensors, _to_torch, _to_transformers
from snapshotkit.convert._export_source import Source, Written, select_flat, select_tree
from snapshotkit.errors import Advice, ConfigError, ExportExistsError, InvalidArgumentError

#: The formats ``export_snapshot(to=...)`` writes.
FORMATS = ("dcp", "safetensors", "torch")


@dataclasses.dataclass(frozen=True)
class ExportReport:
    """What :func:`export_snapshot` wrote.

    Attributes:
        format: ``"torch"``, ``"safetensors"`` or ``"dcp"``.
        files: the files written, sorted (``dst`` itself, or the files of the ``dst`` directory).
        tensors_written: how many tensors the output holds.
        bytes_written: the size of those files together.
        skipped: ``(logical path, reason)`` of every selected leaf the output does not hold, sorted
            by path (``dict(report.skipped)`` gives a mapping): non-tensors for safetensors, dtypes
            a format cannot hold, objects ``weights_only=True`` refuses, the rest of a list that
            lost one of them.
    """

    format: str
    files: tuple[str, ...]
    tensors_written: int
    bytes_written: int
    skipped: tuple[tuple[str, str], ...] = ()


def export_snapshot(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    to: str,
    select: str | Sequence[str] | None = None,
    strip_prefix: str | None = None,
    max_shard_bytes: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    memory_budget_bytes: int | None = None,
    weights_only: bool = True,
    progress: bool = False,
    config: Any = None,
) -> ExportReport:
    """Write the snapshot at ``src`` as a file (or directory) another library loads with its own API.

    * ``to="torch"``: one file; ``torch.load(dst, weights_only=True)`` returns the nested state
      dicts of the app state (``{"model": {...}, "optim": {...}}``), containers and primitives
      rebuilt, tied tensors tied.
    * ``to="safetensors"``: tensors only, keyed by logical path with ``/`` replaced by ``.``
      (``model.layer1.weight``); streamed under the memory budget whatever the tensors' sizes.
      With ``max_shard_bytes``, ``dst`` is a directory in Hugging Face's layout.
    * ``to="dcp"``: a ``torch.distributed.checkpoint`` directory that ``dcp.load`` reads in one
      process; sharded tensors keep their shards.
    * ``to="safetensors", config=...``: a directory that transformers' ``from_pretrained(dst)``
      loads: ``config.json`` and the weights as ``save_pretrained`` lays them out (tied copies
      left out where the config's model class ties them; ``docs/huggingface.md``).

    The export sees what rank 0 restores: its own state, the replicated state and every sharded
    tensor (assembled whole for ``torch`` and ``safetensors``). Every piece's checksum is verified.

    Args:
        src: the snapshot: a directory or a storage URI, as for :class:`~snapshotkit.Snapshot`.
        dst: a local path that does not exist yet; its directory must exist.
        to: ``"torch"``, ``"safetensors"`` or ``"dcp"``.
        select: glob pattern(s) over logical paths, matched like ``Snapshot.take(include=...)``
            (``"model/**"``; ``*`` also matches ``/``): export only the leaves matching one. For
            ``torch`` and ``dcp`` a list or tuple is exported whole or not at all.
        strip_prefix: removed from the start of every selected logical path; a selected path
            without it is an error. For ``safetensors`` any prefix (``"model/"``); for ``torch`` and
            ``dcp`` a container's logical path and ``/``, whose content becomes the output.
        max_shard_bytes: ``safetensors`` only: the largest file; ``dst`` becomes a directory of
            ``model.safetensors`` or of ``model-00001-of-0000N.safetensors``... and
            ``model.safetensors.index.json``.
        storage_options: passed to the storage plugin of ``src``.
        memory_budget_bytes: host bytes the export may hold in read buffers at once (default as
            for restore). ``safetensors`` stays within it; ``torch`` and ``dcp`` also hold one
            tensor at a time when a tensor is larger (a sharded tensor assembled, for ``torch``).
        weights_only: load pickled objects as restore does, with ``torch.load(weights_only=True)``;
            an object that does not load is skipped (listed in the report). ``False`` only for
            snapshots you trust.
        progress: show a bar of the bytes read on stderr (bytes done and rate: the total is not
            known up front), once the export has run 2 s.
        config: ``safetensors`` only: the model's transformers config (a ``PretrainedConfig`` such
            as ``model.config``, a dict with ``model_type``, or the path of a ``config.json``).
            ``dst`` becomes a directory ``from_pretrained`` loads: ``config.json`` (the object's
            ``to_json_string()``, the dict as JSON, the file copied) and ``model.safetensors``, or
            the shards and index above ``max_shard_bytes``. A weight stored tied to another (one
            stored tensor) is left out, as ``save_pretrained`` does, when the class the config's
            ``architectures`` names ties it (``_tied_weights_keys`` with ``tie_word_embeddings``);
            ``from_pretrained`` ties it back. The keys must be the model's parameter names: pass
            ``strip_prefix`` (and ``select``) for a model inside a larger app state.

    Returns:
        An :class:`ExportReport`.

    Raises:
        InvalidArgumentError: an argument of the wrong type (a ``config`` that is no config, dict or
            path; a dict config with values JSON cannot hold).
        ConfigError: an unknown format; ``config`` without ``to="safetensors"``, naming no file,
            or without ``model_type``; with ``config``, no ``strip_prefix`` while every selected
            path lies under one ``app_state`` name; ``select`` matches nothing; ``strip_prefix`` is missing
            from a selected path (or, for ``torch``/``dcp``, names no container); two paths give
            one safetensors key; no selected tensor fits the format; ``max_shard_bytes`` without
            ``to="safetensors"``; ``dst`` is not a local path in an existing directory.
        ExportExistsError: ``dst`` exists (it is never overwritten).
        SnapshotNotFoundError, ManifestError, IntegrityError, StorageError: as for restore; the
            export then leaves no output.
    """
    target = _check_format(to)
    patterns = _check_select(select)
    _check_strip_prefix(strip_prefix)
    _check_max_shard_bytes(max_shard_bytes, target)
    model_config = _to_transformers.check_config(config, target)
    if not isinstance(weights_only, bool):
        raise InvalidArgumentError(f"weights_only must be True or False, got {type(weights_only).__name__}")
    check_progress(progress, "export_snapshot")
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise InvalidArgumentError(f"storage_options must be a mapping, got {type(storage_options).__name__}")
    source_path = snapshot_path(src)
    output = _check_dst(dst)
    config = Config.resolve(memory_budget_bytes=memory_budget_bytes)
    _refuse_existing(output)
    source = Source(source_path, storage_options or {}, config, weights_only)
    source.progress = ByteProgress(f"exporting {source_path}", enabled=progress)
    try:
        written = _export(target, source, output, patterns, strip_prefix, max_shard_bytes, model_config)
    except BaseException as exc:
        drop_frames(exc)  # buffers of a failed read go now, not at the next collection
        with contextlib.suppress(Exception):
            source.close()
        raise
    finally:
        source.progress.close()
    source.close()
    files = _files_of(output)
    skipped = tuple(sorted(written.skipped.items()))
    return ExportReport(target, tuple(map(str, files)), written.tensors, sum(f.stat().st_size for f in files), skipped)


def _export(
    target: str,
    source: Source,
    output: Path,
    patterns: tuple[str, ...] | None,
    strip_prefix: str | None,
    max_shard_bytes: int | None,
    model_config: _to_transformers.ModelConfig | None = None,
) -> Written:
    if target == "safetensors":
        selected = select_flat(source.view, patterns, strip_prefix, source.path)
        if model_config is None:
            plan = _to_safetensors.plan(selected, strip_prefix, max_shard_bytes)
            return _staged(output, lambda out: plan.write(source, out), directory=plan.directory)
        return _for_transformers(source, output, selected, strip_prefix, max_shard_bytes, model_config)
    tree, lost = select_tree(source.view, patterns, strip_prefix, source.path)
    if target == "torch":
        written = _staged(output, lambda out: _to_torch.write(source, tree, out), directory=False)
    else:
        from snapshotkit.convert import _to_dcp  # imports torch.distributed.checkpoint: only when asked for

        _to_dcp.check(tree)
        written = _staged(output, lambda out: _to_dcp.write(source, tree, out, output), directory=True)
    return Written(written.tensors, {**lost, **written.skipped})


def _for_transformers(
    source: Source,
    output: Path,
    selected: dict[str, Entry],
    strip_prefix: str | None,
    max_shard_bytes: int | None,
    model_config: _to_transformers.ModelConfig,
) -> Written:
    """A directory ``from_pretrained`` loads: the weights (less tied copies) and ``config.json``."""
    _to_transformers.check_keys(selected, strip_prefix)
    tied = _to_transformers.tied_copies(selected, strip_prefix, model_config)
    kept = {path: entry for path, entry in selected.items() if path not in tied}
    plan = _to_safetensors.plan(kept, strip_prefix, max_shard_bytes, directory=True)

    def write(out: Path) -> Written:
        written = plan.write(source, out)
        _to_transformers.write_config(model_config, out)
        fsync_path(out)
        return written

    written = _staged(output, write, directory=True)
    return Written(written.tensors, {**written.skipped, **tied})


def _staged(output: Path, write: Any, *, directory: bool) -> Written:
    """Run ``write(path)`` on a temporary path next to ``output``, then move the result to ``output``."""
    staging = output.parent / f".{output.name}.export-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        result: Written = write(staging / output.name)
        _move_into_place(staging / output.name, output, directory=directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    fsync_path(output.parent)
    return result


def _move_into_place(written: Path, output: Path, *, directory: bool) -> None:
    """``written`` -> ``output``, never replacing anything there."""
    if not directory:
        try:
            os.link(written, output)  # atomic, and fails if the name is taken
            return
        except FileExistsError:
            raise _exists(output) from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
    # No atomic "rename unless taken" here: check, then rename (rename onto an existing file or
    # empty directory would replace it).
    _refuse_existing(output)
    os.rename(written, output)


def _files_of(output: Path) -> list[Path]:
    if not output.is_dir():
        return [output]
    return sorted(Path(root, name) for root, _, names in os.walk(output) for name in names)


def _exists(output: Path) -> ExportExistsError:
    what = "directory" if output.is_dir() else "file"
    problem = f"the export destination {str(output)!r} already exists (a {what}); an export never overwrites"
    error = ExportExistsError(f"{problem}. Choose another dst")
    return error.advised(Advice(problem, "new_destination", (str(output),)))


def _refuse_existing(output: Path) -> None:
    if os.path.lexists(output):
        raise _exists(output)


def _check_format(to: object) -> str:
    if not isinstance(to, str):
        raise InvalidArgumentError(f"to= names the output format as a str, one of {list(FORMATS)}, got {to!r}")
    if to not in FORMATS:
        raise ConfigError(f"to={to!r} is not a format export_snapshot writes; choose one of {list(FORMATS)}")
    return to


def _check_select(select: object) -> tuple[str, ...] | None:
    if select is None:
        return None
    if isinstance(select, str):
        return (select,)
    if isinstance(select, bytes) or not isinstance(select, Sequence):
        raise InvalidArgumentError(
            f"select= takes a glob pattern over logical paths or a list of them (e.g. 'model/**'), got "
            f"{type(select).__name__} {select!r}"
        )
    for pattern in select:
        if not isinstance(pattern, str):
            raise InvalidArgumentError(
                f"select= patterns must be str globs over logical paths (e.g. 'model/**'), got "
                f"{type(pattern).__name__} {pattern!r}"
            )
    if not select:
        raise ConfigError("select=[] selects nothing; pass None to export everything, or patterns such as 'model/**'")
    return tuple(select)


def _check_strip_prefix(strip_prefix: object) -> None:
    if strip_prefix is None:
        return
    if not isinstance(strip_prefix, str):
        raise InvalidArgumentError(
            f"strip_prefix must be a str (e.g. 'model/'), got {type(strip_prefix).__name__} {strip_prefix!r}"
        )
    if not strip_prefix:
        raise ConfigError("strip_prefix='' strips nothing; pass None, or a prefix such as 'model/'")


def _check_max_shard_bytes(max_shard_bytes: object, target: str) -> None:
    if max_shard_bytes is None:
        return
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int):
        raise InvalidArgumentError(
            f"max_shard_bytes must be an int (bytes, e.g. 5 * 2**30), got {type(max_shard_bytes).__name__}"
        )
    if max_shard_bytes <= 0:
        raise ConfigError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    if target != "safetensors":
        raise ConfigError(
            f"max_shard_bytes splits safetensors exports only, not to={target!r}; drop it or export to='safetensors'"
        )


def _check_dst(dst: object) -> Path:
    text = os.fspath(dst) if isinstance(dst, os.PathLike) else dst
    if not isinstance(text, str):
        raise InvalidArgumentError(f"dst must be a local path (str or os.PathLike), got {type(dst).__name__} {dst!r}")
    if not text.strip():
        raise ConfigError(f"dst={text!r} names no path; pass a local file or directory path that does not exist yet")
    if "://" in text:
        raise ConfigError(
            f"dst={text!r} is a URI; export writes to a local path only. Export locally, then upload the result"
        )
    output = Path(os.path.expanduser(text)).absolute()
    if not output.parent.is_dir():
        raise ConfigError(
            f"the directory of dst={text!r}, {str(output.parent)!r}, does not exist; create it first "
            "(an export creates only dst itself)"
        )
    return output
