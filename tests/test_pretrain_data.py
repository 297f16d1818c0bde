"""Tokenizer training and the corpus pipeline (documents, sentences, cache, FULL-/DOC-SENTENCES; a sentence
longer than a sequence is split at word starts, not cut)."""
import numpy as np
import pytest

from bertforge.data.corpus import (PretrainDataset, TokenizedCorpus, iter_documents, split_documents,
                                   split_sentences)
from bertforge.data.tokenizers_train import KINDS, SPECIALS, min_vocab_size, train_tokenizer
from bertforge.errors import ConfigError, DataError

from helpers import sentences

WIKI = """ = Alpha Article = 
 
 Alpha is a town in the north . It has a river . The river is long and wide . 
 
 = = History = = 
 
 The town was founded in 1850 . Many people moved there . 
 
 = Beta Article = 
 
 Beta is a village . It is small . Nobody knows why the village exists . 
"""

TEXT = ["The quick brown fox jumps over the lazy dog.", "Unbelievable things happened yesterday!",
        "She sells sea shells by the sea shore.", "Mr. Smith went to Washington in 1999."] * 50


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_kinds(kind):
    tok = train_tokenizer(kind, iter(TEXT), vocab_size=300, min_frequency=1)
    assert tok.get_vocab_size() <= 300
    for i, s in enumerate(SPECIALS[kind]):
        assert tok.token_to_id(s) == i  # the family's special-token ids
    enc = tok.encode("unbelievable shells", "the fox")
    cls = SPECIALS[kind][0] if kind == "bpe" else "[CLS]"
    assert enc.tokens[0] == cls
    # word ids group sub-tokens of one word (whole-word masking reads them)
    wid = [w for w in enc.word_ids if w is not None]
    assert len(set(wid)) < len(wid) or kind == "wordpiece-cased"
    if kind == "wordpiece":
        assert tok.encode("THE").tokens[1] == "the"  # uncased
    if kind == "wordpiece-cased":
        assert tok.encode("The").tokens[1] == "The"
    if kind != "bpe":
        assert enc.type_ids[-1] == 1  # segment B


def test_tokenizer_errors():
    with pytest.raises(ConfigError):
        train_tokenizer("sentencepiece", iter(TEXT), 300)
    with pytest.raises(ConfigError):
        train_tokenizer("wordpiece", iter(TEXT), 10)


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_vocab_floor(kind):
    """Byte-level BPE always holds its 256 byte symbols + 5 specials (--vocab-size 100 cannot give a
    100-token model: it would be a 261-token model without a word); below each kind's floor the error names
    it."""
    need = min_vocab_size(kind)
    assert need == (261 if kind == "bpe" else 69)
    with pytest.raises(ConfigError, match=f"use at least {need}"):
        train_tokenizer(kind, iter(TEXT), need - 1, min_frequency=1)
    assert train_tokenizer(kind, iter(TEXT), need, min_frequency=1).get_vocab_size() <= need


def test_tokenizer_more_characters_than_vocab():
    """A corpus with 300 distinct characters: WordPiece keeps them all whatever the budget and Unigram's
    trainer raised a bare Exception; both now refuse in one line with the size that works."""
    rng = np.random.default_rng(0)
    chars = [chr(0x4E00 + i) for i in range(300)]
    lines = ["".join(rng.choice(chars, 40)) for _ in range(400)]
    assert len(set("".join(lines))) == 300
    with pytest.raises(ConfigError, match="came out with 305 tokens.*use --vocab-size 305"):
        train_tokenizer("wordpiece", iter(lines), 100)
    assert train_tokenizer("wordpiece", iter(lines), 305).get_vocab_size() == 305
    # Unigram: 300 characters + "▁" + 5 specials + 1; one less fails inside the trainer
    for v in (100, 306):
        with pytest.raises(ConfigError, match="unigram tokenizer needs 307 tokens.*use --vocab-size 307"):
            train_tokenizer("unigram", iter(lines), v)
    assert train_tokenizer("unigram", iter(lines), 307).get_vocab_size() <= 307


