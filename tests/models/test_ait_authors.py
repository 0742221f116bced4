"""modwire's AiT with AUTHORS_AIT, and the AiT paper's ViT, against a literal float64 re-statement of
the authors' released model (tests/reference/authors_ait.py, issue 35): their weights copied across
by name, then logits in evaluation; in a training forward the logits, the memory written (Eq. 4),
the balance loss (× σ, as they add it) and every parameter's gradient; all to 1e-10."""
import pytest
import torch

from modwire.models import AiT, create_model
from modwire.models.ait import AUTHORS_AIT
from reference import authors_ait as R

TOL = dict(rtol=0, atol=1e-10)
CONFIG = R.AuthorsConfig()          # 8×8×3 images in 2×2 patches (16 tokens), 16-d, 2 blocks; 5 slots × 6-d, 3 heads, k 7


def their_shapes_to_modwire(c: R.AuthorsConfig) -> dict:
    """The modwire overrides of a tiny AiT / ViT preset that build their network's shapes."""
    return dict(num_classes=c.num_classes, d_model=c.dim, num_layers=c.depth, num_heads=c.heads,
                ffn_hidden=c.mlp_dim, tokenizer={"image_size": c.image_size, "in_channels": c.channels,
                                             "patch_size": c.patch_size})


def build(c: R.AuthorsConfig, **overrides):
    kw = their_shapes_to_modwire(c)
    if c.sparse:
        kw.update(num_slots=c.pattern_size, slot_dim=c.memory_dim, workspace_heads=c.memory_head,
                  bottleneck_size=c.bottleneck, hopfield_beta=c.beta, memory_alpha=c.alpha)
        return create_model("ait_small", **kw, **{**AUTHORS_AIT, **overrides}).double()
    return create_model("vit_small_cifar10", **kw, **overrides).double()


def state_dict_from_theirs(p: dict, c: R.AuthorsConfig) -> dict:
    """Their parameter names → modwire's (the never-used ones dropped). Their W^O reads the heads
    interleaved (column d·A + a, reference module docstring); modwire's reads them side by side
    (column a·D + d): the same map, its columns permuted."""
    p = {k: v.detach() for k, v in p.items()}
    sd = {"embed.proj.norm_in.weight": p["to_patch_embedding.1.weight"],
          "embed.proj.norm_in.bias": p["to_patch_embedding.1.bias"],
          "embed.proj.proj.weight": p["to_patch_embedding.2.weight"],
          "embed.proj.proj.bias": p["to_patch_embedding.2.bias"],
          "embed.proj.norm_out.weight": p["to_patch_embedding.3.weight"],
          "embed.proj.norm_out.bias": p["to_patch_embedding.3.bias"],
          "heads.norm.weight": p["mlp_head.0.weight"], "heads.norm.bias": p["mlp_head.0.bias"],
          "heads.linear.weight": p["mlp_head.1.weight"], "heads.linear.bias": p["mlp_head.1.bias"]}
    for i in range(c.depth):
        at, ff, b = f"transformer.layers.{i}.0.", f"transformer.layers.{i}.1.", f"blocks.{i}."
        q, k, v = p[at + "fn.to_qkv.weight"].chunk(3)
        sd.update({b + "attn.norm.weight": p[at + "norm.weight"], b + "attn.norm.bias": p[at + "norm.bias"],
                   b + "attn.fn.q.weight": q, b + "attn.fn.k.weight": k, b + "attn.fn.v.weight": v,
                   b + "attn.fn.o.weight": p[at + "fn.to_out.0.weight"], b + "attn.fn.o.bias": p[at + "fn.to_out.0.bias"],
                   b + "ffn.norm.weight": p[ff + "norm.weight"], b + "ffn.norm.bias": p[ff + "norm.bias"]})
        mlp = ("fn.fc1", "fn.fc2") if c.sparse else ("fn.net.0", "fn.net.3")
        for ours, theirs in zip(("fc1", "fc2"), mlp):
            sd.update({f"{b}ffn.fn.{ours}.weight": p[f"{ff}{theirs}.weight"], f"{b}ffn.fn.{ours}.bias": p[f"{ff}{theirs}.bias"]})
        if c.sparse:
            mu, ws, d, a = ff + "fn.memoryupdate.", b + "workspace.", c.memory_dim, c.memory_head
            sd.update({ws + "norm.weight": p[ff + "fn.norm.weight"], ws + "norm.bias": p[ff + "fn.norm.bias"],
                       ws + "q.weight": p[mu + "mha.w_qs.weight"], ws + "k.weight": p[mu + "mha.w_ks.weight"],
                       ws + "v.weight": p[mu + "mha.w_vs.weight"],
                       ws + "o.weight": p[mu + "mha.fc.weight"].view(d, d, a).permute(0, 2, 1).reshape(d, a * d),
                       ws + "write_norm.weight": p[mu + "mha.layer_norm.weight"],
                       ws + "write_norm.bias": p[mu + "mha.layer_norm.bias"],
                       ws + "up.weight": p[ff + "fn.fc3.weight"], ws + "up.bias": p[ff + "fn.fc3.bias"],
                       ws + "memory": p[mu + "memory"]})
    return sd


