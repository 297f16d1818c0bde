"""Tiny MPNet models and padded batches for the MPNet tests (random weights, a WordPiece vocabulary)."""
from pathlib import Path

import torch

from helpers import sentences


def tiny_mpnet_config(**kw):
    """A ModelConfig of the mpnet family: H=32, 2 layers × 4 heads, 2 + 160 positions, no dropout."""
    from bertforge.config import ModelConfig
    base = dict(model_type="mpnet", vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=40, max_position_embeddings=162, pad_token_id=1, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, layer_norm_eps=1e-5, add_pooling_layer=False, num_labels=3)
    base.update(kw)
    return ModelConfig(**base)


def randomise(model, seed: int = 3) -> None:
    """Norm weights away from 1 and biases away from 0, so every weight reaches the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias") or "relative_attention_bias" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def padded_batch(lengths, seed: int = 0, vocab: int = 97, pad: int = 1):
    """Random ids (B, T) right-padded with ``pad`` after each length, and their 0/1 mask."""
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), t), generator=g)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, pad), mask


def make_tiny_mpnet(path: Path, head: str = "base", seed: int = 0, pooling=None, **kw) -> Path:
    """A randomly initialised MPNet dir with a WordPiece tokenizer trained on ``helpers.WORDS``."""
    from tokenizers.implementations import BertWordPieceTokenizer
    from bertforge.task_model import TaskModel
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator([s for s, _ in sentences(200)], vocab_size=120, min_frequency=1)
    tok = wp._tokenizer
    torch.manual_seed(seed)
    model = TaskModel(tiny_mpnet_config(vocab_size=tok.get_vocab_size(), **kw), head=head)
    randomise(model, seed)
    model.save_pretrained(path, tokenizer=tok, pooling=pooling)
    return Path(path)
