"""``export_snapshot(..., config=...)``: the directory loads with transformers' own ``from_pretrained``.

A small GPT-2 built from a config (nothing downloaded: the Hub is off for this module) is taken
as ``{"model": model}``, exported, and loaded with ``AutoModelForCausalLM`` and
``GPT2LMHeadModel``: every weight equals the snapshot's, the logits on a fixed input are equal,
and tied weights are tied again (untied ones stay apart). Plus shards with their index, the three
forms of ``config``, the command line, and argument errors that write nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub reads it: never reach the Hub

import huggingface_hub.constants
import pytest
import safetensors
import torch
from click.testing import CliRunner, Result

from snapshotkit import Snapshot, StateDict
from snapshotkit.cli import main
from snapshotkit.convert import export_snapshot
from snapshotkit.errors import ConfigError, InvalidArgumentError

transformers = pytest.importorskip("transformers", reason="the export for from_pretrained is tested with transformers")

pytestmark = pytest.mark.usefixtures("clean_env")

#: The fixed input the logits are compared on.
TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]])


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here may reach the Hub, whichever module imported huggingface_hub first."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _gpt2(*, tie: bool = True, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=64,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def _take(tmp_path: Path, model: Any, **extra: Any) -> Path:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"model": model, **extra})
    return path


def _keys_in(directory: Path) -> dict[str, str]:
    """Every tensor key of the directory's safetensors files -> its file; and every header is ``format: pt``."""
    keys: dict[str, str] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safetensors.safe_open(str(file), framework="pt") as opened:
            assert opened.metadata() == {"format": "pt"}, file.name
            for key in opened.keys():  # noqa: SIM118 - safe_open is no mapping
                assert key not in keys, key
                keys[key] = file.name
    return keys


def _assert_loads_equal(directory: Path, model: Any, loader: Any, *, tied: bool) -> Any:
    """``loader.from_pretrained(directory)`` equals ``model``: every weight, the logits, the tying."""
    loaded = loader.from_pretrained(str(directory)).eval()
    assert type(loaded) is type(model)
    want, got = model.state_dict(), loaded.state_dict()
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype, key
        assert torch.equal(got[key], tensor), key
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS).logits, model(TOKENS).logits)
    assert (loaded.lm_head.weight is loaded.transformer.wte.weight) is tied
    if not tied:
        assert not torch.equal(loaded.lm_head.weight, loaded.transformer.wte.weight)
    return loaded


def _snapshot_weights(path: Path, *, tie: bool) -> dict[str, torch.Tensor]:
    """The weights as the snapshot holds them (restored into a fresh model of another seed)."""
    fresh = _gpt2(tie=tie, seed=1)
    Snapshot(str(path)).restore({"model": fresh})
    return fresh.state_dict()


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("loader", ["AutoModelForCausalLM", "GPT2LMHeadModel"])
def test_from_pretrained_loads_the_snapshot(tmp_path: Path, tie: bool, loader: str) -> None:
    model = _gpt2(tie=tie)
    assert (model.lm_head.weight is model.transformer.wte.weight) is tie
    snap = _take(tmp_path, model)
    out = tmp_path / "hf"
    report = export_snapshot(snap, out, to="safetensors", strip_prefix="model/", config=model.config)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert report.files == (str(out / "config.json"), str(out / "model.safetensors"))
    assert json.loads((out / "config.json").read_text()) == json.loads(model.config.to_json_string())
    # model.config names no architectures (a model built from its config): both keys are written,
    # and from_pretrained ties two equal keys the model ties.
    assert sorted(_keys_in(out)) == sorted(model.state_dict())
    assert report.tensors_written == len(model.state_dict())
    assert report.skipped == ()
    loaded = _assert_loads_equal(out, model, getattr(transformers, loader), tied=tie)
    snapshot_weights = _snapshot_weights(snap, tie=tie)
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, snapshot_weights[key]), key


