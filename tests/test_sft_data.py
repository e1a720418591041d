"""SFT conversations: embedded questions about stdlib objects, and smoltalk-style data streamed
from a local mirror through datasets.load_dataset."""
import pytest

import mirrors
from speedrun.data import sft
from speedrun.data.docstrings import heldout_split
from speedrun.data.questions import MAX_ANSWER_CHARS, TEMPLATES, question, questions


@pytest.fixture(scope="module")
def embedded(objects_path):
    skipped = {}
    return sft.embedded_conversations(objects_path, 0.1, 0.1, seed=0, skipped=skipped), skipped


def test_embedded_conversations(embedded, objects_path):
    convs, skipped = embedded
    usable, skips = sft.embedded_qa(objects_path)
    held_out = skipped.pop("held_out_eval")
    assert skipped == skips and sum(skipped.values()) > 0 and held_out > 0
    assert len(convs["train"]) + len(convs["val"]) + held_out == sum(len(TEMPLATES[o.kind]) for o, _ in usable)
    # split follows the held-out split of the object's top-level module; the 'eval' modules are never trained on
    split_of_q = {q: heldout_split(o.top, 0.1, 0.1) for o, _ in usable for q in questions(o)}
    answer_of_q = {q: a for o, a in usable for q in questions(o)}
    for split in ("train", "val"):
        assert convs[split]
        for user, bot in convs[split]:
            assert user["role"] == "user" and bot["role"] == "assistant"
            assert split_of_q[user["content"]] == split and bot["content"] == answer_of_q[user["content"]]
            assert 0 < len(bot["content"]) <= MAX_ANSWER_CHARS
    asked = [c[0]["content"] for c in convs["train"] + convs["val"]]
    assert all(q not in asked for q, s in split_of_q.items() if s == "eval")
    dumps = [c for c in convs["train"] + convs["val"] if c[0]["content"] == "What does `json.dumps` do?"]
    assert heldout_split("json", 0.1, 0.1) == "eval" or (len(dumps) == 1 and "JSON" in dumps[0][1]["content"])


def test_embedded_conversations_cover_the_pair_prompts_and_are_seeded(embedded, objects_path):
    convs, _ = embedded
    asked = {c[0]["content"] for split in convs.values() for c in split}
    usable, _ = sft.embedded_qa(objects_path)
    # the RM/GRPO prompts of the train and val modules were seen in SFT; those of the eval modules never were
    for o, _ in usable:
        assert (question(o) in asked) == (heldout_split(o.top, 0.1, 0.1) != "eval")
    one = sft.embedded_conversations(objects_path, 0.1, 0.1, seed=1, per_object=1)
    assert len(one["train"]) + len(one["val"]) == sum(heldout_split(o.top, 0.1, 0.1) != "eval" for o, _ in usable)
    assert one == sft.embedded_conversations(objects_path, 0.1, 0.1, seed=1, per_object=1)
    assert one["train"][:20] != sft.embedded_conversations(objects_path, 0.1, 0.1, seed=2, per_object=1)["train"][:20]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoltalk")
    return root, mirrors.write_smoltalk(root)


@pytest.mark.slow
def test_hf_conversations_from_a_local_mirror(smol):
    root, rows = smol
    convs, skipped = sft.hf_conversations(str(root), "all", "train", max_rows=1000)
    want = mirrors.expected(rows["all/train"])
    assert skipped == want["skipped"]
    assert len(convs) + sum(skipped.values()) == len(rows["all/train"]) and len(convs) == 2
    assert convs[0] == [{"role": "user", "content": "Hi (all/train)"}, {"role": "assistant", "content": "Hello!"}]
    assert [m["role"] for m in convs[1]] == ["system", "user", "assistant", "user", "assistant"]
    test, _ = sft.hf_conversations(str(root), "all", "test", max_rows=1000)
    assert test[0][0]["content"] == "Hi (all/test)"
    other, _ = sft.hf_conversations(str(root), "smol-magpie-ultra", "train", max_rows=1000)
    assert other[0][0]["content"] == "Hi (smol-magpie-ultra/train)"
    few, few_skipped = sft.hf_conversations(str(root), "all", "train", max_rows=3)
    assert len(few) + sum(few_skipped.values()) == 3
    with pytest.raises(KeyError, match="conversation"):
        sft.hf_conversations(str(root), "all", "train", max_rows=10, messages_column="conversation")
    mixed, mixed_skipped = sft.hf_conversations(str(root), "all", "train", max_rows=1000, seed=3, shuffle_buffer=64)
    assert mixed_skipped == skipped and sorted(map(str, mixed)) == sorted(map(str, convs))  # the same rows, reordered
    assert sft.hf_conversations(str(root), "all", "train", max_rows=1000, seed=3, shuffle_buffer=64)[0] == mixed


def test_check_conversation_reasons():
    ok, reason = sft.check_conversation([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    assert reason is None and ok[-1]["content"] == "a"
    answer = {"role": "assistant", "content": "a"}
    assert sft.check_conversation([{"role": "system", "content": "s"}, answer])[1] == "bad_role_order"
    assert sft.check_conversation([{"role": "user", "content": 3}, answer])[1] == "non_str_content"
    assert sft.check_conversation("not a list")[1] == "not_a_message_list"
    assert sft.check_conversation([{"role": "user", "content": "q"}])[1] == "no_assistant_turn"
