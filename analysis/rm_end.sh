#!/usr/bin/env bash
# reports/experiments/chat-smollm2-rm-end (its README is the plan): two reward models for the SmolLM2 chat track that
# do not read the closing <|assistant_end|> (rm.read_end=false), trained on 48-token on-policy samples with the cut ones
# kept, each one's metrics kept under e1/ (pool last) and e2/ (pool mean); then pilot 3's GRPO recipe with baseline and
# shuffled at seeds 1-3 against the first of e1, e2 that passes the RM bars (analysis/rm_probes.py --passes), kept with
# speedrun.experiment (analysis/rm_gate.sh). Run from the root of a fresh clone (about 45 minutes on 2 cores).
set -euo pipefail
PY=${PYTHON:-python3}
E=reports/experiments/chat-smollm2-rm-end
RMS_ARG=e1,e2
common=(-S base=smollm2-135m -S sft.steps=0 -S sft.eval_convs=64 -S prompts.eval_frac=0.2
        -S pairs.embedded_echo=true -S pairs.embedded_probes=true -S pairs.limit_per_source=3600
        -S rm.steps=100 -S rm.eval_every=25 -S onpolicy.max_new_tokens=48 -S onpolicy.keep_truncated=true
        -S rm.read_end=false -S 'rm.train_kinds=[hard,random,echo,nonanswer,template,sft_sample]')
e1=(-S rm.pool=last)
e2=(-S rm.pool=mean)
source analysis/rm_gate.sh
rm_run e1 "${e1[@]}"
rm_run e2 "${e2[@]}"
screen "e1 e2"
