"""Shared primitives: modulated linear layers, the signature kernel, attention, blocks, tokenizers."""
from .attention import AttentionBlock, ModulatedAttention, attend
from .blocks import ProcessorLayer, ReadIn, ReadOut
from .kernel import KernelBias, SignatureKernel, cosine_distance
from .modulated import FFNBlock, ModulatedFFN, ModulatedLinear
from .tokenizers import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer

__all__ = [
    "AttentionBlock", "ConvTokenizer", "EmbeddingTokenizer", "FFNBlock", "KernelBias", "LinearTokenizer",
    "ModulatedAttention", "ModulatedFFN", "ModulatedLinear", "ProcessorLayer", "ReadIn", "ReadOut",
    "SignatureKernel", "attend", "cosine_distance",
]
