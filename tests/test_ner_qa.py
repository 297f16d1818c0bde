"""Token classification (NER) and extractive QA: readers, subword alignment, windows, span decoding,
official metrics, HF interop of the heads, and tiny end-to-end CLI runs."""
import json
import random

import numpy as np
import pytest
import torch
import transformers as T
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from bertforge.checkpoint import load_pretrained
from bertforge.cli import main
from bertforge.config import ModelConfig
from bertforge.data.conll import (TokenExample, align_labels, detect_scheme, encode_token_windows,
                                  iob1_to_iob2, pack_sentences, read_conll, read_token_jsonl,
                                  unpack_words, words_from_windows)
from bertforge.data.squad import (QAExample, decode_answers, encode_qa_windows, read_squad,
                                  split_by_article)
from bertforge.errors import DataError
from bertforge.task_model import TaskModel
from bertforge.tasks.ner import entity_scores
from bertforge.tasks.qa import exact_match, f1, normalize_answer, squad_scores
from bertforge.tokenizer import load_tokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "##son", "lives", "in", "zu", "##rich",
         ".", "the", "cafe", "opened", "answer", "is", "zebra", "paris", "a", "b", "c", "d", "e", "f",
         "what", "?", "where", "went", "to", "and", "##s"]


def tiny_tokenizer() -> Tokenizer:
    """A hand-built uncased WordPiece tokenizer (BERT normaliser strips accents)."""
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    return tok


def tiny_model_dir(tmp_path, head="base", num_labels=2):
    cfg = ModelConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, num_labels=num_labels,
                      add_pooling_layer=head == "base")
    torch.manual_seed(0)
    m = TaskModel(cfg, head=head)
    d = tmp_path / f"tiny-{head}"
    m.save_pretrained(d, tokenizer=tiny_tokenizer())
    return d


# -------------------------------------------------------------------------------- alignment, readers
def test_first_subword_alignment_hand_example():
    tok = tiny_tokenizer()
    words = ["Johnson", "lives", "in", "Zürich", "."]
    enc = tok.encode(words, is_pretokenized=True)
    assert enc.tokens == ["[CLS]", "john", "##son", "lives", "in", "zu", "##rich", ".", "[SEP]"]
    # B-PER=1, O=0, B-LOC=5
    assert align_labels(enc.word_ids, [1, 0, 0, 5, 0]) == [-100, 1, -100, 0, 0, 5, -100, 0, -100]
    ex = TokenExample(words, ["B-PER", "O", "O", "B-LOC", "O"])
    w = encode_token_windows(tok, [ex], 64, {"O": 0, "B-PER": 1, "B-LOC": 5})
    assert len(w) == 1
    assert w[0]["labels"] == [-100, 1, -100, 0, 0, 5, -100, 0, -100]
    assert w[0]["word_index"] == [-1, 0, -1, 1, 2, 3, -1, 4, -1]


def test_long_sentence_windows_give_every_word_exactly_its_own_label():
    tok = tiny_tokenizer()
    rng = random.Random(0)
    words = [rng.choice(["Johnson", "lives", "in", "Zürich", ".", "the", "cafe"]) for _ in range(60)]
    tags = ["B-PER" if x == "Johnson" else "B-LOC" if x == "Zürich" else "O" for x in words]
    l2i = {"O": 0, "B-PER": 1, "B-LOC": 2}
    wins = encode_token_windows(tok, [TokenExample(words, tags)], 16, l2i, stride=4)
    assert len(wins) > 5 and all(len(w["input_ids"]) <= 16 for w in wins)
    assert all(w["input_ids"][0] == 2 and w["input_ids"][-1] == 3 for w in wins)
    covered = {i for w in wins for i in w["word_index"] if i >= 0}
    assert covered == set(range(60))
    for w in wins:  # every first-subword label is its word's label
        for lab, wi in zip(w["labels"], w["word_index"]):
            assert (lab == -100) == (wi < 0)
            if wi >= 0:
                assert lab == l2i[tags[wi]]
    # oracle logits → each word recovered once, from the window where it has most context
    logits = []
    for w in wins:
        z = np.zeros((len(w["input_ids"]), 3))
        for i, lab in enumerate(w["labels"]):
            if lab >= 0:
                z[i, lab] = 1.0
        logits.append(z)
    per_word = words_from_windows(wins, logits, [60])[0]
    assert [int(np.argmax(v)) for v in per_word] == [l2i[t] for t in tags]


