#!/usr/bin/env bash
# reports/experiments/chat-smollm2-rm-probes (its README is the plan): three reward models for the SmolLM2 chat track
# (dvc exp run ... train_rm), each one's metrics kept under v0/, v1/, v2/; then pilot 3's GRPO recipe with baseline
# and shuffled at seeds 1-3 against the first of v2, v1 that passes the RM bars (analysis/rm_probes.py --passes),
# kept with speedrun.experiment (analysis/rm_gate.sh). Run from the root of a fresh clone (about 50 minutes on 2 cores).
set -euo pipefail
PY=${PYTHON:-python3}
E=reports/experiments/chat-smollm2-rm-probes
RMS_ARG=v0,v1,v2
common=(-S base=smollm2-135m -S sft.steps=0 -S sft.eval_convs=64 -S prompts.eval_frac=0.2
        -S pairs.embedded_echo=true -S pairs.embedded_probes=true -S pairs.limit_per_source=3600
        -S rm.steps=100 -S rm.eval_every=25)
v0=(-S onpolicy.max_new_tokens=48 -S 'rm.train_kinds=[hard,random,echo,sft_sample]')
v1=(-S onpolicy.max_new_tokens=128 -S onpolicy.keep_truncated=false -S 'rm.train_kinds=[hard,random,echo,sft_sample]')
v2=(-S onpolicy.max_new_tokens=128 -S onpolicy.keep_truncated=false
    -S 'rm.train_kinds=[hard,random,echo,nonanswer,template,sft_sample]')
source analysis/rm_gate.sh
rm_run v0 "${v0[@]}"
rm_run v1 "${v1[@]}"
rm_run v2 "${v2[@]}"
screen "v2 v1"
