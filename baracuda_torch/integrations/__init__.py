"""Integrations with other libraries (each imports its library lazily):

* :mod:`baracuda_torch.integrations.huggingface`: ``apply_baracuda(model)`` for
  transformers models (install with the ``hf`` extra).
"""