def test_document_packing_keeps_documents_apart_and_maps_back():
    tok = tiny_tokenizer()
    sents = [TokenExample(["Johnson", "lives"], ["B-PER", "O"], doc=1),   # 3 subwords
             TokenExample(["in", "Zürich"], ["O", "B-LOC"], doc=1),       # 3
             TokenExample(["the", "cafe", "."], ["O", "O", "O"], doc=1),  # 3
             TokenExample(["Johnson"], ["B-PER"], doc=2)]                 # 2
    packed, spans = pack_sentences(tok, sents, room=6)
    assert [p.tokens for p in packed] == [["Johnson", "lives", "in", "Zürich"], ["the", "cafe", "."],
                                          ["Johnson"]]
    assert spans == [[(0, 2), (1, 2)], [(2, 3)], [(3, 1)]]
    back = unpack_words([p.tags for p in packed], spans, 4)
    assert back == [e.tags for e in sents]


def test_iob1_to_iob2_and_conll_reader(tmp_path):
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG", "I-LOC"]) == \
        ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG", "B-LOC"]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC"]
    assert iob1_to_iob2(iob2) == iob2
    assert detect_scheme([iob2]) == "IOB2" and detect_scheme([["I-PER"]]) == "IOB1"
    p = tmp_path / "eng.train"  # original IOB1 layout: -DOCSTART- -X- O O
    p.write_text("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n"
                 "\nPeter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n\n-DOCSTART- -X- O O\n\n"
                 "Paris NNP I-NP I-LOC\nLondon NNP I-NP B-LOC\n")
    ex = read_conll(p)
    assert [e.doc for e in ex] == [1, 1, 2]
    assert [e.tokens for e in ex] == [["EU", "rejects", "German"], ["Peter", "Blackburn"], ["Paris", "London"]]
    assert [e.tags for e in ex] == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"], ["B-LOC", "B-LOC"]]
    j = tmp_path / "x.jsonl"
    j.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["I-LOC", "O"]}) + "\n")
    assert read_token_jsonl(j)[0].tags == ["B-LOC", "O"]
    j.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["O"]}) + "\n")
    with pytest.raises(DataError, match="2 tokens but 1 tags"):
        read_token_jsonl(j)
    j.write_text(json.dumps({"tokens": ["a"], "tags": ["PER"]}) + "\n")
    with pytest.raises(DataError, match="not IOB"):
        read_token_jsonl(j)


def test_real_conll2003_counts(data_dir):
    ex = read_conll(data_dir / "conll2003" / "valid.txt")
    assert len(ex) == 3250 and sum(len(e.tokens) for e in ex) == 51362  # SOURCES.md official counts


def test_entity_scores_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "O"]]
    s = entity_scores(gold, pred)  # 2 of 2 predicted entities right, 2 of 3 gold found
    assert s["precision"] == pytest.approx(1.0)
    assert s["recall"] == pytest.approx(2 / 3)
    assert s["f1"] == pytest.approx(0.8)
    assert s["accuracy"] == pytest.approx(5 / 6)


# ------------------------------------------------------------------------------------------------- QA
def test_squad_normalisation_em_f1_hand_computed():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert exact_match("the Denver Broncos.", "Denver Broncos") == 1.0
    assert f1("Denver", "Denver Broncos") == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1("in the Denver Broncos stadium", "Denver Broncos") == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert f1("Broncos Denver", "Denver Broncos") == 1.0 and exact_match("Broncos Denver", "Denver Broncos") == 0
    golds = {"q1": ["Denver Broncos", "Broncos"], "q2": ["Santa Clara, California"], "q3": ["1999"]}
    preds = {"q1": "Broncos", "q2": "Santa Clara", "q3": "2000"}
    s = squad_scores(preds, golds)
    # q1: EM 1, F1 1; q2: EM 0, F1 = 2·1·(2/3)/(5/3) = 0.8; q3: 0, 0
    assert s["exact_match"] == pytest.approx(100 / 3)
    assert s["f1"] == pytest.approx(100 * 1.8 / 3)
    # v2.0: unanswerable gold → only the empty prediction scores
    s2 = squad_scores({"a": "", "b": "x", "c": ""}, {"a": [], "b": [], "c": ["Paris"]})
    assert s2["exact_match"] == pytest.approx(100 / 3) and s2["f1"] == pytest.approx(100 / 3)
    assert s2["NoAns_total"] == 2 and s2["NoAns_exact"] == 50.0 and s2["HasAns_exact"] == 0.0


