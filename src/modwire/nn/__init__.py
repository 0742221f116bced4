"""Shared primitives: modulated linear layers, the signature kernel, attention, blocks, tokenizers."""
from .attention import AttentionBlock, ModulatedAttention, attend
from .block_sparse import (BlockSparseBias, BlockSparseLayout, block_order, block_sparse_attend,
                           order_by_groups)
from .blocks import ProcessorLayer, ReadIn, ReadOut
from .kernel import KernelBias, SignatureKernel, cosine_distance
from .modulated import FFNBlock, ModulatedFFN, ModulatedLinear
from .tokenizers import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer

__all__ = [
    "AttentionBlock", "BlockSparseBias", "BlockSparseLayout", "ConvTokenizer", "EmbeddingTokenizer",
    "FFNBlock", "KernelBias", "LinearTokenizer",
    "ModulatedAttention", "ModulatedFFN", "ModulatedLinear", "ProcessorLayer", "ReadIn", "ReadOut",
    "SignatureKernel", "attend", "block_order", "block_sparse_attend", "cosine_distance",
    "order_by_groups",
]
