"""Export for transformers' ``from_pretrained``: ``config.json`` beside the safetensors weights.

``export_snapshot(..., to="safetensors", config=...)`` writes a directory that
``AutoModel*.from_pretrained(dst)`` loads: ``config.json`` and ``model.safetensors`` (or the
shards ``model-0000k-of-0000N.safetensors`` and ``model.safetensors.index.json`` above
``max_shard_bytes``), each file's header carrying ``{"format": "pt"}`` as ``save_pretrained``
writes it (``from_pretrained`` refuses other formats).

Tied weights. A snapshot stores tied tensors once: their entries share every piece. ``safetensors``
cannot alias, so ``save_pretrained`` (``transformers/modeling_utils.py``,
``remove_tied_weights_from_state_dict``) leaves out each tied *target* of the model class's
``_tied_weights_keys`` (``{"lm_head.weight": "transformer.wte.weight"}`` for GPT-2) when the
config ties them (``tie_word_embeddings``), and ``from_pretrained`` ties the missing target back to
its source. The export does the same where it can tell: a key is left out only when the config's
``architectures`` name a transformers class whose ``_tied_weights_keys`` map it to a source key of
the same stored tensor, and the config ties word embeddings. Otherwise both keys are written (the
bytes twice), which ``from_pretrained`` also loads right: it ties two present keys the mapping names
when their values are equal, and keeps them apart when the config does not tie them.

Only this module touches transformers, and only to read the tied-weights mapping (a missing
transformers, or a model type it does not know, means both keys are written); the config argument
itself is checked and written without it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from snapshotkit._format.entries import Entry, TensorEntry
from snapshotkit._format.serialization import RAW
from snapshotkit._plan.flatten import unescape_key
from snapshotkit._runtime.filewrite import pwrite_all
from snapshotkit.convert._export_source import Skipped
from snapshotkit.convert._to_safetensors import key_of
from snapshotkit.errors import Advice, ConfigError, InvalidArgumentError

CONFIG_FILE_NAME = "config.json"
#: A ``_tied_weights_keys`` name that is a parameter name, not a pattern (transformers' own test).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.]+")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The ``config`` argument of an export, checked before anything is read or written.

    Attributes:
        text: ``config.json`` as it is written (a path's bytes decoded as they are).
        data: the parsed JSON object.
        source: the transformers config object given, else None.
    """

    text: str
    data: Mapping[str, Any]
    source: Any = None


def check_config(config: object, target: str) -> ModelConfig | None:
    """Resolve ``config=`` (a transformers config object, a dict, or the path of a ``config.json``).

    Raises:
        InvalidArgumentError: ``config`` is none of those, or a dict that is not JSON-serializable.
        ConfigError: ``to`` is not ``"safetensors"``; the path names no file or no JSON object; the
            config has no ``model_type``.
    """
    if config is None:
        return None
    if target != "safetensors":
        raise ConfigError(
            f"config= writes a directory transformers' from_pretrained loads, which holds safetensors weights, not "
            f"to={target!r}; drop config or export to='safetensors'"
        )
    if isinstance(config, Mapping):
        try:
            text = json.dumps(dict(config), indent=2, sort_keys=True, allow_nan=False) + "\n"
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"config= as a dict must hold JSON values only (it is written as config.json), but {exc}; convert "
                "the values, or pass the transformers config object"
            ) from exc
        return ModelConfig(text, _with_model_type(json.loads(text), "the config dict"))
    if isinstance(config, (str, os.PathLike)):
        return _from_file(Path(os.fspath(config)).expanduser())
    if callable(getattr(config, "to_json_string", None)) and callable(getattr(config, "to_dict", None)):
        source: Any = config
        text = source.to_json_string(use_diff=True)  # what PretrainedConfig.save_pretrained writes
        data = json.loads(text)
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"config.to_json_string() gave no JSON object: {type(config).__name__}")
        return ModelConfig(text, _with_model_type(data, f"the {type(config).__name__} given"), config)
    raise InvalidArgumentError(
        f"config= takes a transformers config object (e.g. model.config), a dict, or the path of a config.json, got "
        f"{type(config).__name__}"
    )


def _from_file(path: Path) -> ModelConfig:
    if path.is_dir() and (path / CONFIG_FILE_NAME).is_file():
        path = path / CONFIG_FILE_NAME
    if not path.is_file():
        raise ConfigError(f"the config {str(path)!r} is not a file; give the path of a config.json")
    try:
        text = path.read_bytes().decode("utf-8")  # no newline translation: copied byte for byte
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            f"the config {str(path)!r} does not read as JSON ({exc}); give the path of a config.json"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"the config {str(path)!r} holds a JSON {type(data).__name__}, not the object of a config.json"
        )
    return ModelConfig(text, _with_model_type(data, f"the config {str(path)!r}"))


