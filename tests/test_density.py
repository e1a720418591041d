"""Density-aware prompt weights: direction on known clusters, blocked == unblocked, clipping, helpers."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from speedrun.eval.diversity import gini
from speedrun.model import GPT, GPTConfig
from speedrun.embeddings import embed_prompts, idf_weights
from speedrun.rl.density import (dense_rows, draw_prompts, effective_sample_size, group_shares, knn_distance,
                                 prompt_weights, share_entropy)

torch.set_num_threads(1)


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.double(), dim=1)


def clusters(seed: int = 0, crowd: int = 50, isolated: int = 5, dim: int = 16) -> torch.Tensor:
    """A tight crowd of `crowd` points around one direction + `isolated` points in random directions."""
    g = torch.Generator().manual_seed(seed)
    center = torch.randn(dim, generator=g, dtype=torch.float64)
    crowd_pts = center + 0.05 * torch.randn(crowd, dim, generator=g, dtype=torch.float64)
    iso_pts = torch.randn(isolated, dim, generator=g, dtype=torch.float64)
    return unit(torch.cat([crowd_pts, iso_pts]))


def reference_knn(e: torch.Tensor, k: int) -> torch.Tensor:
    """Unblocked N x N reference."""
    dist = 1.0 - e @ e.T
    dist.fill_diagonal_(math.inf)
    k = min(k, e.shape[0] - 1)
    return dist.topk(k, dim=1, largest=False).values.clamp_min(0).mean(1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_isolated_prompts_get_larger_weights(seed):
    e = clusters(seed)
    for k, alpha, max_ratio in [(5, 1.0, 1e6), (3, 2.0, 20.0), (10, 0.5, 5.0)]:
        w = prompt_weights(e, k=k, alpha=alpha, max_ratio=max_ratio)
        assert w[50:].min() > w[:50].max(), f"isolated must outweigh crowded (k={k}, alpha={alpha})"
        assert w.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_hand_computed_three_points():
    # (1,0), (0,1), (-1,0): cosine distances 1, 2, 1. k=2 (all others): d = [1.5, 1, 1.5]
    e = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(knn_distance(e, k=2), torch.tensor([1.5, 1.0, 1.5], dtype=torch.float64))
    assert torch.allclose(knn_distance(e, k=1), torch.ones(3, dtype=torch.float64))
    w = prompt_weights(e, k=2, alpha=1.0, max_ratio=10.0)
    assert torch.allclose(w, torch.tensor([0.375, 0.25, 0.375], dtype=torch.float64))
    # alpha=2: [2.25, 1, 2.25]; max_ratio=2 floors the middle one at 1.125 -> [0.4, 0.2, 0.4]
    w = prompt_weights(e, k=100, alpha=2.0, max_ratio=2.0)  # k >= N is capped at N-1
    assert torch.allclose(w, torch.tensor([0.4, 0.2, 0.4], dtype=torch.float64), atol=1e-9)
    assert w.max() / w.min() <= 2.0
    assert prompt_weights(e, k=2, alpha=0.0, max_ratio=10.0).tolist() == [1 / 3] * 3


def test_blocked_equals_unblocked():
    g = torch.Generator().manual_seed(3)
    e = torch.cat([clusters(4, crowd=40, isolated=7), unit(torch.randn(30, 16, generator=g))])
    for k in (1, 4, 9, 200):
        ref = reference_knn(e, k)
        for block in (1, 7, 32, 1024):
            assert torch.allclose(knn_distance(e, k, block_size=block), ref, atol=1e-12)
    w_small = prompt_weights(e, 4, 1.0, 50.0, block_size=5)
    w_big = prompt_weights(e, 4, 1.0, 50.0, block_size=1024)
    assert torch.allclose(w_small, w_big, atol=1e-15)


def test_max_ratio_holds_and_sums_to_one():
    g = torch.Generator().manual_seed(5)
    for trial in range(20):
        n = int(torch.randint(2, 80, (1,), generator=g))
        e = unit(torch.randn(n, 8, generator=g))
        e[: n // 3] = e[0]  # a block of exact duplicates: distance 0
        for max_ratio in (1.0, 1.5, 10.0, 1e4):
            w = prompt_weights(e, k=3, alpha=1.5, max_ratio=max_ratio, block_size=16)
            assert w.dtype == torch.float64 and w.shape == (n,)
            assert torch.isfinite(w).all() and (w > 0).all()
            assert (w.max() / w.min()).item() <= max_ratio
            assert w.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_duplicates_single_point_and_validation():
    # seeded: for about 8% of draws the blocked product leaves some identical rows ~1e-8 apart, and the clip then
    # spreads those weights (unseeded, the test failed by the order tests ran in)
    torch.manual_seed(0)
    e = unit(torch.randn(1, 4).expand(6, 4).clone())  # all identical: all distances 0 -> uniform
    assert torch.allclose(prompt_weights(e, 2, 1.0, 10.0), torch.full((6,), 1 / 6, dtype=torch.float64))
    pairs = unit(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [-1.0, -1.0]]))
    w = prompt_weights(pairs, 1, 1.0, 4.0)  # duplicates: d = 0, floored by the clip
    assert torch.allclose(w[:4], w[0].expand(4)) and w[4] / w[0] == pytest.approx(4.0 / (1 + 1e-9))
    assert prompt_weights(unit(torch.randn(1, 8)), 5, 1.0, 10.0).tolist() == [1.0]
    with pytest.raises(ValueError, match="row 1 has norm"):
        prompt_weights(torch.tensor([[1.0, 0.0], [2.0, 0.0]]), 1, 1.0, 10.0)
    with pytest.raises(ValueError, match="alpha"):
        prompt_weights(pairs, 1, -1.0, 10.0)
    with pytest.raises(ValueError, match="max_ratio"):
        prompt_weights(pairs, 1, 1.0, 0.5)
    assert torch.allclose(prompt_weights(pairs.numpy(), 1, 1.0, 4.0), w)  # numpy input


def test_summary_helpers():
    assert effective_sample_size(torch.full((8,), 0.125)) == pytest.approx(8.0)
    assert effective_sample_size([1.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert effective_sample_size(np.array([0.5, 0.25, 0.25])) == pytest.approx(1 / 0.375)
    shares = group_shares(torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), ["b", "a", "b", "c"])
    assert list(shares) == ["a", "b", "c"]
    assert shares["a"] == pytest.approx(0.2) and shares["b"] == pytest.approx(0.4) and shares["c"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="group labels"):
        group_shares([0.5, 0.5], ["a"])
    assert share_entropy({"a": 1, "b": 1, "c": 1, "d": 1}) == pytest.approx(math.log(4))
    assert share_entropy([1.0, 0.0]) == 0.0
    assert gini([1.0, 1.0, 1.0]) == pytest.approx(0.0, abs=1e-15)
    assert gini([0.0, 0.0, 0.0, 1.0]) == pytest.approx(0.75)  # (n-1)/n: one holds everything
    assert gini([1.0, 2.0, 3.0]) == pytest.approx(2 / 9)  # sum|xi-xj| = 8 over 2 * n^2 * mean = 36


def test_density_flattens_module_shares():
    # a big module (crowd of 50) and five one-prompt modules: density weights give the small modules
    # more total share than uniform does, so the per-module shares are flatter
    e = clusters(0)
    groups = ["big"] * 50 + [f"m{i}" for i in range(5)]
    dens = group_shares(prompt_weights(e, 5, 1.0, 100.0), groups)
    unif = group_shares(torch.full((55,), 1 / 55, dtype=torch.float64), groups)
    assert dens["big"] < unif["big"]
    assert share_entropy(dens) > share_entropy(unif)


def test_draw_prompts():
    w = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    a = draw_prompts(w, 3, torch.Generator().manual_seed(7))
    b = draw_prompts(w, 3, torch.Generator().manual_seed(7))
    assert a.dtype == torch.long and a.tolist() == b.tolist()
    assert len(set(a.tolist())) == 3 and 0 not in a.tolist()
    with pytest.raises(ValueError, match="batch_size"):
        draw_prompts(w, 5, torch.Generator().manual_seed(0))  # only 4 prompts have weight
    # frequencies follow the weights (single draws)
    g = torch.Generator().manual_seed(1)
    counts = torch.bincount(torch.cat([draw_prompts(w, 1, g) for _ in range(4000)]), minlength=5)
    assert counts[0] == 0 and counts[1] < counts[2] < counts[3] < counts[4]
    u = draw_prompts(torch.ones(10, dtype=torch.float64), 10, torch.Generator().manual_seed(0))
    assert sorted(u.tolist()) == list(range(10))


def test_draws_of_two_arms_with_one_stream_are_coupled():
    """The same generator state: identical draws under identical weights, mostly shared ones under close weights,
    and no more overlap than chance under independent streams."""
    w = torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    close = w * (1 + 0.1 * torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))

    def overlap(wa, wb, same_stream: bool) -> float:
        shared = 0
        for step in range(50):
            a = draw_prompts(wa, 8, torch.Generator().manual_seed(step))
            b = draw_prompts(wb, 8, torch.Generator().manual_seed(step if same_stream else 1000 + step))
            shared += len(set(a.tolist()) & set(b.tolist()))
        return shared / (50 * 8)

    assert overlap(w, w, True) == 1.0
    assert overlap(w, close, True) > 0.5 > 0.1 > overlap(w, close, False)


def test_embed_prompts_real_gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, depth=1, n_embd=32, head_dim=16))
    for p in model.parameters():  # the zero-initialised out-projections would make blocks the identity
        torch.nn.init.normal_(p, std=0.2)
    model.train()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (int(n),), generator=g).tolist() for n in [5, 1, 9, 3, 9, 2, 7]]
    e = embed_prompts(model, prompts, batch_size=3, device="cpu")
    assert e.shape == (7, 32) and e.dtype == torch.float32
    assert torch.allclose(e.norm(dim=1), torch.ones(7), atol=1e-5)
    assert model.training, "the caller's train/eval mode is restored"
    # same as embedding each prompt alone, unpadded, in the original order
    for i, p in enumerate(prompts):
        h = model.hidden(torch.tensor([p])).detach()[0].mean(0)
        assert torch.allclose(e[i], torch.nn.functional.normalize(h, dim=0), atol=1e-5), i
    assert torch.equal(e, embed_prompts(model, prompts, batch_size=3, device="cpu"))  # deterministic
    # the same prompt twice gives identical rows; the result feeds prompt_weights directly
    e2 = embed_prompts(model, prompts + [prompts[2]], batch_size=4, device="cpu")
    assert torch.allclose(e2[2], e2[7], atol=1e-6)
    w = prompt_weights(e2, k=2, alpha=1.0, max_ratio=10.0)
    assert w.sum().item() == pytest.approx(1.0) and (w.max() / w.min()).item() <= 10.0
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        embed_prompts(model, [[1, 2], []], batch_size=2, device="cpu")


def test_idf_weights_hand_computed():
    # token 7 is in every prompt (chat markup): weight 0; token 1 in 2 of 4: log 2; token 9 in one: log 4
    w = idf_weights([[7, 1, 9], [7, 1], [7, 2, 2], [7]])
    assert torch.allclose(w[0], torch.tensor([0.0, math.log(2), math.log(4)]))
    assert torch.allclose(w[2], torch.tensor([0.0, math.log(4), math.log(4)]))  # counted once per prompt
    assert w[3].tolist() == [0.0]


def test_embed_prompts_idf_pooling():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, depth=1, n_embd=32, head_dim=16))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    prompts = [[3, 4, 10, 11], [3, 4, 12], [3, 4, 13, 14, 15], [3, 4]]
    e = embed_prompts(model, prompts, batch_size=2, device="cpu", pooling="idf")
    for i, (p, w) in enumerate(zip(prompts, idf_weights(prompts))):
        h = model.hidden(torch.tensor([p])).detach()[0]
        pooled = (h * w[:, None]).sum(0) / w.sum() if w.sum() > 0 else h.mean(0)  # [3, 4]: all weights 0
        assert torch.allclose(e[i], torch.nn.functional.normalize(pooled, dim=0), atol=1e-5), i
    assert not torch.allclose(e, embed_prompts(model, prompts, batch_size=2, device="cpu"))  # differs from mean
    with pytest.raises(ValueError, match="pooling"):
        embed_prompts(model, prompts, batch_size=2, device="cpu", pooling="max")


def test_on_the_real_prompt_set_density_weights_move_mass_from_crowded_modules(objects_path):
    """The embedded prompts (one question per stdlib object, grouped by top-level module) under the committed
    density settings: the largest modules lose share, weight falls with module size, and the module mix moves by
    at least the manipulation check's bar (TV >= 0.3)."""
    import pandas as pd

    from conftest import committed
    from speedrun.data.docstrings import load_objects
    from speedrun.data.questions import answerable, group_of, question
    from speedrun.embeddings import name_embeddings
    from speedrun.rl.density import prompt_weights
    usable, _ = answerable(load_objects(objects_path))
    texts, groups = [question(o) for o, _ in usable], pd.Series([group_of(o) for o, _ in usable])
    c = committed("grpo.density")
    w = pd.Series(prompt_weights(name_embeddings(texts), c.k, c.alpha, c.max_ratio).numpy())
    uniform = groups.value_counts(normalize=True)
    dens = w.groupby(groups).sum()
    top4 = uniform.index[:4]
    assert dens[top4].sum() < 0.75 * uniform[top4].sum()
    assert 0.5 * dens.sub(uniform).abs().sum() >= 0.3
    assert np.corrcoef(w, groups.map(groups.value_counts()))[0, 1] < -0.3
    same = dense_rows(name_embeddings(["What does `tkinter.ttk.Button.invoke` do?",
                                       "Explain `tkinter.ttk.Button.state`."]), 0, 2)
    other = dense_rows(name_embeddings(["What does `json.dumps` do?"]), 0, 1)
    assert float(same[0] @ same[1]) == pytest.approx(1.0) and float(same[0] @ other[0]) == 0.0


