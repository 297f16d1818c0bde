"""ModernBERT at its longest inputs: a tiny random model (3 layers, local window 128, every 3rd layer global) on a
padded batch of 8,192 and 5,000 tokens, bertforge vs transformers' ModernBertModel (eager) on the same weights.
Prints the largest difference at real tokens, bertforge's forward time and the process's peak RSS.

Usage: python benchmarks/modernbert_long.py [--length 8192]
"""
import argparse
import resource
import tempfile
import time

import torch
import transformers as T

from bertforge.checkpoint import load_pretrained
from bertforge.hardware import cpu_flags


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=8192)
    args = ap.parse_args()
    print("# python benchmarks/modernbert_long.py --length", args.length)
    print("# cpu flags:", cpu_flags())
    torch.manual_seed(0)
    cfg = T.ModernBertConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                             num_attention_heads=4, max_position_embeddings=args.length, local_attention=128,
                             global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                             cls_token_id=None, sep_token_id=None, attn_implementation="eager")
    hf = T.ModernBertModel(cfg).eval()
    d = tempfile.mkdtemp()
    hf.save_pretrained(d)
    ours = load_pretrained(d, head="base").eval()
    lens = [args.length, args.length * 5 // 8]
    ids = torch.randint(1, 97, (2, args.length))
    mask = (torch.arange(args.length)[None] < torch.tensor(lens)[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    t = time.perf_counter()
    with torch.no_grad():
        a = ours(ids, mask).last_hidden_state
    dt = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.no_grad():
        b = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.bool()
    print(f"lengths {lens}: max |bertforge - transformers| at real tokens {(a[m] - b[m]).abs().max().item():.2e}; "
          f"bertforge forward {dt:.2f} s; peak RSS before the transformers forward {rss:.0f} MB")


if __name__ == "__main__":
    main()
