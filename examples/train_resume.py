"""Crash-and-resume demo: a resumed training run is bit-for-bit identical to an uninterrupted one.

A tiny 2-layer transformer language model (tied input/output embedding, dropout, AdamW, warmup +
cosine LR schedule) is trained on tokens sampled from a fixed random Markov chain. The script runs
itself three times, each in a fresh process:

  A  an uninterrupted run of --steps steps, logging every loss as ``float.hex()``;
  B  the same run under a ``SnapshotManager`` (keep the last 3, save every --snapshot-every steps
     with ``async_take``), which crashes after step --crash-at: it saves once more and dies
     (``os._exit``) after that snapshot's data is written, before its commit;
  C  a fresh process whose ``SnapshotManager`` removes the incomplete snapshot and whose
     ``restore_latest`` restores model, optimizer, scheduler, data-stream generator, global RNGs
     and progress counter from the newest committed one, then trains to --steps.

The parent then checks that every loss after the resume point equals run A's exactly, that the final
weights are identical, and reads single weights back from the snapshot with a small memory budget.

    python examples/train_resume.py [--workdir DIR | --keep] [--steps 60] [--snapshot-every 10] [--crash-at 35]

Without --workdir it works in a new temporary directory and removes it at the end (--keep keeps it).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

try:
    import snapshotkit  # noqa: F401
except ImportError:  # running from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from snapshotkit import RNGState, Snapshot, SnapshotManager, StateDict, events

VOCAB, D_MODEL, N_HEAD, D_FF, N_LAYERS, MAX_LEN, BATCH, DROPOUT = 128, 64, 4, 256, 2, 32, 16, 0.1
CRASH_EXIT_CODE = 75  # what phase B "dies" with
READ_BUDGET = 64 << 10  # memory budget for Snapshot.read_object
READ_KEYS = ("layers.0.self_attn.in_proj_weight", "head.weight")  # head.weight is tied to tok_emb


class TinyLM(nn.Module):
    """Causal transformer LM whose output projection shares its weight with the token embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, D_MODEL)
        self.pos_emb = nn.Embedding(MAX_LEN, D_MODEL)
        self.drop = nn.Dropout(DROPOUT)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, N_HEAD, D_FF, DROPOUT, batch_first=True, norm_first=True)
            for _ in range(N_LAYERS)
        )
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.head.weight = self.tok_emb.weight  # tied: one storage, two state_dict keys
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(torch.arange(t)))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


class MarkovStream:
    """Batches of token sequences from a fixed sparse Markov chain ("grammar").

    Randomness deliberately comes from four sources, so an exact resume needs all of them restored:
    the stream's own torch.Generator (a Stateful, via state_dict/load_state_dict), NumPy's global RNG
    (start tokens), Python's ``random`` (sequence length) and, in the model, torch's global RNG (dropout).
    """

    def __init__(self, seed: int) -> None:
        grammar = torch.Generator().manual_seed(1234)  # the same chain for every run
        successors = torch.randint(VOCAB, (VOCAB, 4), generator=grammar)
        weights = torch.rand(VOCAB, 4, generator=grammar) + 0.1
        probs = torch.zeros(VOCAB, VOCAB).scatter_add_(1, successors, weights)
        self.transitions = probs / probs.sum(dim=1, keepdim=True)
        self.gen = torch.Generator().manual_seed(seed + 1)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        length = random.choice((24, 28, MAX_LEN))
        tokens = [torch.from_numpy(np.random.randint(VOCAB, size=BATCH)).long()]
        for _ in range(length):
            nxt = torch.multinomial(self.transitions[tokens[-1]], 1, generator=self.gen).squeeze(1)
            tokens.append(nxt)
        seq = torch.stack(tokens, dim=1)
        return seq[:, :-1], seq[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.gen.get_state()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.gen.set_state(sd["generator"])


def build(
    seed: int, total_steps: int
) -> tuple[TinyLM, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR, MarkovStream]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = TinyLM()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, total_steps // 10)

    def lr_factor(step: int) -> float:  # linear warmup, then cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_factor)
    return model, optim, sched, MarkovStream(seed)


def train_step(model: TinyLM, optim: torch.optim.Optimizer, sched: Any, data: MarkovStream) -> float:
    inputs, targets = data.next_batch()
    loss = F.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))
    optim.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    sched.step()
    return loss.item()


