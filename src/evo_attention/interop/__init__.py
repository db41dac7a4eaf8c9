"""interop: the model outside the library: a model directory (``pretrained``: config.json,
model.safetensors, tokenizer.json, checksums), the standalone attention export (``export``: ships the
library's own module files), the Hugging Face model directory (``hf``) and a gene as a ``transformers``
attention function (``hf_attention``). A layer of its own between ``train`` and ``nn``: it imports
``nn``, ``data`` and below; ``train`` (saving models) and the layers above import it."""
