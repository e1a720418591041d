# Sourced by analysis/rm_probes.sh and analysis/rm_end.sh (RM gates of the SmolLM2 chat track): rm_run trains one RM
# (dvc exp run ... train_rm) and keeps its metrics under $E/<name>/; screen runs pilot 3's GRPO recipe with baseline and
# shuffled at seeds 1-3 against the first listed RM that passes analysis/rm_probes.py's bars and keeps the experiment.
# Callers set PY, E (the experiment folder), RMS_ARG (the names for rm_probes.py --rms) and the common overrides.
rm_run() {  # $1 = the RM's name, then its overrides (after the caller's common ones)
  local v=$1; shift
  $PY -m dvc exp run -n "$(basename "$E")-$v" "${common[@]}" "$@" train_rm
  mkdir -p "$E/$v"
  cp reports/metrics/rm.json "$E/$v/rm.json"
  cp data/onpolicy/stats.json "$E/$v/onpolicy.json"
  cp data/pairs/stats.json "$E/$v/pairs.json"
  git checkout params.yaml  # a finished -S stays in params.yaml
}
screen() {  # $1 = the RM names in the plan's order of preference; each name's overrides in the array of that name
  local pick="" v
  for v in $1; do
    if $PY analysis/rm_probes.py "$E" --rms "$RMS_ARG" --passes "$v"; then pick=$v; break; fi
  done
  if [[ -z $pick ]]; then
    echo "no RM passes its bars: no screen (the plan's rule)"
    $PY -m speedrun.kept --pack "$E"
    return 0
  fi
  local -n chosen=$pick
  $PY -m dvc exp run -n "$(basename "$E")-screen" "${common[@]}" "${chosen[@]}" -S "grpo.run=[baseline,shuffled]" \
    -S 'grpo.seeds=[1,2,3]' -S "eval.comparisons=['baseline:shuffled']" -S eval.gold.samples=4 \
    -S eval.max_prompts=16 -S grpo.train.lr=0.0003 -S grpo.train.steps=40 -S grpo.train.frozen_blocks=26 \
    -S grpo.train.prompts_per_step=8 -S grpo.train.group_size=4 -S grpo.train.warmup_steps=2 \
    -S grpo.train.max_new_tokens=48 -S eval.max_new_tokens=48 eval_diversity
  echo "$pick" > "$E/screened.txt"
  $PY -m speedrun.experiment "$E" --track chat
  git checkout params.yaml
}
