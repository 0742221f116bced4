"""modwire: modular attention networks (NAC, NI, NFM, AiT) and their baselines in PyTorch.

>>> import modwire
>>> model = modwire.create_model("nac_tiny_imagenet")   # NAC Table 4
>>> modwire.list_models()
"""
from .models import (NAC, PerceiverIO, create_model, from_pretrained, get_config, list_models,
                     model_source)

__version__ = "0.1.0"
__all__ = ["NAC", "PerceiverIO", "__version__", "create_model", "from_pretrained", "get_config",
           "list_models", "model_source"]