def modwire_name_of(c: R.AuthorsConfig) -> dict:
    """Their parameter name → modwire's (``to_qkv`` → the three names it splits into)."""
    p = R.init_params(c)
    marked = {k: torch.full_like(v, float(i)) for i, (k, v) in enumerate(p.items())}
    names = {}
    for ours, t in state_dict_from_theirs(marked, c).items():
        names.setdefault(list(p)[int(t.flatten()[0])], []).append(ours)
    return names


def images(c: R.AuthorsConfig, b=2, seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, c.channels, c.image_size, c.image_size, generator=g, dtype=torch.float64)
    return x, torch.randint(c.num_classes, (b,), generator=g)


def fresh(p: dict) -> dict:
    return {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in p.items()}


@pytest.mark.parametrize("sparse", [True, False], ids=["ait", "vit"])
def test_their_weights_give_their_logits_in_evaluation(sparse):
    c = R.AuthorsConfig(sparse=sparse)
    p = R.init_params(c, seed=3)
    model = build(c)
    model.load_state_dict(state_dict_from_theirs(p, c), strict=True)
    x, _ = images(c)
    want, _, _ = R.forward(fresh(p), c, x)
    stored = [s.memory.clone() for s in model.workspaces] if sparse else []
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), want, **TOL)
    assert all(torch.equal(a, s.memory) for a, s in zip(stored, getattr(model, "workspaces", [])))  # frozen (§4.2)


