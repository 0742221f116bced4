"""The whole Neural Interpreter against the authors' model (``tests/reference/authors_ni.py``: their
forward re-stated literally in float64, in the configuration of their released digits preset).

With their weights copied in, modwire's NI is their model when configured as they run it:
``interpreter_residual="none"`` (their ``no_residual: true``), ``function_positions=False`` with
their per-function positional term set to 0 (their ``sep_sum`` term ``(F c_u)_h`` does not depend on
the offset; modwire's Eq. 22-23 ModLin cannot express it), the query bias 0 (their queries have
none), the positional table divided by ``√d_key`` (they add it before the scaling), one shared
regression head, and the CLS tokens moved from first to last. Their ``vanilla`` residual
(``x + Σ_u C_ui LOCs(x)_ui``) is modwire's default, ``interpreter_residual="identity"``: Eq. 11 as
printed."""
import math

import pytest
import torch

from modwire.models.neural_interpreter import NeuralInterpreter, NeuralInterpreterConfig
from modwire.models.tokenizer_config import TokenizerConfig
from reference.authors_ni import AuthorsConfig, authors_forward, random_parameters

TINY = AuthorsConfig(num_classes=4, image_size=6, channels=2, patch_size=2, dim=8, code_features=6, type_features=4,
                     num_scripts=2, num_iterations=2, num_functions=3, num_loc_pods=2, heads_per_loc=2,
                     features_per_head=2, truncation=1.0)


def modwire_config(c: AuthorsConfig, residual: str) -> NeuralInterpreterConfig:
    """modwire's config of the authors' model ``c`` (module docstring)."""
    return NeuralInterpreterConfig(
        num_classes=c.num_classes, num_cls_tokens=len(c.datasets), task_input=True, shared_head=True,
        d_model=c.dim, d_code=c.code_features, num_scripts=c.num_scripts, num_iterations=c.num_iterations,
        num_locs=c.num_loc_pods, num_functions=c.num_functions, num_heads=c.heads_per_loc,
        qk_head_dim=c.key_features, ffn_hidden=c.dim, d_type=c.type_features, tau=c.truncation, eps=c.epsilon,
        type_hidden=c.dim, type_depth=2, pos_dim=c.key_features, function_positions=False,
        interpreter_residual=residual,
        tokenizer=TokenizerConfig(kind="patches", image_size=c.image_size, in_channels=c.channels, patch_size=c.patch_size,
                              positions="relative"))


def _copy_modfc(layer, P: dict, name: str) -> None:
    """Their ModFC ``native_weight (x ⊙ LN(scale(c))) + native_bias`` is modwire's ModLin (NI Eq. 4)."""
    layer.weight.copy_(P[name + ".native_weight"])
    layer.code_proj.copy_(P[name + ".scale.weight"])
    if layer.bias is not None:          # modwire's queries have a bias (Eq. 4); theirs have none
        layer.bias.copy_(P.get(name + ".native_bias", torch.zeros_like(layer.bias)))


def load_authors(model: NeuralInterpreter, P: dict, c: AuthorsConfig) -> None:
    """Copy their parameters (named as in their ``state_dict``) into ``model``."""
    p, d, T = c.patch_size, c.dim, len(c.datasets)
    with torch.no_grad():
        w = P["patch_to_embedding.weight"].reshape(d, p, p, c.channels).permute(0, 3, 1, 2)   # (p1 p2 c) → conv
        model.embed.proj.weight.copy_(w)
        model.embed.proj.bias.copy_(P["patch_to_embedding.bias"])
        model.cls_tokens.copy_(P["shared_cls_token"].reshape(1, d).expand(T, d) if c.shared_cls_token else
                               torch.cat([P[f"cls_token.{n}"].reshape(1, d) for n in c.datasets]))
        model.norm.weight.copy_(P["shared_prediction_head.0.weight"])                     # head LN = final LN
        model.norm.bias.copy_(P["shared_prediction_head.0.bias"])
        model.heads.weight.copy_(P["shared_prediction_head.1.weight"][None])
        model.heads.bias.copy_(P["shared_prediction_head.1.bias"][None])
        for s, script in enumerate(model.scripts):
            pre = f"transformer.scripts.{s}."
            ti = script.type_inference
            for mine, theirs in ((ti.norm, "layernorm"), (ti.mlp[0], "body.0"), (ti.mlp[2], "body.2")):
                mine.weight.copy_(P[pre + f"type_inference.{theirs}.weight"])
                mine.bias.copy_(P[pre + f"type_inference.{theirs}.bias"])
            pod = pre + "function_pod."
            script.log_sigma.copy_(P[pod + "kernel.bandwidth"].log())
            script.functions.signatures.copy_(P[pod + "function_signatures"])
            script.functions.codes.copy_(P[pod + "function_codes"])
            for l, loc in enumerate(script.locs):
                q = pod + f"loc_pods.{l}."
                for norm, theirs in ((loc.attn.norm, "pre_attention_layernorm"), (loc.ffn.norm, "pre_mlp_layernorm")):
                    norm.weight.copy_(P[q + theirs + ".weight"])
                    norm.bias.copy_(P[q + theirs + ".bias"])
                attn, ffn = loc.attn.fn, loc.ffn.fn
                for layer, theirs in ((attn.q, "query_compiler"), (attn.k, "key_compiler"), (attn.v, "value_compiler"),
                                      (attn.o, "post_attention_fc"), (ffn.fc1, "pointwise_mlp.0"),
                                      (ffn.fc2, "pointwise_mlp.1")):
                    _copy_modfc(layer, P, q + theirs)
                r, rel = q + "relative_positional_encoder.", loc.relative
                scale = 1 / math.sqrt(c.key_features)            # they add P before dividing by √d_key
                rel.e_row.copy_(P[r + "col_embeddings.weight"])  # their "col" table is indexed by the row offset
                rel.w_row.weight.copy_(P[r + "head_keys_col.weight"] * scale)
                rel.e_col.copy_(P[r + "row_embeddings.weight"])
                rel.w_col.weight.copy_(P[r + "head_keys_row.weight"] * scale)


