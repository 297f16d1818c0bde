"""python -m bertforge_lite B "text" ... — the answer of bundle B's model for each text, as JSON lines;
python -m bertforge_lite verify B — re-check its files and golden inputs. Errors: one line, exit 2."""
from __future__ import annotations

import argparse
import json
import sys


def _threads(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v}: a number of threads ≥ 1")
    return n


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="bertforge_lite", description=__doc__, allow_abbrev=False,
                                usage="python -m bertforge_lite BUNDLE TEXT [TEXT ...] [--model NAME] [--threads N]\n"
                                      "       python -m bertforge_lite verify BUNDLE [--threads N]")
    if argv[:1] == ["verify"]:
        p.add_argument("verify")
        p.add_argument("bundle")
        p.add_argument("--threads", type=_threads, default=1)
    else:
        p.add_argument("bundle")
        p.add_argument("texts", nargs="+", help="texts (QA: the question, then the context)")
        p.add_argument("--model", default=None, help="the bundle's model to run (when it holds several)")
        p.add_argument("--threads", type=_threads, default=None)
        p.add_argument("--aggregation", choices=("first", "average", "max"), default=None,
                       help="NER: a word's tag from its first sub-token, their average, or the max one "
                            "(default: the manifest's)")
    args = p.parse_args(argv)
    from .bundle import Bundle, BundleError, verify
    try:
        if argv[:1] == ["verify"]:
            print(json.dumps({"bundle": args.bundle, "ok": True, "max_abs_diff": verify(args.bundle, args.threads)}))
            return 0
        b = Bundle(args.bundle, args.model, threads=args.threads)
        if b.kind == "embedding":
            rows = [{"text": t, "embedding": [round(float(x), 6) for x in v]}
                    for t, v in zip(args.texts, b.embed(args.texts))]
        elif b.kind == "token_classification":
            rows = [{"text": t, "entities": e} for t, e in zip(args.texts, b.ner(args.texts,
                                                                                 aggregation=args.aggregation))]
        elif b.kind == "question_answering":
            if len(args.texts) != 2:
                raise BundleError("a QA bundle takes two texts: the question, then the context")
            rows = [b.qa(*args.texts)]
        else:
            rows = [{"text": t, **r} for t, r in zip(args.texts, b.classify(args.texts))]
    except (BundleError, ValueError, OSError) as e:
        sys.stderr.write(f"bertforge_lite: error: {e}\n")
        return 2
    for r in rows:
        print(json.dumps(r, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