def dense_bags(bags: list[list[str]], dim: int, weight) -> torch.Tensor:
    """The dense [N, dim] hashed bags the sparse ones replaced (rl.density before 2026-11-27)."""
    from speedrun.embeddings import _bucket
    out = torch.zeros(len(bags), dim, dtype=torch.float32)
    for i, bag in enumerate(bags):
        for t in bag:
            out[i, _bucket(t, dim)] += weight(t)
    return out / out.norm(dim=1, keepdim=True)


@pytest.mark.slow
def test_sparse_bags_equal_the_dense_ones_they_replaced(objects_path):
    """On the embedded prompt set (and the task's phrasings) the sparse words / names embeddings hold the dense
    matrices' exact numbers, and the density weights computed from them are bitwise the dense ones; memory is the
    nonzeros (a few dozen per prompt), not N x dim."""
    import math
    import re

    from speedrun.data.docstrings import load_objects
    from speedrun.data.questions import answerable, question
    from speedrun.embeddings import _NAME, _WORD, name_embeddings, word_embeddings
    texts = [question(o) for o, _ in answerable(load_objects(objects_path))[0]]
    texts += [f"Name a whole number greater than {a} and less than {a + 7}." for a in range(40)]
    bags = [(w := re.findall(r"[a-z]+", t.lower())) + [f"{a} {b}" for a, b in zip(w, w[1:])] or [t] for t in texts]
    df: dict[str, int] = {}
    for bag in bags:
        for t in set(bag):
            df[t] = df.get(t, 0) + 1
    words = dense_bags(bags, 4096, lambda t: math.log((1 + len(texts)) / (1 + df[t])) + 1.0)
    names = []
    for t in texts:
        m = _NAME.search(t)
        parts = m.group(1).split(".") if m else []
        names.append([".".join(parts[:j]) for j in range(1, max(len(parts), 2))] if m and "topic" not in t else
                     [m.group(1)] if m else _WORD.findall(t.lower()) or [t])
    names = dense_bags(names, 2048, lambda t: 1.0)
    for sparse, dense in ((word_embeddings(texts), words), (name_embeddings(texts), names)):
        assert sparse.layout == torch.sparse_csr and sparse.values().numel() < dense.numel() / 50
        assert torch.equal(dense_rows(sparse, 0, len(texts)), dense)
        assert torch.equal(prompt_weights(sparse, 20, 1.0, 10.0), prompt_weights(dense, 20, 1.0, 10.0))


