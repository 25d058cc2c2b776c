#!/bin/sh
# The leaderboard of issue 20 (docs/results/leaderboard.md): nine protocol grids, then the tables and
# the plot. About 80 minutes on an idle 2-core machine; each grid resumes where it stopped.
#
#   sh experiments/leaderboard.sh            # from the repository root, with the venv of `make install`
set -e
STALEGRAD=${STALEGRAD:-.venv/bin/stalegrad}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/leaderboard}
for name in grad_asgd grad_sgd grad_dana grad_momentum grad_gap commit_agn commit_outer grad_sasgd commit_downpour; do
  $STALEGRAD grid experiments/leaderboard_$name.toml --out "$OUT/$name" --jobs 2
done
$PYTHON experiments/leaderboard.py "$OUT" --out docs/results/leaderboard.md --notes experiments/leaderboard_cuts.md