def _oracle(wins):
    """Logits that peak at each window's labelled (start, end) tokens."""
    st, en = [], []
    for w in wins:
        s = np.full(len(w["input_ids"]), -5.0)
        e = np.full(len(w["input_ids"]), -5.0)
        s[w["start_positions"]] += 10
        e[w["end_positions"]] += 10
        st.append(s)
        en.append(e)
    return st, en


@pytest.mark.parametrize("answer", ["café", "Zürich", "in   Zürich", "Ça  va", "1999"])
def test_answer_offsets_map_back_to_exact_original_characters(minilm_dir, answer):
    tok = load_tokenizer(minilm_dir)  # real uncased WordPiece: lower-cases and strips accents
    ctx = "The  café\u00a0opened in   Zürich in 1999.\n\n« Ça  va », said Renée."
    s = ctx.index(answer)
    ex = QAExample("q", "Where did it open?", ctx, [{"text": answer, "answer_start": s}])
    wins = encode_qa_windows(tok, [ex], 64, 16)
    w = wins[0]
    assert w["start_positions"] > 0
    got = ctx[w["offsets"][w["start_positions"]][0]:w["offsets"][w["end_positions"]][1]]
    assert got == answer
    pred = decode_answers([ex], wins, *_oracle(wins))[0]
    assert pred["answer"] == answer and pred["start"] == s


def test_real_squad_answers_roundtrip_through_token_offsets(minilm_dir, data_dir):
    tok = load_tokenizer(minilm_dir)
    ex = read_squad(data_dir / "squad" / "dev-v1.1.json", max_samples=400)
    wins = encode_qa_windows(tok, ex, 384, 128)
    ok = 0
    wins = [w for w in wins if w["start_positions"] > 0]
    assert len({w["example_index"] for w in wins}) == 400  # every answer lies in some window
    for w in wins:
        e = ex[w["example_index"]]
        got = e.context[w["offsets"][w["start_positions"]][0]:w["offsets"][w["end_positions"]][1]]
        if normalize_answer(got) == normalize_answer(e.answers[0]["text"]):
            ok += 1
        else:  # the gold span cuts a word ("8" of "18", "gold" of "golden"): we get the whole token
            a = e.answers[0]
            b, t = w["offsets"][w["start_positions"]][0], w["offsets"][w["end_positions"]][1]
            assert b <= a["answer_start"] and a["answer_start"] + len(a["text"]) <= t and got != a["text"]
    assert ok / len(wins) > 0.97


