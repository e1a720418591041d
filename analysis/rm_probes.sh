#!/usr/bin/env bash
# reports/experiments/chat-smollm2-rm-probes (its README is the plan): three reward models for the SmolLM2 chat track
# (dvc exp run ... train_rm), each one's metrics kept under v0/, v1/, v2/; then pilot 3's GRPO recipe with baseline
# and shuffled at seeds 1-3 against the first of v2, v1 that passes the RM bars (analysis/rm_probes.py --passes),
# kept with speedrun.experiment. Run from the root of a fresh clone (about 50 minutes on 2 cores).
set -euo pipefail
PY=${PYTHON:-python3}
E=reports/experiments/chat-smollm2-rm-probes
common=(-S base=smollm2-135m -S sft.steps=0 -S sft.eval_convs=64 -S prompts.eval_frac=0.2
        -S pairs.embedded_echo=true -S pairs.embedded_probes=true -S pairs.limit_per_source=3600
        -S rm.steps=100 -S rm.eval_every=25)
v0=(-S onpolicy.max_new_tokens=48 -S 'rm.train_kinds=[hard,random,echo,sft_sample]')
v1=(-S onpolicy.max_new_tokens=128 -S onpolicy.keep_truncated=false -S 'rm.train_kinds=[hard,random,echo,sft_sample]')
v2=(-S onpolicy.max_new_tokens=128 -S onpolicy.keep_truncated=false
    -S 'rm.train_kinds=[hard,random,echo,nonanswer,template,sft_sample]')
rm_run() {  # $1 = v0|v1|v2, then that RM's overrides
  local v=$1; shift
  $PY -m dvc exp run -n "rm-probes-$v" "${common[@]}" "$@" train_rm
  mkdir -p "$E/$v"
  cp reports/metrics/rm.json "$E/$v/rm.json"
  cp data/onpolicy/stats.json "$E/$v/onpolicy.json"
  cp data/pairs/stats.json "$E/$v/pairs.json"
  git checkout params.yaml  # a finished -S stays in params.yaml
}
rm_run v0 "${v0[@]}"
rm_run v1 "${v1[@]}"
rm_run v2 "${v2[@]}"
pick=""
for v in v2 v1; do
  if $PY analysis/rm_probes.py "$E" --passes "$v"; then pick=$v; break; fi
done
if [[ -z $pick ]]; then
  echo "no RM passes its bars: no screen (the plan's rule)"
  $PY -m speedrun.kept --pack "$E"
  exit 0
fi
[[ $pick == v2 ]] && chosen=("${v2[@]}") || chosen=("${v1[@]}")
$PY -m dvc exp run -n rm-probes-screen "${common[@]}" "${chosen[@]}" -S "grpo.run=[baseline,shuffled]" \
  -S 'grpo.seeds=[1,2,3]' -S "eval.comparisons=['baseline:shuffled']" -S eval.gold.samples=4 -S eval.max_prompts=16 \
  -S grpo.train.lr=0.0003 -S grpo.train.steps=40 -S grpo.train.frozen_blocks=26 -S grpo.train.prompts_per_step=8 \
  -S grpo.train.group_size=4 -S grpo.train.warmup_steps=2 -S grpo.train.max_new_tokens=48 -S eval.max_new_tokens=48 \
  eval_diversity
echo "$pick" > "$E/screened.txt"
$PY -m speedrun.experiment "$E" --track chat
git checkout params.yaml
