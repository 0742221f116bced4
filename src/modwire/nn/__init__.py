"""Shared primitives of all four papers: the attention kernel, signature kernels, modulated
linear layers, blocks, tokenizers, the AiT global workspace (a stateful layer), Neural Function
Modules (attention over earlier layers and passes around any sequence of blocks)."""
from .attention import AttentionPattern, ModulatedAttention, attend, mask_value, sparse_softmax
from .block_sparse import (BlockSparseBias, BlockSparseKernel, BlockSparseLayout, block_order,
                           block_sparse_attend, order_by_groups)
from .blocks import ReadIn, ReadOut, SelfAttention, TransformerBlock
from .init import init_linear_, trunc_normal_
from .kernel import (EdgeMaskedKernel, SignatureKernel, concrete_log_sample, cosine_distance,
                     normalize_log_kernel, signature_log_kernel, type_matching)
from .positions import RelativePositionBias, pad_bias
from .nfm import NFM, NFMLayer, NFMRecord, rescale
from .modulated import PLAIN, ModulatedFFN, ModulatedLinear, ModulationSpec, PreNorm, mlp
from .tokenizers import (ConvTokenizer, EmbeddingTokenizer, LinearTokenizer, NormLinearNorm, PanelEncoder,
                         PatchEmbedding)
from .workspace import GlobalWorkspace, WorkspaceRecord, balance_loss, hopfield_energy, init_memory

__all__ = [
    "PLAIN", "AttentionPattern", "NFM", "NFMLayer", "NFMRecord", "rescale", "sparse_softmax", "GlobalWorkspace", "WorkspaceRecord", "balance_loss", "hopfield_energy", "init_memory", "BlockSparseBias", "BlockSparseKernel", "BlockSparseLayout",
    "ConvTokenizer", "EdgeMaskedKernel", "EmbeddingTokenizer", "LinearTokenizer", "ModulatedAttention",
    "ModulatedFFN", "ModulatedLinear", "ModulationSpec", "PreNorm", "ReadIn", "ReadOut", "TransformerBlock",
    "SelfAttention", "SignatureKernel", "attend", "block_order", "block_sparse_attend",
    "concrete_log_sample", "cosine_distance", "init_linear_", "mask_value", "mlp", "normalize_log_kernel",
    "order_by_groups", "RelativePositionBias", "pad_bias", "type_matching", "NormLinearNorm", "PanelEncoder", "PatchEmbedding", "signature_log_kernel", "trunc_normal_",
]
