"""Compression and deployment: structured head/FFN pruning and magnitude pruning (:mod:`.prune`),
PyTorch dynamic INT8 (:mod:`.quantize`), ONNX export + ONNX Runtime optimisation and INT8 (:mod:`.onnx`)."""
