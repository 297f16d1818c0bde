"""``/predict`` reads a text at the length the model was fine-tuned with, as ``bertforge predict`` does (issue 49,
found by a fresh-user trial: a 32-token SST-2 model answered 0.5196 on ``/predict`` and 0.5327 in ``predict`` for a
150-word text, the server reading 512 tokens and ``predict`` the dir's ``max_seq_len``).

Independent truth: the probabilities ``bertforge.predict`` writes for the same texts (its own encoder path and
runner) and, for the length itself, the token count of the tokenizer."""
import json
import urllib.request

import numpy as np

from helpers import WORDS


def _post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def test_predict_route_cuts_a_long_text_where_predict_does(workspace, tmp_path):
    import bertforge
    from bertforge.checkpoint.modeldir import ModelDir
    md = ModelDir.open(workspace.run)
    trained, positions = md.meta.max_seq_len, md.positions
    assert trained < positions  # the run was fine-tuned shorter than its positions: the case that differed
    assert md.task_max_length() == trained
    long_text = " ".join(WORDS[i % len(WORDS)] for i in range(3 * positions // 2))
    texts = [long_text, "a short text", " ".join(WORDS[: trained + 5])]
    n_tokens = len(md.tokenizer().encode(long_text).ids)
    assert n_tokens > positions  # longer than both lengths: cut in both tools
    data = tmp_path / "texts.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\t0\n" for t in texts), encoding="utf-8")
    out = tmp_path / "preds.jsonl"
    bertforge.predict(workspace.run, data, out=out)
    offline = [json.loads(x) for x in out.read_text().splitlines()]
    with bertforge.serve(workspace.run, auto_truncate=True) as srv:
        info = json.load(urllib.request.urlopen(srv.url + "/info", timeout=30))["models"][0]
        assert info["task_max_length"] == trained and info["max_input_length"] == positions
        served = _post(srv.url + "/predict", {"inputs": [[t] for t in texts]})
    for o, s in zip(offline, served):
        top = s[0]
        assert top["label"] == o["label"]
        assert abs(top["score"] - o["prob"]) < 1e-5, (top, o)
    # sharper, on logits, against the server itself: the long text answers exactly what the same text cut by the
    # tokenizer at `trained` tokens answers (the same ids through the same runner); that the two lengths give two
    # answers at all is checked on the runner (cut at `trained` vs at `positions`, what the server read before)
    from bertforge.runtime import load_runner
    from bertforge.tokenizer import encode_texts
    runner = load_runner(workspace.run)

    def runner_logits(n):
        e = encode_texts(runner.tokenizer, [long_text], max_length=n)[0]
        return runner(np.array([e.ids]), np.ones((1, len(e.ids)), dtype=np.int64))["logits"][0].astype(float)

    assert np.abs(runner_logits(trained) - runner_logits(positions)).max() > 5e-6
    tok = md.tokenizer()
    pieces = tok.encode(long_text, add_special_tokens=False).ids
    cut_trained = tok.decode(pieces[: trained - tok.num_special_tokens_to_add(False)])
    assert len(tok.encode(cut_trained).ids) == trained
    names = md.config["id2label"]

    def logits(answer):
        return np.array([next(x["score"] for x in answer if x["label"] == names[str(i)]) for i in range(len(names))])

    with bertforge.serve(workspace.run, auto_truncate=True) as srv:
        got, at_trained = (logits(_post(srv.url + "/predict", {"inputs": t, "raw_scores": True}))
                           for t in (long_text, cut_trained))
    assert np.abs(got - at_trained).max() < 1e-7, (got, at_trained)
