#!/usr/bin/env bash
# Issue 27's GPU figures in one call on a GPU machine (repo root; no install: the library runs from src/):
#   OUT=/tmp/gpu_speed bash bench/gpu_speed.sh                 # PARTS="grpo pretrain sampler"
#   OUT=/tmp/gpu_speed PARTS=trained bash bench/gpu_speed.sh   # needs outs/sft, outs/rm, outs/tokenizer, data/prompts
#   OUT=/tmp/gpu_speed PARTS=ladder bash bench/gpu_speed.sh    # the same, issue 44's figures (about 4 minutes)
#   OUT=/tmp/gpu_speed PARTS=step BASE=gpu_base bash bench/gpu_speed.sh   # the step's phases, against BASE's code
#   OUT=/tmp/gpu_speed PARTS=graphs BASE=gpu_base [ROUNDS="1 2"] [GRAPH_EXTRAS="default phases 64x16"] bash ...
#     (ROUNDS=1 with no extras: at most 380 s; carry outs/sft, outs/rm, outs/tokenizer, data/prompts and gpu_base)
# grpo: GRPO step completion tokens/s at depth 8, random init, no stop token (8 x 8 x 48, the old reports/gpu
#   figure, and 256 x 16 x 48, a batch that fills the device), eager ("dynamic") against the CUDA-graph decode
#   ("compiled"). A step's first use of a shape pays one-off costs: the median is over --steps after one warm-up
#   step, so read the per-step lines in the logs too.
# trained: the same step on the default run's depth-4 SFT model, RM and prompts, stop token on (the work a GRPO
#   stage does: rows end at different lengths, so shapes change every step), with PyTorch's cuDNN attention backend
#   allowed and off.
# ladder: the trained step with exact shapes (--width-step 1, the previous main) and with the shape ladder
#   (--width-step 64, compute.width_step's CUDA value, every bucket warmed up before step 0), captured and eager
#   decode, cuDNN attention off (the stages' setting) and allowed; the same step without the stop token (fixed
#   shapes: the reference figure); 64 x 16; the onpolicy_pairs stage's sampling (bench/onpolicy_throughput.py,
#   cuDNN attention off, as the stage runs), exact against the ladder.
# step: the trained stop-token step on the stages' CUDA settings (ladder, captured decode, cuDNN attention off) and
#   the same step without the stop token, alternating with BASE's code where given; one forward per batch against
#   the CPU's grouping (--forward-cost 32); where the step's time goes (bench/grpo_phases.py); 64 x 16.
# graphs: the trained stop-token step with the scoring forwards (RM, reference, policy) as one joint forward per
#   batch, eager and compiled (reduce-overhead: CUDA graphs, forward and backward), against BASE's code, alternating;
#   GRAPH_EXTRAS: default-mode compile, the step's phases, 64 x 16.
# pretrain: MFU at depth 16 (batch 32 x 1024, vocab 32768, bf16 compiled) against the published 989 TFLOP/s and
#   a measured 8192^3 peak. sampler: engine.generate alone (8 x 8 and 256 x 16 rows x 64 tokens, three decodes).
# Each bench runs under its own time limit, so one that fails or hangs leaves the others their figures; full logs
# go to $OUT.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_speed}
PARTS=${PARTS:-grpo pretrain sampler}
mkdir -p "$OUT"
run() {  # name, seconds, command...: the bench's figures, its per-step tok/s, its exit status
  local name=$1 secs=$2
  shift 2
  echo "== $name ($(date +%T)): $*"
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -v " step [0-9]*/" "$OUT/$name.log" | grep -v "^W[0-9]\|Warning\|warn(\|softmax\|^$" | tail -n 8
  grep " step [0-9]*/" "$OUT/$name.log" | awk '{for (i = 2; i <= NF; i++) if ($i == "tok/s,") printf "%s ", $(i-1)}
    END {print "(tok/s per step)"}'
  echo "rc $rc"
}
has() { [[ " $PARTS " == *" $1 "* ]]; }
if ! python3 -c "import ruamel.yaml" 2>/dev/null; then  # params.py reads params.yaml with it
  echo "ruamel.yaml is missing: on a machine without internet, pip download ruamel.yaml --no-deps here, carry the" \
    "wheel, then python3 -m pip install --no-deps --no-index <wheel>" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
G="python3 bench/grpo_throughput.py --device cuda --dtype bf16 --threads 8"
if has grpo; then
  run grpo_d8_8x8_dynamic 60 $G --depth 8 --steps 12 --decode dynamic
  run grpo_d8_8x8_compiled 100 $G --depth 8 --steps 12 --decode compiled
  run grpo_d8_256x16_dynamic 80 $G --depth 8 --steps 12 --prompts-per-step 256 --group-size 16 --decode dynamic
  run grpo_d8_256x16_compiled 100 $G --depth 8 --steps 12 --prompts-per-step 256 --group-size 16 --decode compiled