def _with_model_type(data: dict[str, Any], what: str) -> dict[str, Any]:
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(
            f"{what} has no model_type, which AutoModel and AutoConfig need to pick the model class; use the "
            'model\'s own config (e.g. model.config, a GPT2Config) or add "model_type" (e.g. "gpt2")'
        )
    return data


def check_keys(selected: Mapping[str, Entry], strip_prefix: str | None) -> None:
    """Refuse the mistake of a snapshot's ``app_state`` name left in every key.

    Without ``strip_prefix``, a key starts with the ``app_state`` name its tensor was taken under
    (``model.transformer.wte.weight`` for ``{"model": model}``), which no model's parameters do:
    ``from_pretrained`` would load none of the weights. Architectures are not checked further.

    Raises:
        ConfigError: no ``strip_prefix``, and every selected path lies under one ``app_state`` name.
    """
    if strip_prefix is not None:
        return
    names = {path.split("/", 1)[0] for path in selected}
    if len(names) == 1 and all("/" in path for path in selected):
        (name,) = names
        problem = (
            f"every selected logical path lies under the app_state name {unescape_key(name)!r}, so every weight's "
            f"key would start with {unescape_key(name) + '.'!r} and from_pretrained would load none of them"
        )
        error = ConfigError(
            f"{problem}; pass strip_prefix={name + '/'!r} (and select={name + '/**'!r} for one model of several)"
        )
        raise error.advised(Advice(problem, "strip_the_name", (name + "/",)))


def tied_copies(selected: Mapping[str, Entry], strip_prefix: str | None, config: ModelConfig) -> Skipped:
    """The selected logical paths ``save_pretrained`` would leave out as tied copies, with the reason.

    A path is left out when its tensor is stored as the same pieces as another selected path's
    (tied in the snapshot) and the model class the config names ties the first key to the second.
    """
    groups: dict[Any, list[str]] = {}
    for path, entry in selected.items():
        if isinstance(entry, TensorEntry) and entry.serializer == RAW and entry.nbytes:
            stored = (entry.dtype, entry.shape, tuple((p.address, p.byte_range) for p in entry.pieces))
            groups.setdefault(stored, []).append(path)
    tied = [paths for paths in groups.values() if len(paths) > 1]
    if not tied:
        return {}
    mapping = _tied_weights_keys(config)
    dropped: Skipped = {}
    for paths in tied:
        by_key = {key_of(path, strip_prefix): path for path in paths}
        for target, source in mapping.items():
            if target in by_key and source in by_key and by_key[source] not in dropped:
                dropped[by_key[target]] = (
                    f"tied to {by_key[source]!r}: left out as save_pretrained does; from_pretrained ties it back"
                )
    return dropped


def _tied_weights_keys(config: ModelConfig) -> dict[str, str]:
    """``{target: source}`` of the parameters the config's model class ties (plain names only), or
    ``{}`` when transformers cannot tell (not installed, an unknown model type or class)."""
    try:
        transformers: Any = importlib.import_module("transformers")
    except Exception:  # not installed, or broken: the mapping is not known, both keys are written
        return {}
    architectures = config.data.get("architectures")
    if not isinstance(architectures, Sequence) or isinstance(architectures, str) or len(architectures) != 1:
        return {}
    with warnings.catch_warnings():  # only the defaults of the config class are wanted here
        warnings.simplefilter("ignore")
        try:
            model_config = config.source
            if model_config is None:
                fields = {k: v for k, v in config.data.items() if k != "model_type"}
                model_config = transformers.AutoConfig.for_model(config.data["model_type"], **fields)
            model_class = getattr(transformers, str(architectures[0]))
        except Exception:  # any failure only means "not known": both keys are written
            return {}
    if not getattr(model_config, "tie_word_embeddings", False):  # as get_expanded_tied_weights_keys decides
        return {}
    mapping = getattr(model_class, "_tied_weights_keys", None)
    if not isinstance(mapping, Mapping):
        return {}
    return {
        str(target): str(source)
        for target, source in mapping.items()
        if _PLAIN_NAME.fullmatch(str(target)) and _PLAIN_NAME.fullmatch(str(source))
    }


def write_config(config: ModelConfig, directory: Path) -> None:
    """Write ``config.json`` into the export's (staging) directory, durably."""
    fd = os.open(directory / CONFIG_FILE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, config.text.encode("utf-8"), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
