"""Models, one file per system. Importing this package registers every preset."""
from . import ait, gan, lm, nac, neural_interpreter, perceiver_io, relational_cnn, resnet, vit  # noqa: F401  (registers presets)
from .ait import AiT, AiTConfig
from .axis import ModuleAxis
from .base import PretrainedModel
from .config import ModelConfig
from .inputs import InputSpec
from .nac import NAC, NACConfig
from .perceiver_io import PerceiverIO, PerceiverIOConfig
from .resnet import PreActResNet, PreActResNetConfig
from .registry import create_model, from_pretrained, get_config, list_models, model_source
from .set_model import SetModel, SetModelConfig
from .tokenizer_config import TokenizerConfig
from .vit import ViT, ViTConfig

__all__ = ["AiT", "AiTConfig", "NAC", "NACConfig", "InputSpec", "ModelConfig", "ModuleAxis", "PerceiverIO", "PerceiverIOConfig",
           "PreActResNet", "PreActResNetConfig", "PretrainedModel", "TokenizerConfig", "SetModel", "SetModelConfig", "ViT", "ViTConfig",
           "create_model", "from_pretrained", "get_config", "list_models", "model_source"]