fi
if has trained; then
  for sdpa in cudnn-sdpa no-cudnn-sdpa; do
    run trained_8x8_dynamic_$sdpa 80 $G --trained --steps 6 --decode dynamic --$sdpa
    run trained_128x16_dynamic_$sdpa 80 $G --trained --steps 6 --prompts-per-step 128 --group-size 16 \
      --decode dynamic --$sdpa
  done
fi
if has ladder; then
  T="$G --trained --decode"
  for sdpa in no-cudnn-sdpa cudnn-sdpa; do  # the stages run with cuDNN attention off (shapes.use_shapes)
    run ladder_8x8_compiled_w64_$sdpa 45 $T compiled --width-step 64 --steps 8 --$sdpa
    run ladder_8x8_dynamic_w64_$sdpa 40 $T dynamic --width-step 64 --steps 8 --$sdpa
    run ladder_8x8_compiled_w1_$sdpa 45 $T compiled --width-step 1 --steps 4 --$sdpa
  done
  run ladder_8x8_compiled_w64_nostop 40 $T compiled --width-step 64 --steps 8 --no-stop --no-cudnn-sdpa
  run ladder_64x16_compiled_w64 45 $T compiled --width-step 64 --steps 6 --prompts-per-step 64 --group-size 16 \
    --no-cudnn-sdpa
  run onpolicy 45 python3 bench/onpolicy_throughput.py --device cuda --threads 8 --prompts 1024 --steps 1,64
fi
if has step; then  # the stop-token step against the fixed-shape one, this tree and (BASE=dir: a copy of another
  # commit's src/ and bench/, e.g. `git archive HEAD src bench | tar -x -C gpu_base`) the tree it is compared with
  T="$G --trained --decode compiled --width-step 64 --no-cudnn-sdpa --steps 8"
  for round in 1 2; do  # alternating: the device's clocks drift
    if [ -n "${BASE:-}" ]; then
      B="env PYTHONPATH=$BASE/src python3 $BASE/bench/grpo_throughput.py --device cuda --dtype bf16 --threads 8"
      run base_stop_r$round 45 $B --trained --decode compiled --width-step 64 --no-cudnn-sdpa --steps 8
      [ $round = 1 ] && run base_nostop 40 $B --trained --decode compiled --width-step 64 --no-cudnn-sdpa --steps 8 \
        --no-stop
    fi
    run stop_r$round 60 $T
    [ $round = 1 ] && run stop_cost32 50 $T --forward-cost 32
    [ $round = 1 ] && run nostop 50 $T --no-stop
  done
  run phases_stop 60 python3 bench/grpo_phases.py --device cuda --dtype bf16 --threads 8 --decode compiled --steps 8
  run stop_64x16 50 $G --trained --decode compiled --width-step 64 --no-cudnn-sdpa --steps 6 --prompts-per-step 64 \
    --group-size 16
fi
if has graphs; then  # the joint scoring forward (one forward per batch over [prompt | completion]), eager and
  # compiled (--compile-forwards: reduce-overhead = CUDA graphs), against BASE's code (prefill + continuation)
  T="$G --trained --decode compiled --width-step 64 --no-cudnn-sdpa --steps 8"
  B="env PYTHONPATH=$BASE/src python3 $BASE/bench/grpo_throughput.py --device cuda --dtype bf16 --threads 8"
  B="$B --trained --decode compiled --width-step 64 --no-cudnn-sdpa --steps 8"
  for round in ${ROUNDS:-1 2}; do  # alternating: the device's clocks drift
    run base_stop_r$round 45 $B
    run joint_stop_r$round 45 $T
    run joint_ro_stop_r$round 150 $T --compile-forwards reduce-overhead
    [ $round = 1 ] && run joint_ro_nostop 60 $T --compile-forwards reduce-overhead --no-stop
    [ $round = 1 ] && run base_nostop 40 $B --no-stop
    [ $round = 1 ] && run joint_nostop 40 $T --no-stop  # the fixed-shape figure of this tree's step
  done
  for part in $GRAPH_EXTRAS; do
    case $part in
      default) run joint_default_stop 120 $T --compile-forwards default ;;
      phases) run phases_ro 70 python3 bench/grpo_phases.py --device cuda --dtype bf16 --threads 8 --decode compiled \
        --steps 8 --compile-forwards reduce-overhead --profile 12 ;;
      64x16) run ro_64x16_stop 80 $T --compile-forwards reduce-overhead --prompts-per-step 64 --group-size 16 --steps 6
        run ro_64x16_nostop 60 $T --compile-forwards reduce-overhead --prompts-per-step 64 --group-size 16 --steps 6 \
          --no-stop ;;
    esac
  done
fi
if has pretrain; then
  run pretrain_d16 140 python3 bench/train_throughput.py --device cuda --depth 16 --seq-len 1024 --batch 32 \
    --vocab 32768 --dtypes bf16 --no-eager --steps 10
fi
if has sampler; then
  run sampler_d8 80 python3 bench/engine_throughput.py --device cuda --depth 8 --threads 8 --shapes 8x8,256x16 \
    --decodes dynamic,static,compiled --repeats 3
fi
