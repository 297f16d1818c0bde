"""bertforge: one PyTorch library and CLI for the BERT family.

Pretrain (BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT), fine-tune, distill (KD, DistilBERT, PKD, TinyBERT,
MiniLM), prune, quantize and benchmark — on one encoder core, one Trainer and Hugging Face checkpoint
directories in and out.
"""
__version__ = "0.1.0"

from .config import ModelConfig  # noqa: E402
from .errors import BertforgeError  # noqa: E402
from .hf import load_pretrained, save_pretrained  # noqa: E402
from .models.encoder import Encoder  # noqa: E402
from .models.heads import TaskModel  # noqa: E402

__all__ = ["ModelConfig", "BertforgeError", "Encoder", "TaskModel", "load_pretrained", "save_pretrained"]