def test_sentences_and_documents(tmp_path):
    assert split_sentences("Mr. Smith came. He left! Did he? yes.") == ["Mr. Smith came.", "He left!",
                                                                       "Did he? yes."]
    f = tmp_path / "wiki.raw"
    f.write_text(WIKI)
    docs = list(iter_documents(str(f)))  # auto → WikiText headings
    assert len(docs) == 2
    assert docs[0][0].startswith("Alpha is a town") and len(docs[0]) == 5
    assert docs[1] == ["Beta is a village .", "It is small .", "Nobody knows why the village exists ."]
    g = tmp_path / "blank.txt"
    g.write_text("One. Two.\n\nThree.\nFour.\n")
    assert list(iter_documents(str(g), "blank")) == [["One.", "Two."], ["Three.", "Four."]]
    assert list(iter_documents(str(g), "file")) == [["One.", "Two.", "Three.", "Four."]]


def test_corpus_cache_and_packing(tmp_path):
    files = []
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "river", "town", "village", "north"]
    for d in range(3):
        f = tmp_path / f"doc{d}.txt"
        sents = [" ".join(rng.choice(words, size=int(rng.integers(3, 12)))).capitalize() + "."
                 for _ in range(40)]
        f.write_text(" ".join(sents) + "\n")
        files.append(str(f))
    tok = train_tokenizer("wordpiece", iter(open(f).read() for f in files), 200, min_frequency=1)
    c = TokenizedCorpus.build(files, tok, tmp_path / "cache")
    assert len(np.unique(c.doc)) == 3 and len(c) == 120
    again = TokenizedCorpus.build(files, tok, tmp_path / "cache")
    assert again.path == c.path  # cached: not rebuilt
    assert isinstance(c.ids, np.memmap)
    # the corpus round-trips to the tokenizer's own encoding
    enc = tok.encode(split_sentences(open(files[0]).read())[0], add_special_tokens=False)
    assert c.ids[c.offsets[0]:c.offsets[1]].tolist() == enc.ids
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    full = PretrainDataset(c, "full", 64, cls, sep)
    doc = PretrainDataset(c, "doc", 64, cls, sep)
    total_full = sum(len(full[i]["input_ids"]) - 2 for i in range(len(full)))
    total_doc = sum(len(doc[i]["input_ids"]) - 2 for i in range(len(doc)))
    n_tok = c.num_tokens
    assert total_doc == n_tok  # every token served exactly once
    crossing = 0
    for i in range(len(full)):
        a0, a1 = full.index[i, :2]
        ids = full[i]["input_ids"]
        assert len(ids) <= 64 and ids[0] == cls and ids[-1] == sep
        n_docs = len(np.unique(c.doc[full.sent[a0:a1]]))
        assert (ids == sep).sum() == 1 + (n_docs - 1)  # an extra [SEP] between documents
        crossing += n_docs > 1
    assert crossing >= 1 and total_full == n_tok + crossing
    for i in range(len(doc)):
        a0, a1 = doc.index[i, :2]
        assert len(np.unique(c.doc[doc.sent[a0:a1]])) == 1  # DOC-SENTENCES never crosses
    assert len(full) <= len(doc)
    tr, ev = split_documents(c, 0.1, 0)
    assert ev.sum() == 12 and not (tr & ev).any()  # the last 10% of every document is held out


def test_auto_doc_sep_and_nsp_needs_two_documents(tmp_path):
    # one sentence per line, blank lines between documents (BERT's format) → two documents
    g = tmp_path / "bert_format.txt"
    g.write_text("Alpha river runs north.\nIt is long.\n\nBeta town is small.\nNobody lives there.\n")
    assert len(list(iter_documents(str(g)))) == 2
    # a hard-wrapped book (lines do not end sentences) stays one document per file
    b = tmp_path / "book.txt"
    b.write_text("It was a dark and stormy\nnight and the rain fell\n\nin torrents except at\nintervals.\n")
    assert len(list(iter_documents(str(b)))) == 1
    # NSP cannot draw negatives from another document when there is only one: refuse, don't fake
    tok = train_tokenizer("wordpiece", iter([b.read_text()]), 100, min_frequency=1)
    c = TokenizedCorpus.build([str(b)], tok, tmp_path / "cache")
    with pytest.raises(DataError, match="NSP needs at least two documents"):
        PretrainDataset(c, "nsp", 64, tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]"))


