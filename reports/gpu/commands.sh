#!/usr/bin/env bash
# The GPU run of reports/gpu/README.md: the DAG's own commands, printed by `dvc repro --dry -f` after these
# params.yaml changes (the device had no DVC, so the commands ran in DAG order by hand):
#   compute.device=cuda compute.dtype=bf16 model.depth=8
#   pretrain.steps=800 pretrain.batch_size=64 pretrain.warmup_steps=50 pretrain.eval_every=100 pretrain.patience=2
#   sft.steps=600 sft.eval_every=100 sft.patience=2
#   rm.train_last_blocks=8 rm.lr=0.0003 rm.steps=150 rm.eval_every=50
#   grpo.steps=15 eval.max_prompts=32 eval.seeds=2   (save_every=0 everywhere: no scratch checkpoints)
# data/corpus, outs/tokenizer and data/prompts came from the default CPU stages (identical on any machine).
# seed1 and seed2 reran the two grpo commands and eval_diversity with --seed 1 / --seed 2 on the same SFT and RM.
#
# A record of that run, valid at commit 6117d11 (--density-pooling mean added: it was the default then, and is not
# now). Today's DAG differs (on-policy RM pairs, replicate GRPO runs, new statistics); the same GPU configuration
# on today's DAG is one command, which also trains grpo.seeds x grpo.variants and evaluates them together:
#   dvc exp run -S compute.device=cuda -S compute.dtype=bf16 -S model.depth=8 -S pretrain.steps=800 \
#     -S pretrain.batch_size=64 -S pretrain.warmup_steps=50 -S pretrain.eval_every=100 -S pretrain.patience=2 \
#     -S sft.steps=600 -S sft.eval_every=100 -S sft.patience=2 -S rm.train_last_blocks=8 -S rm.lr=0.0003 \
#     -S grpo.steps=15 -S eval.max_prompts=32 -S eval.seeds=2
set -eo pipefail
python -m stages.pretrain --corpus-dir data/corpus --tokenizer-dir outs/tokenizer --depth 8 --head-dim 64 --seq-len 256 --steps 800 --batch-size 64 --lr 0.003 --warmup-steps 50 --eval-every 100 --eval-windows 64 --patience 2 --min-delta 0.002 --save-every 0 --seed 1337 --device cuda --dtype bf16 --nproc 1 --out-dir outs/pretrain --metrics reports/metrics/pretrain.json
python -m stages.sft --init-dir outs/pretrain --tokenizer-dir outs/tokenizer --source embedded --val-frac 0.1 --per-object 0 --hf-path HuggingFaceTB/smoltalk --hf-name all --max-rows 20000 --max-len 256 --steps 600 --batch-size 32 --lr 0.001 --warmup-steps 10 --eval-every 100 --eval-convs 256 --patience 2 --min-delta 0.005 --save-every 0 --seed 1337 --device cuda --dtype bf16 --nproc 1 --out-dir outs/sft --metrics reports/metrics/sft.json
python -m stages.train_rm --pairs data/prompts/pairs.parquet --init-dir outs/sft --tokenizer-dir outs/tokenizer --train-last-blocks 8 --max-len 256 --steps 150 --batch-size 32 --lr 0.0003 --warmup-steps 10 --eval-every 50 --patience 3 --min-delta 0.002 --save-every 0 --seed 1337 --device cuda --dtype bf16 --nproc 1 --out-dir outs/rm --metrics reports/metrics/rm.json
python -m stages.grpo --sampling density --sft-dir outs/sft --rm-dir outs/rm --tokenizer-dir outs/tokenizer --prompts data/prompts/prompts.parquet --steps 15 --prompts-per-step 8 --group-size 8 --max-new-tokens 48 --temperature 1.0 --top-p 1.0 --lr 0.0001 --beta 0.04 --clip-eps 0.2 --inner-updates 1 --adv-scale group --density-k 10 --density-alpha 1.0 --density-max-ratio 10.0 --density-pooling mean --seed 1337 --device cuda --dtype bf16 --out-dir outs/grpo_density --metrics reports/metrics/grpo_density.json
python -m stages.grpo --sampling uniform --sft-dir outs/sft --rm-dir outs/rm --tokenizer-dir outs/tokenizer --prompts data/prompts/prompts.parquet --steps 15 --prompts-per-step 8 --group-size 8 --max-new-tokens 48 --temperature 1.0 --top-p 1.0 --lr 0.0001 --beta 0.04 --clip-eps 0.2 --inner-updates 1 --adv-scale group --density-k 10 --density-alpha 1.0 --density-max-ratio 10.0 --density-pooling mean --seed 1337 --device cuda --dtype bf16 --out-dir outs/grpo_baseline --metrics reports/metrics/grpo_baseline.json
python -m stages.eval_diversity --prompts data/prompts/prompts.parquet --tokenizer-dir outs/tokenizer --rm-dir outs/rm --max-prompts 32 --samples-per-prompt 4 --seeds 2 --max-new-tokens 48 --temperature 1.0 --top-p 1.0 --n-boot 1000 --seed 1337 --device cuda --samples-out outs/eval/samples.parquet --result-out outs/eval/result.json --metrics reports/metrics/diversity.json --report reports/report.md --fig-dir reports/figures
