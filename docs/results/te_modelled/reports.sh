#!/bin/sh
# sh docs/results/te_modelled/reports.sh [RUNS] [OUT]: the demo's reports: measured costs, the rerun's, equal costs, AGN or AEASGD 1.9x, the simulator's wall time
cd "$(dirname "$0")/../../.."   # the repository
SG=${SG:-.venv/bin/stalegrad}   # here: "env PYTHONPATH=/work/wt-te /work/main/.venv/bin/python -m stalegrad"
RUNS=${1:-runs/te_modelled_demo/runs}   # the demo grid's runs (here: /tmp/te_demo/grid/runs)
OUT=${2:-/tmp/te_demo}
P="--baseline aeasgd --select-seeds 0 --report-seeds 1-2"
$SG report $RUNS --out $OUT/rep_measured $P --time-model benchmarks/results/throughput.json
$SG report $RUNS --out $OUT/rep_rerun $P --time-model benchmarks/results/throughput_rerun.json
$SG report $RUNS --out $OUT/rep_equal $P --time-model docs/results/te_modelled/equal.json
$SG report $RUNS --out $OUT/rep_agn19 $P --time-model docs/results/te_modelled/agn_x1.9.json
$SG report $RUNS --out $OUT/rep_ae19 $P --time-model docs/results/te_modelled/aeasgd_x1.9.json
$SG report $RUNS --out $OUT/rep_wall $P --variant workers
