#!/usr/bin/env bash
# Every benchmark behind a figure in README.md and docs/benchmarks.md, one after another, at the
# checked-out commit: results in benchmarks/results/<date>-<commit>/<name>.json, the printed
# report beside it as <name>.txt. Run it on a quiet machine (nothing else running); it refuses a
# working tree with uncommitted changes to tracked files, since the figures must belong to a commit.
#
#   bash benchmarks/run_all.sh                 # everything (about an hour on the 2-core VM)
#   BENCHES="local small_entries" bash benchmarks/run_all.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "uncommitted changes to tracked files: commit first, so the figures belong to a commit" >&2
    exit 2
fi
PYTHON=${PYTHON:-python}
out="benchmarks/results/$(date +%F)-$(git rev-parse --short HEAD)"
mkdir -p "$out"
all="local small_entries objectstore async concurrent_async incremental dist shared_restore reshard
     plan_cache plan_scale manager should_save tiers promotion import convert stress_kill"
status=0
for name in ${BENCHES:-$all}; do
    script="benchmarks/bench_$name.py"
    [ "$name" = stress_kill ] && script=benchmarks/stress_kill.py
    start=$(date +%s)
    if "$PYTHON" "$script" --out "$out/$name.json" >"$out/$name.txt" 2>&1; then
        echo "$name: $(($(date +%s) - start)) s"
    else
        echo "$name: FAILED (exit $?) after $(($(date +%s) - start)) s, see $out/$name.txt"
        status=1
    fi
done
echo "results in $out"
exit $status