@pytest.mark.parametrize("max_seq_len", [2, 3, 5, 8, 16, 20])
def test_a_window_too_short_for_the_question_is_a_data_error(minilm_dir, data_dir, max_seq_len):
    """At 2–3 tokens the tokenizer keeps each pair whole (~80-token windows) instead of failing; both that
    and its truncation error become one DataError, and no window ever exceeds max_seq_len. At 16–20 the
    default stride is not below the room the longest question leaves, where the tokenizer panics (a Rust
    panic, not an Exception): also a DataError."""
    tok = load_tokenizer(minilm_dir)
    ex = read_squad(data_dir / "squad" / "dev-v1.1.json", max_samples=20)
    with pytest.raises(DataError, match=f"max_seq_len={max_seq_len}.*raise --max-seq-len"):
        encode_qa_windows(tok, ex, max_seq_len, min(128, max_seq_len // 3))
    assert max(len(w["input_ids"]) for w in encode_qa_windows(tok, ex, 64, 16)) <= 64


def test_context_longer_than_window_still_finds_its_answer(minilm_dir):
    tok = load_tokenizer(minilm_dir)
    filler = " ".join(f"Sentence number {i} talks about nothing in particular." for i in range(60))
    ctx = filler + " The treasure is buried under the old oak tree. " + filler
    ans = "under the old oak tree"
    ex = QAExample("q", "Where is the treasure?", ctx, [{"text": ans, "answer_start": ctx.index(ans)}])
    wins = encode_qa_windows(tok, [ex], 128, 32)
    assert len(tok.encode(ctx).ids) > 600 and len(wins) > 6
    assert all(len(w["input_ids"]) <= 128 for w in wins)
    a0 = ctx.index(ans)
    a1 = a0 + len(ans)
    # independently of the labeller: a window holds the answer when its context span covers it
    holds = [i for i, w in enumerate(wins)
             if min(o[0] for o in w["offsets"] if o) <= a0 and max(o[1] for o in w["offsets"] if o) >= a1]
    labelled = [i for i, w in enumerate(wins) if w["start_positions"] > 0]
    assert holds and labelled == holds  # exactly the windows that hold the whole answer are labelled
    for w in wins:  # every window starts with the question, and contexts overlap by the stride
        assert tok.decode(w["input_ids"][1:6]).startswith("where is the treasure")
    pred = decode_answers([ex], wins, *_oracle(wins))[0]
    assert pred["answer"] == ans
    # and the decoder ignores windows with higher scores on [CLS] / the question (v1.1)
    st, en = _oracle(wins)
    for s, e in zip(st, en):
        s[1:4] += 3.0  # question tokens
        e[1:4] += 3.0
    assert decode_answers([ex], wins, st, en)[0]["answer"] == ans


def test_nbest_respects_max_answer_len_and_v2_null():
    ctx = "a b c d e f"
    ex = QAExample("q", "what?", ctx, [])
    offs = [None, None, None] + [(i * 2, i * 2 + 1) for i in range(6)] + [None]
    win = {"example_index": 0, "offsets": offs}
    s = np.array([0, 0, 0, 5, 0, 0, 0, 0, 0, 0.0])
    e = np.array([0, 0, 0, 0, 0, 0, 0, 0, 6, 0.0])  # best end 5 tokens after best start
    assert decode_answers([ex], [win], [s], [e], max_answer_len=10)[0]["answer"] == "a b c d e f"
    e2 = e.copy()
    e2[4] = 2.0
    assert decode_answers([ex], [win], [s], [e2], max_answer_len=3)[0]["answer"] == "a b"
    # v2.0: null score 20 beats span 11 → empty answer; v1.1 always answers
    s3, e3 = s.copy(), e.copy()
    s3[0] = e3[0] = 10.0
    assert decode_answers([ex], [win], [s3], [e3], version_2=True)[0]["answer"] == ""
    assert decode_answers([ex], [win], [s3], [e3], version_2=False)[0]["answer"] == "a b c d e f"


def test_a_start_token_is_decoded_only_from_its_max_context_window():
    """BERT's run_squad.py rule, hand-worked: context "a b c d e f"; window A holds a–d, window B c–f.
    "d" has min(3, 0) = 0 tokens of context on one side in A and min(1, 2) = 1 in B, so B is its home:
    A's high score for the span "d" is not used, and B's best span wins. "c" has min(2, 1) = 1 in A
    against min(0, 3) = 0 in B, so A is its home and A may still answer a span starting at "c"."""
    from bertforge.data.squad import max_context_windows
    ctx = "a b c d e f"
    ex = QAExample("q", "what?", ctx, [])
    tok = [(i * 2, i * 2 + 1) for i in range(6)]
    win_a = {"example_index": 0, "offsets": [None, None] + tok[0:4] + [None]}
    win_b = {"example_index": 0, "offsets": [None, None] + tok[2:6] + [None]}
    assert max_context_windows([win_a, win_b]) == {tok[0]: 0, tok[1]: 0, tok[2]: 0, tok[3]: 1, tok[4]: 1,
                                                   tok[5]: 1}
    s_a, e_a = np.full(7, -10.0), np.zeros(7)
    s_a[5] = e_a[5] = 10.0  # "d" in A: score 20
    s_b, e_b = np.zeros(7), np.zeros(7)
    s_b[4] = e_b[4] = 4.0  # "e" in B: score 8
    pred = decode_answers([ex], [win_a, win_b], [s_a, s_b], [e_a, e_b])[0]
    assert pred["answer"] == "e" and pred["score"] == 8.0
    s_a[4] = 6.0  # start "c" in A (its home) + end "d": score 16 beats "e"
    assert decode_answers([ex], [win_a, win_b], [s_a, s_b], [e_a, e_b])[0]["answer"] == "c d"
    # one window: every token is at home there
    assert decode_answers([ex], [win_a], [s_a], [e_a])[0]["answer"] == "d"


def test_split_by_article_is_deterministic_and_disjoint(data_dir, tmp_path, capsys):
    data = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text())
    assert main(["qa-split", "--data", str(data_dir / "squad" / "dev-v1.1.json"), "--out-dir",
                 str(tmp_path)]) == 0
    tr, ev = (json.loads((tmp_path / f).read_text()) for f in ("train.json", "eval.json"))
    tr2, ev2 = split_by_article(data, 0.2, seed=0)
    assert [a["title"] for a in ev["data"]] == [a["title"] for a in ev2["data"]]
    t_tr = {a["title"] for a in tr["data"]}
    t_ev = {a["title"] for a in ev["data"]}
    assert not (t_tr & t_ev) and len(t_tr) + len(t_ev) == 48

    def nq(d):
        return sum(len(p["qas"]) for a in d["data"] for p in a["paragraphs"])
    assert nq(tr) + nq(ev) == 10570
    assert 0.2 <= nq(ev) / 10570 < 0.3
    tr3, ev3 = split_by_article(data, 0.2, seed=0)
    assert tr3 == tr and ev3 == ev  # the command writes exactly the function's split
    assert [a["title"] for a in split_by_article(data, 0.2, seed=1)[1]["data"]] != \
        [a["title"] for a in ev["data"]]


# ----------------------------------------------------------------------------------------- HF interop
@pytest.mark.parametrize("head,auto,num_labels", [
    ("token_classification", T.AutoModelForTokenClassification, 5),
    ("question_answering", T.AutoModelForQuestionAnswering, 2)])
def test_heads_load_in_transformers_with_equal_logits(tmp_path, head, auto, num_labels):
    d = tiny_model_dir(tmp_path, head, num_labels)
    ours = load_pretrained(d).eval()
    assert ours.head_name == head
    ref = auto.from_pretrained(str(d)).eval()
    ids = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11, 3], [2, 12, 13, 14, 3, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        a = ours(ids, mask).logits
        b = ref(input_ids=ids, attention_mask=mask)
    m = mask.bool()
    if head == "token_classification":
        assert a.shape == (2, 9, num_labels)
        assert (a - b.logits)[m].abs().max() < 1e-5
        assert (a[~m] == 0).all()
    else:
        assert a.shape == (2, 2, 9)
        assert (a[:, 0] - b.start_logits)[m].abs().max() < 1e-5
        assert (a[:, 1] - b.end_logits)[m].abs().max() < 1e-5
        assert (a[:, 0][~m] < -1e3).all()
    # and back: a transformers-saved dir loads into ours with the same logits
    ref.save_pretrained(tmp_path / "back")
    again = load_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert (again(ids, mask).logits - a)[m.unsqueeze(1).expand_as(a) if a.shape[1] == 2 else m].abs().max() < 1e-5


# ------------------------------------------------------------------------------- tiny CLI end-to-end
def _ner_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(["the", "cafe", "opened", "and", "went", "to", "paris", "Johnson"])
                 for _ in range(rng.randint(3, 9))]
        tags = ["B-LOC" if w == "paris" else "B-PER" if w == "Johnson" else "O" for w in words]
        rows.append({"tokens": words, "tags": tags})
    return rows


