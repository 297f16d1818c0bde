"""bertforge_lite: run a bertforge bundle with onnxruntime, numpy and tokenizers — no torch, no bertforge.

    >>> from bertforge_lite import Bundle
    >>> Bundle("runs/student-bundle").embed(["a text"]).shape
"""
from .bundle import Bundle, BundleError, verify

__version__ = "0.1.0"
__all__ = ["Bundle", "BundleError", "verify", "__version__"]