ISOLATED = ["pick a month", "choose a colour please", "say the name of a fruit", "list one animal", "spell a vowel"]


def _weights_worker(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from speedrun.config import DensityConfig
    from speedrun.rl.prompts import sampling_weights
    from speedrun.train.distributed import Dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    texts = [f"name a number between {i} and {i + 7}" for i in range(30)] + ISOLATED
    density = DensityConfig(k=3, alpha=2.0, max_ratio=10.0, embedding="words", max_prompts=0)
    w = sampling_weights("density", None, [[1]] * len(texts), texts, ["g"] * len(texts), density, "cpu",
                         Dist(rank, 2, "cpu"))
    torch.save(w, f"{out}.{rank}")
    dist.destroy_process_group()


def test_density_weights_computed_on_rank_0_reach_every_rank(tmp_path):
    """Under several processes the O(N^2) k-NN runs once, on rank 0, and every rank gets its exact weights."""
    import torch.multiprocessing as mp

    from speedrun.config import DensityConfig
    from speedrun.rl.prompts import sampling_weights
    mp.spawn(_weights_worker, args=(str(tmp_path / "init"), str(tmp_path / "w")), nprocs=2, join=True)
    texts = [f"name a number between {i} and {i + 7}" for i in range(30)] + ISOLATED
    one = sampling_weights("density", None, [[1]] * len(texts), texts, ["g"] * len(texts),
                           DensityConfig(k=3, alpha=2.0, max_ratio=10.0, embedding="words", max_prompts=0), "cpu")
    for r in range(2):
        assert torch.equal(torch.load(tmp_path / f"w.{r}", weights_only=True), one)
    assert one.max() > one.min()  # not uniform: the last five prompts are isolated, the numbers a crowd


def test_density_weights_above_max_prompts_stop_before_embedding_naming_the_knob(capsys):
    """The k-NN's time grows as N^2: above max_prompts the stage stops at once, naming the knob to raise; at the
    limit it says how many prompts it weighs, then works."""
    from speedrun.config import DensityConfig
    from speedrun.rl.prompts import sampling_weights
    texts = [f"name a number between {i} and {i + 7}" for i in range(30)] + ISOLATED
    args = ([[1]] * len(texts), texts, ["g"] * len(texts))
    limited = DensityConfig(k=3, alpha=2.0, max_ratio=10.0, embedding="words", max_prompts=len(texts) - 1)
    with pytest.raises(ValueError, match=r"task.density.max_prompts: 35 train prompts .* above the limit of 34"):
        sampling_weights("density", None, *args, limited, "cpu", where="task.density")
    at_limit = DensityConfig(k=3, alpha=2.0, max_ratio=10.0, embedding="words", max_prompts=len(texts))
    w = sampling_weights("density", None, *args, at_limit, "cpu", where="task.density")
    assert "task.density: weights of 35 train prompts in the words embedding" in capsys.readouterr().out
    unlimited = dataclasses.replace(at_limit, max_prompts=0)  # 0 = no limit: the same weights
    assert torch.equal(w, sampling_weights("density", None, *args, unlimited, "cpu"))


def test_neighbour_purity_a_block_at_a_time_equals_the_whole_matrix():
    """Blocked over rows (memory block x N) it counts exactly what the N x N similarity matrix counts."""
    from speedrun.rl.density import neighbour_purity
    g = torch.Generator().manual_seed(0)
    e = torch.nn.functional.normalize(torch.randn(70, 8, dtype=torch.float64, generator=g), dim=1)
    groups = [str(i % 3) for i in range(70)]
    sim = e @ e.T
    sim.fill_diagonal_(-math.inf)
    nn = sim.topk(5, dim=1).indices.numpy()
    whole = float((np.asarray(groups)[nn] == np.asarray(groups)[:, None]).mean())
    assert neighbour_purity(e, groups, 5, block_size=16) == whole == neighbour_purity(e, groups, 5)
