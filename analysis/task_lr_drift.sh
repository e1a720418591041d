#!/usr/bin/env bash
# Does GRPO's coverage loss on the task come from the reward, or from the update drift any GRPO run has?
# (docs/LOG.md, 2026-11-26, "the task track".) For each lr:steps setting: the checker and the shuffled-reward arm
# from the committed task SFT model (seed 1), then task_eval on those two alone: each arm's gap to the task SFT
# model's temperature frontier, and the checker's gap minus the shuffled arm's.
#   bash analysis/task_lr_drift.sh                      # every setting, ~15 minutes on a 2-core CPU
#   SETTINGS="0.0001:400" SEEDS="1 2" bash analysis/task_lr_drift.sh
#   EXTRA="-S beta=0.2" SETTINGS="0.0003:100" bash analysis/task_lr_drift.sh   # any other override, both arms
# Needs the committed run's outs (dvc pull or dvc repro task_rm). Writes under $OUT only.
set -euo pipefail
OUT=${OUT:-/tmp/task_lr_drift}
SEEDS=${SEEDS:-1}
read -r -a extra <<< "${EXTRA:-}"
seeds_list=$(echo "$SEEDS" | tr ' ' ',')
for setting in ${SETTINGS:-0.0001:150 0.0001:400 0.0003:150 0.001:100}; do
  lr=${setting%%:*}; steps=${setting##*:}
  dir=$OUT/lr${lr}_steps${steps}${EXTRA:+_$(echo "$EXTRA" | tr -c 'A-Za-z0-9.=\n' '_')}
  for arm in checker shuffled; do
    for seed in $SEEDS; do
      python -m stages.task_grpo --arm "$arm" --seed "$seed" -S "task.train.lr=$lr" -S "task.train.steps=$steps" \
        "${extra[@]}" --out-dir "$dir/runs/${arm}_s$seed" --metrics "$dir/metrics/${arm}_s$seed.json" | tail -1
    done
  done
  python -m stages.task_eval -S 'task.run=[checker,shuffled]' -S "task.seeds=[$seeds_list]" \
    -S "task.eval.comparisons=['checker:shuffled']" --runs-dir "$dir/runs" \
    --runs-metrics "$dir/metrics" --answers "$dir/answers.parquet" --metrics "$dir/task.json" --report "$dir/task.md" \
    > /dev/null
  echo "lr $lr, $steps steps:"
  sed -n '/^## Collapse/,/^## Manipulation/p' "$dir/task.md" | grep -E "^\| (task SFT, T=1.0|checker|shuffled) "
done
