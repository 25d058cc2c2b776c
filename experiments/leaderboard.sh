#!/bin/sh
# The leaderboard of issue 20 (docs/results/leaderboard.md): fourteen protocol grids (gradient rules on
# Fashion-MNIST; commit rules on MNIST and on Fashion-MNIST; the last two, issue 41's rules that drop stale
# gradients, added and not yet run), then the tables and the plot. About 2 hours on an idle 2-core machine
# for the first twelve; each grid resumes where it stopped.
#
#   sh experiments/leaderboard.sh            # from the repository root, with the venv of `make install`
set -e
STALEGRAD=${STALEGRAD:-.venv/bin/stalegrad}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/leaderboard}
for name in grad_asgd grad_sgd grad_dana grad_momentum grad_gap commit_agn commit_outer grad_sasgd commit_downpour \
            commit_agn_fashion commit_outer_fashion commit_downpour_fashion time_rules time_rules_ringmaster; do
  $STALEGRAD grid experiments/leaderboard_$name.toml --out "$OUT/$name" --jobs 2
done
$PYTHON experiments/leaderboard.py "$OUT" --out docs/results/leaderboard.md --notes experiments/leaderboard_cuts.md