def test_ner_finetune_evaluate_predict_cli(tmp_path, capsys):
    d = tiny_model_dir(tmp_path)
    tr, ev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    tr.write_text("".join(json.dumps(r) + "\n" for r in _ner_rows(400, 0)))
    ev.write_text("".join(json.dumps(r) + "\n" for r in _ner_rows(60, 1)))
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(d), "--task", "ner", "--train", str(tr), "--eval", str(ev),
                 "--out", str(out), "--epochs", "3", "--batch-size", "16", "--lr", "3e-3",
                 "--max-seq-len", "32", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(ev)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["f1"] > 0.95, res  # a learnable rule: paris → LOC, Johnson → PER
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["BertForTokenClassification"]
    assert set(cfg["id2label"].values()) == {"O", "B-LOC", "I-LOC", "B-PER", "I-PER"}
    pr = tmp_path / "pred.jsonl"
    assert main(["predict", "--model", str(out), "--data", str(ev), "--out", str(pr)]) == 0
    rows = [json.loads(x) for x in pr.read_text().splitlines()]
    gold = _ner_rows(60, 1)
    assert len(rows) == 60 and all(len(r["tags"]) == len(r["tokens"]) for r in rows)
    assert sum(r["tags"] == g["tags"] for r, g in zip(rows, gold)) >= 57