def _without_function_keys(P: dict) -> dict:
    return {k: (torch.zeros_like(v) if "function_keys" in k else v) for k, v in P.items()}


def _setup(c: AuthorsConfig, residual: str = "none", seed: int = 0):
    P = _without_function_keys(random_parameters(c, seed))
    torch.manual_seed(seed)
    model = NeuralInterpreter(modwire_config(c, residual)).double().eval()
    load_authors(model, P, c)
    x = torch.rand(2, c.channels, c.image_size, c.image_size, generator=torch.Generator().manual_seed(seed + 1),
                   dtype=torch.float64)
    return P, model, x


def _their_order(c: AuthorsConfig) -> torch.Tensor:
    """modwire's token ``j`` (patches, then CLS tokens) is their token ``perm[j]`` (CLS tokens first)."""
    T, G = len(c.datasets), c.grid ** 2
    return torch.cat([torch.arange(T, T + G), torch.arange(T)])


@pytest.mark.parametrize("shared_cls", [True, False], ids=["digits-preset", "a-token-per-dataset"])
def test_modwire_with_the_authors_weights_is_their_digits_model(shared_cls):
    """Logits of every dataset's head, and C and the types of every function iteration, ≤ 1e-10."""
    c = AuthorsConfig(**{**TINY.__dict__, "shared_cls_token": shared_cls})
    P, model, x = _setup(c)
    theirs = authors_forward(P, c, x)
    perm = _their_order(c)
    for t, name in enumerate(c.datasets):
        task = torch.full((len(x),), t)
        out = model.forward_record(x, task=task)
        torch.testing.assert_close(out.logits, theirs["predictions"][name], rtol=0, atol=1e-10)
    assert len(out.compatibility) == len(theirs["affinities"]) == c.num_scripts * c.num_iterations
    for C, A, types, T in zip(out.compatibility, theirs["affinities"], out.types, theirs["types"]):
        torch.testing.assert_close(C, A[..., perm], rtol=0, atol=1e-10)
        torch.testing.assert_close(types, torch.nn.functional.normalize(T, dim=-1)[:, perm], rtol=0, atol=1e-10)
    C = torch.stack(out.compatibility)
    assert (C == 0).any() and (C > 0.05).any()        # the truncation is active: unread variables occur
    preds = torch.stack(list(theirs["predictions"].values()))
    assert (preds[0] - preds[1]).abs().max() > 1e-3 or shared_cls      # distinct tokens give distinct answers


def test_eq11_as_printed_is_their_vanilla_residual():
    """modwire's default, ``interpreter_residual="identity"`` (Eq. 11 as printed), is their function
    pod with ``no_residual: false, residual_mode: vanilla``; ``"none"`` is not."""
    P, model, x = _setup(TINY, residual="identity")
    assert model.config.interpreter_residual == NeuralInterpreterConfig().interpreter_residual
    theirs = authors_forward(P, TINY, x, residual="vanilla")["predictions"]
    preset = authors_forward(P, TINY, x)["predictions"]
    task = torch.zeros(len(x), dtype=torch.long)
    got = model(x, task=task)
    torch.testing.assert_close(got, theirs[TINY.datasets[0]], rtol=0, atol=1e-10)
    assert (got - preset[TINY.datasets[0]]).abs().max() > 1e-3


def test_their_per_function_positional_term_is_not_modwires():
    """The one term the mapping sets to 0: their ``sep_sum`` per-function bias ``(F c_u)_h`` (a
    departure, docs/ni.md) changes their output, so the equality above depends on zeroing it."""
    P, model, x = _setup(TINY)
    with_keys = random_parameters(TINY, 0)
    task = torch.zeros(len(x), dtype=torch.long)
    theirs = authors_forward(with_keys, TINY, x)["predictions"][TINY.datasets[0]]
    assert (model(x, task=task) - theirs).abs().max() > 1e-4