@pytest.mark.parametrize("form", ["dict", "path", "directory"])
def test_a_config_naming_its_class_leaves_the_tied_copy_out(tmp_path: Path, form: str) -> None:
    """As save_pretrained writes it: config.architectures names GPT2LMHeadModel, which ties
    lm_head.weight to transformer.wte.weight, so lm_head.weight is not written."""
    model = _gpt2()
    snap = _take(tmp_path, model)
    model.config.architectures = ["GPT2LMHeadModel"]
    saved = tmp_path / "saved"
    model.config.save_pretrained(str(saved))
    if form == "path":  # copied byte for byte, whatever its line ends
        (saved / "config.json").write_bytes((saved / "config.json").read_bytes().replace(b"\n", b"\r\n"))
    config: Any = {
        "dict": json.loads((saved / "config.json").read_text()),
        "path": saved / "config.json",
        "directory": str(saved),
    }[form]
    out = tmp_path / "hf"
    report = export_snapshot(snap, out, to="safetensors", strip_prefix="model/", config=config)
    assert "lm_head.weight" not in _keys_in(out)
    assert sorted(_keys_in(out)) == sorted(k for k in model.state_dict() if k != "lm_head.weight")
    assert dict(report.skipped).keys() == {"model/lm_head.weight"}
    assert "model/transformer.wte.weight" in dict(report.skipped)["model/lm_head.weight"]
    if form == "dict":
        assert json.loads((out / "config.json").read_text()) == config
    else:  # a file is copied as it is
        assert (out / "config.json").read_bytes() == (saved / "config.json").read_bytes()
    _assert_loads_equal(out, model, transformers.AutoModelForCausalLM, tied=True)


def test_an_untied_config_keeps_both_keys_even_for_tied_tensors(tmp_path: Path) -> None:
    """The snapshot's tensors are tied but the config says not to tie: both keys are written, so
    from_pretrained (which then ties nothing) still loads both values."""
    model = _gpt2(tie=True)
    snap = _take(tmp_path, model)
    config = {**model.config.to_dict(), "architectures": ["GPT2LMHeadModel"], "tie_word_embeddings": False}
    out = tmp_path / "hf"
    report = export_snapshot(snap, out, to="safetensors", strip_prefix="model/", config=config)
    assert "lm_head.weight" in _keys_in(out)
    assert report.skipped == ()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert loaded.lm_head.weight is not loaded.transformer.wte.weight
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_shards_and_their_index_load(tmp_path: Path, tie: bool) -> None:
    model = _gpt2(tie=tie)
    model.config.architectures = ["GPT2LMHeadModel"]
    snap = _take(tmp_path, model)
    out = tmp_path / "hf"
    largest = max(t.numel() * t.element_size() for t in model.state_dict().values())
    report = export_snapshot(
        snap, out, to="safetensors", strip_prefix="model/", config=model.config, max_shard_bytes=largest
    )
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    count = len(shards)
    assert count >= 3
    assert shards == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    assert sorted(p.name for p in out.iterdir()) == sorted(["config.json", "model.safetensors.index.json", *shards])
    index = json.loads((out / "model.safetensors.index.json").read_text())
    keys = _keys_in(out)
    assert index["weight_map"] == keys
    written = {k: t for k, t in model.state_dict().items() if k in keys}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in written.values())
    assert ("lm_head.weight" in keys) is not tie
    assert report.tensors_written == len(keys)
    _assert_loads_equal(out, model, transformers.AutoModelForCausalLM, tied=tie)


def test_a_model_inside_a_larger_app_state(tmp_path: Path) -> None:
    model = _gpt2()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(TOKENS, labels=TOKENS).loss.backward()
    optim.step()
    snap = _take(tmp_path, model, optim=optim, progress=StateDict(step=1))
    out = tmp_path / "hf"
    export_snapshot(snap, out, to="safetensors", select="model/**", strip_prefix="model/", config=model.config)
    _assert_loads_equal(out, model, transformers.GPT2LMHeadModel, tied=True)
    # Forgetting strip_prefix is refused before anything is written: no key would match the model.
    with pytest.raises(ConfigError, match=r"strip_prefix='model/'") as caught:
        export_snapshot(snap, tmp_path / "again", to="safetensors", select="model/**", config=model.config)
    assert caught.value.advice is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "snap"]


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, [*args], catch_exceptions=False, env={"COLUMNS": "160"})