def _qa_squad(n, seed):
    rng = random.Random(seed)
    paras = []
    for i in range(n):
        words = [rng.choice(["the", "cafe", "opened", "and", "went", "to", "a", "b", "c"])
                 for _ in range(rng.randint(4, 30))]
        words.insert(rng.randint(0, len(words)), "zebra")
        ctx = " ".join(words)
        paras.append({"context": ctx, "qas": [{"id": f"q{seed}-{i}", "question": "what is the answer?",
                                                "answers": [{"text": "zebra",
                                                             "answer_start": ctx.index("zebra")}]}]})
    return {"version": "1.1", "data": [{"title": f"t{seed}", "paragraphs": paras}]}


def _qa_files(tmp_path):
    """A tiny model dir and synthetic SQuAD train (300 questions) / dev (40) files."""
    d = tiny_model_dir(tmp_path)
    tr, ev = tmp_path / "train.json", tmp_path / "dev.json"
    tr.write_text(json.dumps(_qa_squad(300, 0)))
    ev.write_text(json.dumps(_qa_squad(40, 1)))
    return d, tr, ev


def test_qa_finetune_evaluate_predict_cli(tmp_path, capsys):
    d, tr, ev = _qa_files(tmp_path)
    out = tmp_path / "run"
    # max-seq-len 24 < most contexts: answers must be found across windows
    assert main(["finetune", "--model", str(d), "--task", "squad", "--train", str(tr), "--eval", str(ev),
                 "--out", str(out), "--epochs", "3", "--batch-size", "16", "--lr", "3e-3",
                 "--max-seq-len", "24", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(ev)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["exact_match"] > 90 and res["f1"] > 90, res
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    pr = tmp_path / "pred.jsonl"
    assert main(["predict", "--model", str(out), "--data", str(ev), "--out", str(pr)]) == 0
    rows = [json.loads(x) for x in pr.read_text().splitlines()]
    assert len(rows) == 40 and sum(r["answer"] == "zebra" for r in rows) >= 36
    assert {"id", "question", "answer", "start", "score"} <= set(rows[0])


# ---------------------------------------------------------------------------------------- distillation
@pytest.mark.parametrize("head,num_labels", [("token_classification", 5), ("question_answering", 2)])
def test_kd_on_token_and_span_logits_ignores_padding(tmp_path, head, num_labels):
    from bertforge.distillation.losses import kd_loss
    cfg = ModelConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
                      add_pooling_layer=False)
    torch.manual_seed(0)
    teacher, student = TaskModel(cfg, head=head).eval(), TaskModel(cfg, head=head).eval()
    a, b = [2, 5, 6, 7, 8, 9, 3], [2, 12, 13, 3]
    ids = torch.tensor([a, b + [0] * 3])
    mask = (ids != 0).long()
    with torch.no_grad():
        both = kd_loss(student(ids, mask).logits, teacher(ids, mask).logits, temperature=2.0, mask=mask)
        one = [kd_loss(student(torch.tensor([x])).logits, teacher(torch.tensor([x])).logits, temperature=2.0,
                       mask=torch.ones(1, len(x), dtype=torch.long)) for x in (a, b)]
    if head == "token_classification":
        # a KL per tag distribution, averaged over the 11 real tokens (as the hard tag loss): the padded
        # batch equals the token-weighted mean of the unpadded examples; padding adds nothing
        want = (one[0] * len(a) + one[1] * len(b)) / (len(a) + len(b))
        # by hand: T² · mean over real tokens of KL(p_T ‖ p_S) at T = 2
        with torch.no_grad():
            pt = torch.softmax(teacher(ids, mask).logits / 2, -1)
            ls = torch.log_softmax(student(ids, mask).logits / 2, -1)
        kl = (pt * (pt.log() - ls)).sum(-1)[mask.bool()]
        assert both.item() == pytest.approx(4 * kl.mean().item(), rel=1e-4)
    else:  # QA: the mean over the start and end distributions of each example
        want = (one[0] + one[1]) / 2
    assert both.item() == pytest.approx(want.item(), rel=1e-4)
    assert both.item() > 0


def test_ner_distill_cli_from_a_finetuned_teacher(tmp_path, capsys):
    d = tiny_model_dir(tmp_path)
    tr, ev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    tr.write_text("".join(json.dumps(r) + "\n" for r in _ner_rows(400, 0)))
    ev.write_text("".join(json.dumps(r) + "\n" for r in _ner_rows(60, 1)))
    teacher = tmp_path / "teacher"
    assert main(["finetune", "--model", str(d), "--task", "ner", "--train", str(tr), "--out", str(teacher),
                 "--epochs", "3", "--batch-size", "16", "--lr", "3e-3", "--max-seq-len", "32",
                 "--no-progress"]) == 0
    student = tmp_path / "student"
    # 1-layer student copied from the teacher's layer 0; KD (α = 0.5: soft tags + hard tags)
    assert main(["distill", "--teacher", str(teacher), "--student", "layers:0", "--task", "ner", "--train",
                 str(tr), "--eval", str(ev), "--out", str(student), "--epochs", "2", "--batch-size", "16",
                 "--lr", "3e-3", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(student), "--data", str(ev)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cfg = json.loads((student / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["architectures"] == ["BertForTokenClassification"]
    assert res["f1"] > 0.9, res


def test_squad_v2_unanswerable_questions_load_as_cls_and_v1_refuses_them(tmp_path):
    from bertforge.tasks import adapter_for, get_task
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "John lives in Zurich.", "qas": [
        {"id": "a", "question": "Where does John live?", "is_impossible": False,
         "answers": [{"text": "Zurich", "answer_start": 14}]},
        {"id": "b", "question": "Where does Mary live?", "is_impossible": True, "answers": []}]}]}]}
    p = tmp_path / "v2.json"
    p.write_text(json.dumps(data))
    tok = tiny_tokenizer()
    wins = adapter_for(get_task("squad_v2"), tok, 32).load(p)
    by_q = {wins.examples[w["example_index"]].id: (w["start_positions"], w["end_positions"]) for w in wins}
    assert by_q["b"] == (0, 0) and by_q["a"][0] > 0
    with pytest.raises(DataError, match="squad_v2"):
        adapter_for(get_task("squad"), tok, 32).load(p)