def test_wordpiece_training_is_reproducible_and_ids_do_not_change_segmentation(data_dir, monkeypatch):
    """``tokenizers`` numbers equal-count merges in a per-process random order; the canonical re-numbering
    must give the same tokenizer every time and split text exactly as the trainer's own model does."""
    from bertforge.data import tokenizers_train as tt
    lines = (data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_text(encoding="utf-8").splitlines()[:3000]
    runs = [train_tokenizer("wordpiece", iter(lines), vocab_size=2000) for _ in range(3)]
    assert runs[0].to_str() == runs[1].to_str() == runs[2].to_str()
    monkeypatch.setattr(tt, "_canonical_wordpiece", lambda tok, specials: tok.model)
    raw = train_tokenizer("wordpiece", iter(lines), vocab_size=2000)
    assert set(raw.get_vocab()) == set(runs[0].get_vocab())
    sample = [ln for ln in lines[3000 - 400:] if ln.strip()]
    assert [e.tokens for e in raw.encode_batch(sample)] == [e.tokens for e in runs[0].encode_batch(sample)]


def _corpus(tmp_path, text: str):
    from tokenizers.implementations import BertWordPieceTokenizer
    from bertforge.data.corpus import TokenizedCorpus
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator([s for s, _ in sentences(200)], vocab_size=120, min_frequency=1)
    f = tmp_path / "c.txt"
    f.write_text(text)
    return TokenizedCorpus.build([f], wp._tokenizer, cache_dir=tmp_path / "cache"), wp._tokenizer


@pytest.mark.parametrize("mode", ["full", "doc", "sop"])
def test_a_sentence_longer_than_a_sequence_is_split_at_word_starts_and_fully_used(tmp_path, mode):
    from bertforge.data.corpus import PretrainDataset
    words = [s for s, _ in sentences(400, 3)]
    long_doc = " ".join(w.rstrip(".") for w in words[:200])  # one "sentence" of ~1000 words, no full stop
    text = long_doc + "\n\n" + ". ".join(words[200:260]) + ".\n\n" + " ".join(words[260:400]) + "\n"
    c, _ = _corpus(tmp_path, text)
    assert c.lengths.max() > 400  # the corpus really has sentences far longer than a sequence
    ds = PretrainDataset(c, mode, 64, 2, 3)
    cap = 64 - 3
    assert (ds.hi - ds.lo).max() <= cap
    assert (ds.hi - ds.lo).min() >= 1
    assert ds.lo[0] == 0 and ds.hi[-1] == c.num_tokens and (ds.lo[1:] == ds.hi[:-1]).all()  # a partition
    ws = np.asarray(c.word_starts)
    assert all(ws[o] == 1 for o in ds.lo)  # every piece starts at a word start (these words are short)
    if mode == "full":  # every corpus token lands in exactly one sequence
        served = sum(len(ds[i]["input_ids"]) - 2 for i in range(len(ds)))
        seps = sum(int((ds[i]["input_ids"][1:-1] == 3).sum()) for i in range(len(ds)))
        assert served - seps == c.num_tokens
    for i in range(len(ds)):
        assert len(ds[i]["input_ids"]) <= 64


def test_a_single_word_longer_than_a_piece_is_cut_mid_word(tmp_path):
    from bertforge.data.corpus import TokenizedCorpus, _pieces
    c, _ = _corpus(tmp_path, "x" * 400 + "\n")
    sent, lo, hi = _pieces(c, np.arange(len(c)), 10)
    assert (hi - lo).max() <= 10 and lo[0] == 0 and hi[-1] == c.num_tokens and (lo[1:] == hi[:-1]).all()
    assert isinstance(c, TokenizedCorpus) and (sent == 0).all()
