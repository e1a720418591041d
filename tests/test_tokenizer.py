import pytest

from speedrun import tokenizer as tok
from speedrun.data.docstrings import collect


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    objects, _ = collect()
    texts = [o.text for o in objects[::4]]
    out = tmp_path_factory.mktemp("tok")
    tok.save(tok.train(iter(texts), 1024), out)
    return tok.load(out), [o.text for o in objects[1::40]], out


def test_roundtrip_and_special_tokens_stay_text(trained):
    t, val, _ = trained
    assert t.vocab_size == 1024
    for text in val + ["naïve café 日本語 🎉🚀", "literal <|bos|> and <|assistant_end|> stay text", "\t\n  x"]:
        assert t.decode(t.encode(text)) == text
    ids = t.encode("<|bos|>")
    assert t.bos_id not in ids and len(ids) > 1
    assert len({t.bos_id, t.user_start_id, t.user_end_id, t.assistant_start_id, t.assistant_end_id}) == 5


def test_render_conversation_masks_assistant_tokens_only(trained):
    t, _, _ = trained
    msgs = [{"role": "user", "content": "What does `json.dumps` do?"},
            {"role": "assistant", "content": "Serialize obj."},
            {"role": "user", "content": "More?"}, {"role": "assistant", "content": "No."}]
    ids, mask = t.render_conversation(msgs)
    assert len(ids) == len(mask) and ids[0] == t.bos_id
    masked = [i for i, m in zip(ids, mask) if m]
    answer1 = t.encode("Serialize obj.") + [t.assistant_end_id]
    assert masked == answer1 + t.encode("No.") + [t.assistant_end_id]
    prompt = t.render_prompt(msgs[:1])
    assert prompt[-1] == t.assistant_start_id and prompt == ids[: len(prompt)]
    with pytest.raises(ValueError, match="unknown role"):
        t.render_conversation([{"role": "robot", "content": "x"}])


def test_a_long_prompt_keeps_its_chat_header_and_its_end(trained):
    t, _, _ = trained
    msgs = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "And what does `json.dumps` do?"}]
    ids = t.render_prompt(msgs)
    cut = tok.cut_prompt(ids, 40)
    assert len(ids) > 40 and len(cut) == 40
    assert cut[:2] == [t.bos_id, t.user_start_id] and cut[2:] == ids[-38:] and cut[-1] == t.assistant_start_id
    assert tok.cut_prompt(ids, len(ids)) == ids and tok.cut_prompt(ids[:10], 40) == ids[:10]
    with pytest.raises(ValueError, match="at least 3 tokens"):
        tok.cut_prompt(ids, 2)


def test_saved_files_are_deterministic_and_not_pickles(trained, tmp_path):
    t, _, out = trained
    objects, _ = collect()
    tok.save(tok.train(iter([o.text for o in objects[::4]]), 1024), tmp_path)
    for name in [tok.RANKS_FILE, tok.META_FILE]:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()
    assert tok.load(tmp_path).digest == t.digest
    (tmp_path / tok.RANKS_FILE).write_text("not-base64\n")
    with pytest.raises(ValueError, match="line 1"):
        tok.load(tmp_path)
