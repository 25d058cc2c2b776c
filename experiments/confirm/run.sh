#!/usr/bin/env sh
# The confirmatory study's grids in PLAN.md's order, each resumable (a grid skips the runs it has), at the lowest
# priority; then experiments/confirm/collect.py copies each finished run's summary into docs/results/confirm/runs/.
#   sh experiments/confirm/run.sh [GRID ...]      (default: all, in the plan's order)
set -eu
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
GRIDS=${*:-"dc dc_sequential dc_ssgd dc_momentum dc_probes agn_thesis_layout agn_baselines agn_alignment agn_shard agn_mlp"}
for g in $GRIDS; do
  jobs=2; [ "$g" = agn_mlp ] && jobs=1
  nice -n 19 "$BIN/stalegrad" grid "experiments/confirm/$g.toml" --out "runs/confirm/$g" --jobs "$jobs" </dev/null
  "$BIN/python" experiments/confirm/collect.py "runs/confirm/$g" "docs/results/confirm/runs/$g"
done