@pytest.mark.parametrize("family", ["roberta", "electra", "distilbert", "albert"])
@pytest.mark.parametrize("head,auto", [("token_classification", T.AutoModelForTokenClassification),
                                       ("question_answering", T.AutoModelForQuestionAnswering)])
def test_heads_match_transformers_for_every_family(tmp_path, family, head, auto):
    kw = dict(model_type=family, vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
              num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
              num_labels=3 if head == "token_classification" else 2, add_pooling_layer=False)
    if family == "roberta":
        kw.update(pad_token_id=1, type_vocab_size=1)
    if family == "distilbert":
        kw.update(type_vocab_size=0)
    if family in ("electra", "albert"):
        kw.update(embedding_size=16)
    torch.manual_seed(0)
    m = TaskModel(ModelConfig(**kw), head=head).eval()
    m.save_pretrained(tmp_path / "d", tokenizer=tiny_tokenizer())
    ref = auto.from_pretrained(str(tmp_path / "d")).eval()
    ids = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 12, 13, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        a = m(ids, mask).logits
        b = ref(input_ids=ids, attention_mask=mask)
    mm = mask.bool()
    if head == "token_classification":
        assert (a - b.logits)[mm].abs().max() < 1e-5
    else:
        assert max((a[:, 0] - b.start_logits)[mm].abs().max(), (a[:, 1] - b.end_logits)[mm].abs().max()) < 1e-5


