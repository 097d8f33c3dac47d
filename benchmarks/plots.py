"""Render the benchmark results of docs/benchmarks.md as PNG plots (matplotlib).

Reads the JSON results the report's tables come from and writes one PNG per plot:

``local_throughput.png``
    ``bench_local``: take and restore throughput (GiB/s, median of the repeats) against the size
    of the state, for every system of the run (one point per state: many small tensors, a few
    large ones).
``async_blocked.png``
    ``bench_async``: time the training loop is blocked in the snapshot call, first call and later
    calls (medians), per mode, against a plain memcpy of the same bytes.
``shared_restore_reads.png``
    ``bench_shared_restore``: bytes each rank reads from storage in a restore of replicated state,
    shared against every rank reading everything, per store.

A plot whose input file is absent is skipped with a note on stderr; the others are still drawn.

Usage::

    python benchmarks/plots.py                       # benchmarks/results/ -> docs/img/
    python benchmarks/plots.py --results DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # after matplotlib.use, so no display is ever opened
from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30

# The runs the tables of docs/benchmarks.md report; a new run is plotted by changing the name here.
LOCAL_RESULTS = "2026-11-28-b9ab3b5/local.json"
ASYNC_RESULTS = "2026-11-28-b9ab3b5/async.json"
SHARED_RESTORE_RESULTS = "2026-11-28-b9ab3b5/shared_restore.json"

_STATE_LABELS = {"small": "many small tensors", "large": "few large tensors"}
_ASYNC_LABELS = {
    "thread": "snapshotkit\nthread",
    "process": "snapshotkit\nprocess",
    "dcp": "DCP\nasync_save",
    "dcp_reuse": "DCP async_save\nreused stager",
}


def _human_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def plot_local_throughput(results: dict[str, Any]) -> Figure:
    """Take and restore throughput against state size, one line per system."""
    states = results["states"]
    systems = results["config"]["systems"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, op, title in ((axes[0], "save", "take / save"), (axes[1], "load", "restore / load")):
        for system in systems:
            points = []
            for state, info in states.items():
                measured = results["results"].get(state, {}).get(system, {}).get(op)
                if measured and measured.get("n_ok") and measured.get("median_s"):
                    points.append((info["bytes"], info["bytes"] / measured["median_s"] / GIB))
            if not points:
                continue
            points.sort()
            bold = system == "snapshotkit"
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="o",
                linewidth=2.5 if bold else 1.2,
                label=system,
                zorder=3 if bold else 2,
            )
        ax.set_xscale("log")
        ax.set_xticks([info["bytes"] for info in states.values()])
        ax.set_xticklabels(
            [
                f"{_human_bytes(info['bytes'])}\n{info['tensors']:,} tensors\n({_STATE_LABELS.get(name, name)})"
                for name, info in states.items()
            ]
        )
        ax.minorticks_off()
        ax.set_title(title)
        ax.set_xlabel("state size")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("GiB/s (median)")
    axes[1].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"Local disk, cold reads, fsync included ({results.get('started', '')[:10]})")
    fig.tight_layout()
    return fig


def plot_async_blocked(results: dict[str, Any]) -> Figure:
    """Seconds blocked in the snapshot call per mode: first call and later calls."""
    modes = [m for m in _ASYNC_LABELS if results["results"].get(m, {}).get("n_ok")]
    first = [results["results"][m]["first_call_median_s"] for m in modes]
    later = [results["results"][m]["later_call_median_s"] for m in modes]
    memcpy_s = results["memcpy"]["prealloc_median_s"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = range(len(modes))
    width = 0.38
    ax.bar([i - width / 2 for i in x], first, width, label="first call")
    ax.bar([i + width / 2 for i in x], later, width, label="later calls")
    for i, value in enumerate(later):
        ax.annotate(f"{value / memcpy_s:.2f}x", (i + width / 2, value), ha="center", va="bottom", fontsize=8)
    ax.axhline(memcpy_s, color="black", linestyle="--", linewidth=1, label=f"memcpy of the state ({memcpy_s:.3f} s)")
    ax.set_xticks(list(x))
    ax.set_xticklabels([_ASYNC_LABELS[m] for m in modes])
    ax.set_yscale("log")
    ax.set_ylabel("seconds blocked per call (median; log)")
    ax.set_title(f"async snapshot of {_human_bytes(results['memcpy']['bytes'])}: time the training loop waits")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_shared_restore_reads(results: dict[str, Any]) -> Figure:
    """Bytes read from storage per rank, sharing replicated reads against every rank reading."""
    stores = results["stores"]
    fig, axes = plt.subplots(1, len(stores), figsize=(5 * len(stores), 4.2), sharey=True, squeeze=False)
    width = 0.38
    for ax, store in zip(axes[0], stores, strict=True):
        shared = store["shared"]["per_rank_read_bytes"]
        every = store["every_rank"]["per_rank_read_bytes"]
        ranks = range(len(shared))
        ax.bar([r - width / 2 for r in ranks], [b / GIB for b in every], width, label="every rank reads all")
        ax.bar([r + width / 2 for r in ranks], [b / GIB for b in shared], width, label="shared (read once)")
        ax.axhline(store["state_bytes"] / GIB, color="black", linestyle="--", linewidth=1, label="replicated state")
        ax.set_xticks(list(ranks))
        ax.set_xlabel("rank")
        ax.set_title(
            f"{store['store']}: restore {store['shared']['median_seconds']:.1f} s shared, "
            f"{store['every_rank']['median_seconds']:.1f} s not"
        )
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("GiB read from storage")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    ranks_n = len(stores[0]["shared"]["per_rank_read_bytes"])
    fig.suptitle(f"Restore of {_human_bytes(stores[0]['state_bytes'])} replicated over {ranks_n} ranks")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


PLOTS: dict[str, tuple[str, Callable[[dict[str, Any]], Figure]]] = {
    "local_throughput.png": (LOCAL_RESULTS, plot_local_throughput),
    "async_blocked.png": (ASYNC_RESULTS, plot_async_blocked),
    "shared_restore_reads.png": (SHARED_RESTORE_RESULTS, plot_shared_restore_reads),
}


def render(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw every plot whose input exists in ``results_dir`` into ``out_dir``; the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (source, draw) in PLOTS.items():
        path = results_dir / source
        if not path.is_file():
            print(f"skipped {name}: {path} does not exist", file=sys.stderr)
            continue
        fig = draw(json.loads(path.read_text()))
        # No timestamp in the file, so the committed PNGs change only when the data does.
        fig.savefig(out_dir / name, dpi=100, metadata={"Software": None})
        plt.close(fig)
        written.append(out_dir / name)
        print(f"wrote {out_dir / name} from {path.name}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results", help="the JSON results")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the PNGs go")
    args = parser.parse_args(argv)
    render(args.results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