def test_the_command_line_writes_what_from_pretrained_loads(tmp_path: Path) -> None:
    model = _gpt2()
    model.config.architectures = ["GPT2LMHeadModel"]
    model.config.save_pretrained(str(tmp_path / "saved"))
    snap = _take(tmp_path, model, progress=StateDict(step=1))
    out = tmp_path / "hf"
    config = str(tmp_path / "saved" / "config.json")
    args = ["export", str(snap), str(out), "--to", "safetensors", "--select", "model/**", "--strip-prefix", "model/"]
    result = _invoke(*args, "--config", config, "--max-shard-bytes", "40000")
    assert result.exit_code == 0, result.stderr
    assert "model.safetensors.index.json" in os.listdir(out)
    assert "skipped 1 value (tied to 'model/transformer.wte.weight': left out as save_pretrained does" in result.stdout
    _assert_loads_equal(out, model, transformers.AutoModelForCausalLM, tied=True)

    before = sorted(p.name for p in tmp_path.iterdir())
    forgot = _invoke(
        "export", str(snap), str(tmp_path / "x"), "--to", "safetensors", "--select", "model/**", "--config", config
    )
    assert forgot.exit_code == 2
    assert "pass --strip-prefix model/ (and --select 'model/**'" in forgot.stderr
    wrong_format = _invoke("export", str(snap), str(tmp_path / "x.pt"), "--to", "torch", "--config", config)
    assert wrong_format.exit_code == 2
    assert "--config" in wrong_format.stderr
    assert "--to safetensors" in wrong_format.stderr
    missing = _invoke(*args[:2], str(tmp_path / "x"), *args[3:], "--config", str(tmp_path / "nothing.json"))
    assert missing.exit_code == 2
    assert "'--config'" in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


class _NotAConfig:
    model_type = "gpt2"


@pytest.mark.parametrize(
    ("to", "config", "error", "match"),
    [
        ("safetensors", 42, InvalidArgumentError, "config= takes a transformers config object"),
        ("safetensors", ["gpt2"], InvalidArgumentError, "got list"),
        ("safetensors", _NotAConfig(), InvalidArgumentError, "got _NotAConfig"),
        ("safetensors", {"model_type": "gpt2", "w": torch.zeros(1)}, InvalidArgumentError, "JSON values only"),
        ("safetensors", {"model_type": "gpt2", "x": float("nan")}, InvalidArgumentError, "JSON values only"),
        ("safetensors", {"n_layer": 2}, ConfigError, "has no model_type"),
        ("safetensors", "missing.json", ConfigError, "is not a file"),
        ("safetensors", "not-json.json", ConfigError, "does not read as JSON"),
        ("safetensors", "list.json", ConfigError, "holds a JSON list"),
        ("safetensors", "untyped.json", ConfigError, "has no model_type"),
        ("torch", "model", ConfigError, "not to='torch'"),
        ("dcp", "model", ConfigError, "not to='dcp'"),
    ],
)
def test_argument_errors_write_nothing(tmp_path: Path, to: str, config: Any, error: type, match: str) -> None:
    model = _gpt2()
    snap = _take(tmp_path, model)
    files = tmp_path / "files"
    files.mkdir()
    (files / "not-json.json").write_text("{model_type: gpt2")
    (files / "list.json").write_text("[]")
    (files / "untyped.json").write_text('{"n_layer": 2}')
    if config == "model":
        config = model.config
    elif isinstance(config, str):
        config = files / config
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(error, match=match):
        export_snapshot(snap, tmp_path / "out", to=to, strip_prefix="model/", config=config)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_without_transformers_both_keys_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export itself needs no transformers: where it cannot be imported, the tied-weights
    mapping is unknown and both keys are written, which from_pretrained ties again."""
    model = _gpt2()
    snap = _take(tmp_path, model)
    config = {**model.config.to_dict(), "architectures": ["GPT2LMHeadModel"]}
    out = tmp_path / "hf"
    with monkeypatch.context() as blocked:
        blocked.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
        report = export_snapshot(snap, out, to="safetensors", strip_prefix="model/", config=config)
    assert report.skipped == ()
    assert sorted(_keys_in(out)) == sorted(model.state_dict())
    _assert_loads_equal(out, model, transformers.AutoModelForCausalLM, tied=True)