def test_qa_distill_cli_on_start_end_logits(tmp_path, capsys):
    d, tr, ev = _qa_files(tmp_path)
    teacher = tmp_path / "teacher"
    assert main(["finetune", "--model", str(d), "--task", "squad", "--train", str(tr), "--out", str(teacher),
                 "--epochs", "3", "--batch-size", "16", "--lr", "3e-3", "--max-seq-len", "24",
                 "--no-progress"]) == 0
    student = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher), "--student", "layers:0", "--task", "squad", "--alpha",
                 "1", "--train", str(tr), "--eval", str(ev), "--out", str(student), "--epochs", "3",
                 "--batch-size", "16", "--lr", "3e-3", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(student), "--data", str(ev)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((student / "config.json").read_text())["num_hidden_layers"] == 1
    assert res["f1"] > 80, res


def test_a_sentence_per_line_file_is_not_read_as_conll(tmp_path):
    from bertforge.data.conll import read_conll
    from bertforge.errors import DataError
    f = tmp_path / "dev.tsv"
    f.write_text("sentence\tlabel\nit is a good film\t1\n")
    with pytest.raises(DataError, match=r"dev.tsv:2 holds tab-separated cells of several words"):
        read_conll(f)


def test_evaluate_on_a_tag_the_model_never_learnt_says_so(tmp_path, cli_error):
    """`evaluate` on a file with a tag outside the model's tag set: the tag set is the model's, so the
    message names it and the model (not "pass data.labels=[...]", which evaluate does not accept)."""
    tags = ["O", "B-PER", "B-LOC"]
    cfg = ModelConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, num_labels=3,
                      id2label=dict(enumerate(tags)), add_pooling_layer=False)
    m = TaskModel(cfg, head="token_classification")
    m.config.bertforge = {"task": "ner", "max_seq_len": 32}
    d = tmp_path / "ner"
    m.save_pretrained(d, tokenizer=tiny_tokenizer())
    f = tmp_path / "org.jsonl"
    f.write_text(json.dumps({"tokens": ["the", "cafe"], "tags": ["B-ORG", "O"]}) + "\n")
    line = cli_error(["evaluate", "--model", d, "--data", f], d)
    assert f"has tags ['B-ORG'] that {d} was not fine-tuned on (its tags: ['O', 'B-PER', 'B-LOC'])" in line


def test_a_squad_model_evaluates_on_squad_v2_data(tmp_path, capsys):
    """QA heads have two outputs, start and end, whatever id2label calls them: `evaluate --task squad_v2` on a
    model fine-tuned on squad is not a label mismatch ("labels LABEL_0, LABEL_1 … labels start, end") and
    scores (EM/F1 with HasAns/NoAns)."""
    d = tiny_model_dir(tmp_path, head="question_answering")
    cfg = json.loads((d / "config.json").read_text())
    cfg["bertforge"] = {**(cfg.get("bertforge") or {}), "task": "squad", "max_seq_len": 32}
    (d / "config.json").write_text(json.dumps(cfg))
    ctx = "the answer is zebra ."
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [
        {"id": "a", "question": "what is the answer ?", "is_impossible": False,
         "answers": [{"text": "zebra", "answer_start": ctx.index("zebra")}]},
        {"id": "b", "question": "where went paris ?", "is_impossible": True, "answers": []}]}]}]}
    f = tmp_path / "v2.json"
    f.write_text(json.dumps(data))
    assert main(["evaluate", "--model", str(d), "--task", "squad_v2", "--data", str(f)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"exact_match", "f1"} <= set(res)