@pytest.mark.parametrize("sparse", [True, False], ids=["ait", "vit"])
def test_a_training_step_gives_their_logits_memory_balance_loss_and_gradients(sparse):
    c = R.AuthorsConfig(sparse=sparse)
    p = R.init_params(c, seed=3)
    model = build(c, **({"write_dropout": 0.0} if sparse else {}))
    model.load_state_dict(state_dict_from_theirs(p, c), strict=True)
    x, y = images(c)
    ref = fresh(p)
    want, aux, memories = R.forward(ref, c, x)
    (R.cross_entropy(want, y) + aux).backward()

    model.train()
    logits = model(x)
    losses = model.auxiliary_losses()
    torch.testing.assert_close(logits, want, **TOL)
    loss = torch.nn.functional.cross_entropy(logits, y)
    if sparse:
        sigma = AiT.aux_loss_defaults["balance"]
        torch.testing.assert_close(sigma * losses["balance"], aux, **TOL)
        for s, m in zip(model.workspaces, memories):
            torch.testing.assert_close(s.memory, m, **TOL)                # γ^{t+1} kept by the training forward
        loss = loss + sigma * losses["balance"]
    else:
        assert losses == {}
    loss.backward()
    grads = {n: q.grad for n, q in model.named_parameters()}
    for theirs, ours in modwire_name_of(c).items():
        if ours[0].endswith("memory"):
            continue
        got = [grads[n] for n in ours]
        if ref[theirs].grad is None:                                      # their detached write: W^V, W^O, its LN
            assert all(g is None for g in got), f"{ours} got a gradient, {theirs} has none"
            assert not any(model.get_parameter(n).requires_grad for n in ours), f"{ours} trainable, never trained"
            continue
        assert all(g is not None for g in got), f"{ours} has no gradient, {theirs} has one"
        want_g = ref[theirs].grad
        if theirs.endswith("to_qkv.weight"):
            got = [torch.cat(got)]
        elif theirs.endswith("mha.fc.weight"):
            d, a = c.memory_dim, c.memory_head
            want_g = want_g.view(d, d, a).permute(0, 2, 1).reshape(d, a * d)
        torch.testing.assert_close(got[0], want_g, **TOL, msg=lambda m, n=theirs: f"{n}: {m}")
    assert sum(len(v) for v in modwire_name_of(c).values()) == len(grads) + c.sparse * c.depth   # every parameter


def test_their_in_place_memory_write_takes_the_query_gradient_at_the_updated_memory():
    """Their ait.py passes ``memory.data`` as the query, then overwrites that storage before the
    backward (reference module docstring): their dL/dW^Q differs from the correct one, which is
    modwire's; every other gradient is the same."""
    c = CONFIG
    p = R.init_params(c, seed=3)
    x, y = images(c)
    grads = {}
    for inplace in (False, True):
        ref = fresh(p)
        logits, aux, _ = R.forward(ref, c, x, inplace_memory=inplace)
        (R.cross_entropy(logits, y) + aux).backward()
        grads[inplace] = {k: v.grad for k, v in ref.items() if v.grad is not None}
    wq = "transformer.layers.0.1.fn.memoryupdate.mha.w_qs.weight"
    assert (grads[True][wq] - grads[False][wq]).abs().max() > 1e-4
    for k in grads[False]:
        if not k.endswith("w_qs.weight"):
            torch.testing.assert_close(grads[True][k], grads[False][k], **TOL)


def test_their_layout_at_table1_sizes_less_the_unused_and_the_memory_is_modwires_presets():
    """Their printed totals (AiT-Small / Medium / Base 15.78 / 45.88 / 91.02 M, Table 1's 15.8 / 45.9 /
    91.0 M; ViT-Small / Base 14.91 / 85.76 M, Table 1's 14.9 / 85.7 M) less the 109,056 parameters they
    create and never use (and, for the AiT, the memory, a frozen Parameter there) are modwire's presets."""
    totals = {("ait", 2): 15_784_426, ("ait", 6): 45_876_970, ("ait", 12): 91_015_786,
              ("vit", 2): 14_909_290, ("vit", 6): 43_251_562, ("vit", 12): 85_764_970}
    names = {2: "small", 6: "medium", 12: "base"}
    for (kind, depth), total in totals.items():
        c = R.AuthorsConfig(image_size=32, patch_size=4, num_classes=10, dim=768, depth=depth, heads=12, dim_head=64,
                            mlp_dim=3072, memory_head=8, memory_dim=32, pattern_size=32, bottleneck=512,
                            sparse=kind == "ait")
        shapes = R.parameter_shapes(c)
        count = {n: torch.Size(s).numel() for n, s in shapes.items()}
        assert sum(count.values()) == total
        unused = sum(count[n] for n in R.UNUSED)
        memory = sum(v for n, v in count.items() if n.endswith("memory"))
        assert unused == 109_056
        with torch.device("meta"):
            model = create_model(f"ait_{names[depth]}" if kind == "ait" else f"vit_{names[depth]}_cifar10")
        assert model.num_parameters() == total - unused - memory