def run_phase(args: argparse.Namespace) -> None:
    phase, workdir = args.phase, Path(args.workdir)
    snapdir = workdir / "snapshots"

    def log(msg: str) -> None:
        print(f"[{phase}] {msg}", flush=True)

    # snapshotkit logs one INFO line per committed take and restore, and each snapshot it deletes
    logging.basicConfig(level=logging.INFO, format=f"[{phase}] %(name)s: %(message)s", stream=sys.stdout)

    model, optim, sched, data = build(args.seed, args.steps)
    progress = StateDict(step=0)
    app_state = {"model": model, "optim": optim, "sched": sched, "data": data, "rng": RNGState(), "progress": progress}
    result: dict[str, Any] = {"resumed_from": 0, "losses": {}}
    start = 0
    # Phase A never saves; B and C save through the manager (which also watches for SIGTERM).
    mgr = SnapshotManager(snapdir, keep_last=3, save_interval_steps=args.snapshot_every) if phase != "A" else None
    if phase == "C":
        assert mgr is not None
        t0 = time.perf_counter()
        restored = mgr.restore_latest(app_state)
        if restored is None:
            log(f"no committed snapshot in {snapdir}")
            sys.exit(2)
        start = int(progress["step"])
        assert start == restored, f"progress says step {start}, the manager restored step {restored}"
        assert model.head.weight is model.tok_emb.weight, "weight tying lost on restore"
        log(f"restored step {restored} in {time.perf_counter() - t0:.2f}s (snapshots now: {mgr.steps()})")
        result.update(resumed_from=start, snapshot=mgr.snapshot_path(restored))
    else:
        log(f"training from scratch, seed {args.seed}")

    model.train()
    for step in range(start + 1, args.steps + 1):
        loss = train_step(model, optim, sched, data)
        progress["step"] = step
        result["losses"][str(step)] = loss.hex()
        if step % 10 == 0 or step == args.steps:
            log(f"step {step:3d}  loss {loss:.4f}  lr {sched.get_last_lr()[0]:.2e}")
        if phase == "B" and step == args.crash_at:
            # The process dies in the middle of this step's save: flush the loss log (so the parent
            # can compare it), then exit abruptly once the data is written, before the commit.
            assert mgr is not None
            (workdir / "losses_B.json").write_text(json.dumps(result))
            log(f"step {step}: crashing while {mgr.snapshot_path(step)} is being written")
            events.subscribe(lambda event: os._exit(CRASH_EXIT_CODE) if event.kind == "take_staged" else None)
            mgr.save(step, app_state)
        if mgr is not None and mgr.should_save(step):
            t0 = time.perf_counter()
            mgr.save(step, app_state, metrics={"loss": loss}, async_take=True)
            log(f"snapshot of step {step} staged in {time.perf_counter() - t0:.2f}s, written in the background")
    if mgr is not None:
        if phase == "C" and args.steps % args.snapshot_every:
            mgr.save(args.steps, app_state)  # the final state, for the read-back below
        mgr.close()  # the last save is committed, retention applied
        log(f"snapshots kept: {mgr.steps()}")
    (workdir / f"losses_{phase}.json").write_text(json.dumps(result))
    torch.save(model.state_dict(), workdir / f"final_{phase}.pt")


def first_mismatch(ref: dict[str, str], got: dict[str, str], steps: range) -> str | None:
    for s in steps:
        if ref.get(str(s)) != got.get(str(s)):
            return f"step {s}: expected {ref.get(str(s))}, got {got.get(str(s))}"
    return None


def main(args: argparse.Namespace) -> int:
    if not 0 < args.snapshot_every <= args.crash_at < args.steps:
        sys.exit("need 0 < --snapshot-every <= --crash-at < --steps")
    if args.workdir:
        workdir = Path(args.workdir).resolve()
        if (workdir / "snapshots").exists():
            sys.exit(f"{workdir / 'snapshots'} already exists; use a fresh --workdir")
        workdir.mkdir(parents=True, exist_ok=True)
        return run_and_check(args, workdir)
    # A work dir of our own is removed at the end, whatever happened, unless --keep asks otherwise.
    workdir = Path(tempfile.mkdtemp(prefix="snapshotkit-demo-")).resolve()
    try:
        return run_and_check(args, workdir)
    finally:
        if args.keep:
            print(f"[main] kept {workdir} (--keep)", flush=True)
        else:
            shutil.rmtree(workdir)
            print(f"[main] removed {workdir} (--keep or --workdir DIR keeps the snapshots)", flush=True)


def run_and_check(args: argparse.Namespace, workdir: Path) -> int:
    """Run the three phases in ``workdir``, then compare them; 0 when every check passed."""
    t_start = time.perf_counter()
    print(f"[main] workdir {workdir}", flush=True)
    # torch makes its compiler cache dir (TMPDIR/torchinductor_<user>) the first time an optimizer
    # steps; the phases inherit this, so nothing of the demo lands outside its work dir.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(workdir / "torch_cache"))

    common = [
        "--workdir",
        str(workdir),
        "--steps",
        str(args.steps),
        "--seed",
        str(args.seed),
        "--snapshot-every",
        str(args.snapshot_every),
        "--crash-at",
        str(args.crash_at),
    ]
    for phase, expected_rc in (("A", 0), ("B", CRASH_EXIT_CODE), ("C", 0)):
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, __file__, "--phase", phase, *common]).returncode
        print(f"[main] phase {phase} exited with {rc} after {time.perf_counter() - t0:.1f}s", flush=True)
        if rc != expected_rc:
            print(f"[main] FAIL: phase {phase} exited with {rc}, expected {expected_rc}")
            return 1

    runs = {p: json.loads((workdir / f"losses_{p}.json").read_text()) for p in "ABC"}
    ref, resumed_from = runs["A"]["losses"], runs["C"]["resumed_from"]
    ok = True
    bad = first_mismatch(ref, runs["B"]["losses"], range(1, args.crash_at + 1))
    if bad:
        print(f"[main] FAIL: snapshotting perturbed training (run B vs A), {bad}")
        ok = False
    after = range(resumed_from + 1, args.steps + 1)
    bad = first_mismatch(ref, runs["C"]["losses"], after)
    if bad:
        print(f"[main] FAIL: resumed losses differ from the uninterrupted run, {bad}")
        ok = False
    else:
        print(
            f"[main] OK: resumed losses match the uninterrupted run bit for bit "
            f"for all {len(after)} steps after step {resumed_from} (float.hex compared)"
        )
    final_a, final_c = torch.load(workdir / "final_A.pt"), torch.load(workdir / "final_C.pt")
    if all(torch.equal(final_a[k], final_c[k]) for k in final_a) and final_a.keys() == final_c.keys():
        print(f"[main] OK: final weights identical ({len(final_a)} tensors)")
    else:
        print("[main] FAIL: final weights differ between runs A and C")
        ok = False

    final = Snapshot(workdir / "snapshots" / f"step_{args.steps}")
    for key in READ_KEYS:
        value = final.read_object(f"model/{key}", memory_budget_bytes=READ_BUDGET)
        match = isinstance(value, torch.Tensor) and torch.equal(value, final_c[key])
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        print(
            f"[main] {'OK' if match else 'FAIL'}: read_object('model/{key}', "
            f"memory_budget_bytes={READ_BUDGET}) of step {args.steps} -> shape {shape}, "
            f"{'matches' if match else 'DOES NOT match'} the final model"
        )
        ok = ok and match
    print(f"[main] {'PASSED' if ok else 'FAILED'} in {time.perf_counter() - t_start:.1f}s wall time")
    return 0 if ok else 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="where snapshots and logs go, kept (default: a new temp dir, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the default temp work dir instead of removing it")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--snapshot-every", type=int, default=10)
    p.add_argument("--crash-at", type=int, default=35)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phase", choices=("A", "B", "C"), help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.phase:
        run_phase(arguments)
    else:
        sys.exit(main(arguments))
