"""The ResNet GAN (models/gan.py) and its losses (nn/gan_losses.py): values, not only shapes."""
import math

import pytest
import torch

import modwire
from modwire.models.gan import GAN, GANConfig
from modwire.nn.gan_losses import discriminator_loss, generator_loss, infonce_loss


def micro(**overrides) -> GAN:
    torch.manual_seed(0)
    return modwire.create_model("gan_resnet_micro", **overrides)


def test_generator_makes_images_in_tanh_range_and_discriminator_features_have_infomax_shapes():
    model = micro().eval()
    z = model.sample_latents(3, generator=torch.Generator().manual_seed(1))
    images = model.generator(z)
    assert images.shape == (3, 1, 16, 16) and images.abs().max() < 1 and images.std() > 0
    logits, local, pooled = model.discriminator.features(images)
    assert logits.shape == (3, 1) and local.shape == (3, 16, 4, 4) and pooled.shape == (3, 16)
    l, g = model.discriminator.infomax(local, pooled)
    assert l.shape == (3, 32, 16) and g.shape == (3, 32)
    torch.testing.assert_close(model(z), logits)                     # forward = D(G(z))


def test_cifar10_preset_sizes_match_infomax_gan():
    """Mimicry's InfoMax-GAN 32×32: ngf 256 → G ≈ 4.28M parameters; ndf 128."""
    with torch.device("meta"):
        model = modwire.create_model("gan_resnet_cifar10")
    g = sum(p.numel() for p in model.generator.parameters())
    # stem 128→4·4·256, 3 up-blocks (2 conv3×3 + 1×1 shortcut, no biases: BatchNorm cancels them; 2 BN),
    # BN + conv3×3 → 3
    block = 2 * (256 * 256 * 9) + (256 * 256) + 2 * 2 * 256
    assert g == (128 * 4096 + 4096) + 3 * block + 2 * 256 + (256 * 3 * 9 + 3)
    assert model.config.discriminator.channels == 128 and model.config.latent_dim == 128


def test_discriminator_weights_are_spectrally_normalised():
    """After enough power iterations (training forwards) every weight's largest singular value is 1."""
    model = micro().train()
    x = torch.randn(4, 1, 16, 16)
    with torch.no_grad():
        for _ in range(200):
            _, local, pooled = model.discriminator.features(x)
            model.discriminator.infomax(local, pooled)
    model.eval()
    convs = [m for m in model.discriminator.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(convs) == 4 * 2 + 2 + 1 + 6                          # block convs, 2 shortcuts, head, InfoMax heads
    for m in convs:
        sigma = torch.linalg.matrix_norm(m.weight.detach().flatten(1), ord=2).item()
        assert sigma == pytest.approx(1.0, abs=1e-3)     # unnormalised, these range over ~0.5-3


def infonce_reference(local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """InfoMax-GAN's InfoNCE, loop by loop (float64): positive (g_i, l_ij), negatives (g_i, l_kj'), k ≠ i."""
    b, _, n = local.shape
    total = 0.0
    for i in range(b):
        for j in range(n):
            pos = glob[i] @ local[i, :, j]
            neg = [glob[i] @ local[k, :, q] for k in range(b) if k != i for q in range(n)]
            logits = torch.stack([pos, *neg])
            total += -(pos - torch.logsumexp(logits, 0))
    return total / (b * n)


def test_infonce_equals_the_loop_reference_with_gradients():
    g = torch.Generator().manual_seed(0)
    local = torch.randn(4, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    glob = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ours, ref = infonce_loss(local, glob), infonce_reference(local, glob)
    torch.testing.assert_close(ours.double(), ref)
    ga = torch.autograd.grad(ours, (local, glob))
    gb = torch.autograd.grad(ref, (local, glob))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


def test_infonce_at_zero_features_is_log_of_the_candidate_count():
    """All scores equal: -log(1 / (1 + (B-1)·L))."""
    local, glob = torch.zeros(3, 4, 5), torch.zeros(3, 4)
    assert infonce_loss(local, glob).item() == pytest.approx(math.log(1 + 2 * 5))


def test_infonce_refuses_bad_shapes_and_a_batch_of_one():
    with pytest.raises(ValueError, match=r"expected local \[B, R, L\] and global \[B, R\]"):
        infonce_loss(torch.zeros(2, 4, 5), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="at least 2 images"):
        infonce_loss(torch.zeros(1, 4, 5), torch.zeros(1, 4))


def test_hinge_and_non_saturating_losses_values():
    real, fake = torch.tensor([[2.0], [0.0]]), torch.tensor([[-2.0], [0.5]])
    assert discriminator_loss("hinge", real, fake).item() == pytest.approx(0.5 + 0.75)
    assert generator_loss("hinge", fake).item() == pytest.approx(0.75)
    sp = torch.nn.functional.softplus
    assert discriminator_loss("ns", real, fake).item() == pytest.approx((sp(-real).mean() + sp(fake).mean()).item())
    assert generator_loss("ns", fake).item() == pytest.approx(sp(-fake).mean().item())
    with pytest.raises(ValueError, match=r"got 'wgan', expected one of \['hinge', 'ns'\]"):
        generator_loss("wgan", fake)


def test_training_forward_reports_the_infomax_loss_and_eval_does_not():
    model = micro().train()
    z = torch.randn(4, 16)
    model(z)
    aux = model.auxiliary_losses()
    assert set(aux) == {"infomax"} and aux["infomax"].requires_grad
    assert model.eval().auxiliary_losses() == {}
    assert not micro(discriminator={"infomax": False}).discriminator.infomax


def test_config_errors_name_the_field_and_what_is_expected():
    with pytest.raises(ValueError, match=r"'image_size': got 32, expected generator.bottom_width · 2\^generator.num_blocks"):
        GANConfig(image_size=32, generator={"num_blocks": 2})
    with pytest.raises(ValueError, match="generator.channels"):
        GANConfig(generator={"channels": 0})
    with pytest.raises(ValueError, match=r"expected latents z \[B, 16\], got \[2, 5\]"):
        micro()(torch.zeros(2, 5))


def test_save_and_load_keep_generator_and_discriminator(tmp_path):
    model = micro().eval()
    model.save_pretrained(tmp_path)
    loaded = modwire.from_pretrained(tmp_path).eval()
    z = torch.randn(2, 16)
    torch.testing.assert_close(loaded.generator(z), model.generator(z), atol=0, rtol=0)
    torch.testing.assert_close(loaded(z), model(z), atol=0, rtol=0)


# ----------------------------------------------------------------------------- NFM in the generator (NFM §4.1)

def nfm_micro() -> GAN:
    torch.manual_seed(0)
    return modwire.create_model("nfm_gan_resnet_micro")


def test_nfm_generator_with_gamma_zero_equals_the_base_generator_and_gamma_changes_it():
    """Same seed → same stem and blocks; pass 2 runs copies of them and every γ starts at 0, so the NFM
    generator computes the base generator (NFM §3.2.1); a non-zero γ makes the readers count."""
    base, nfm = micro().eval(), nfm_micro().eval()
    z = torch.randn(3, 16)
    torch.testing.assert_close(nfm.generator(z), base.generator(z), atol=0, rtol=0)
    with torch.no_grad():
        for g in nfm.generator.body.gammas:
            g.fill_(0.5)
    assert (nfm.generator(z) - base.generator(z)).abs().max() > 1e-3


def test_nfm_readers_sit_before_each_block_of_both_passes():
    """§4.1: NFM after the first spatial layer and after each residual block (before res1…resN and the
    final conv), two passes: 4 readers per pass for CIFAR-10 (8 in all), d_k = d_v = 32, 4 heads."""
    with torch.device("meta"):
        cifar = modwire.create_model("nfm_gan_resnet_cifar10")
    body = cifar.generator.body
    assert (body.passes, body.num_blocks, len(body.readers)) == (2, 4, 8)
    assert body.channels == [256, 256, 256, 256, 3]
    assert (cifar.config.nfm.d_k, cifar.config.nfm.d_v, cifar.config.nfm.num_heads) == (32, 32, 4)
    model = nfm_micro().eval()
    model.generator(torch.randn(2, 16), record=True)
    records = model.generator.body.records
    assert [(r.pass_index, r.layer_index) for r in records] == [(p, i) for p in range(2) for i in range(3)]
    assert records[-1].sources == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]   # pass 1's image is read top-down
    assert all(torch.isfinite(r.mass).all() for r in records)


def test_random_attention_eval_option_changes_generated_images():
    model = nfm_micro().eval()
    with torch.no_grad():
        for g in model.generator.body.gammas:
            g.fill_(1.0)
    z = torch.randn(2, 16)
    before = model.generator(z)
    model.set_eval_options(random_attention=True)
    assert model.config.nfm.random_attention and model.generator.body.random_attention
    assert (model.generator(z) - before).abs().max() > 1e-4
    model.set_eval_options(random_attention=False)
    torch.testing.assert_close(model.generator(z), before, atol=0, rtol=0)


def test_gan_review_errors():
    import numpy as np
    from modwire.training import load_config
    from modwire.training.gan_metrics import feature_stats

    with pytest.raises(ValueError, match=r"nfm.random_attention.*needs NFM readers, and this model has none"):
        modwire.create_model("gan_resnet_micro").set_eval_options(random_attention=True)
    with pytest.raises(ValueError, match=r"'data.batch_size': got 1, expected at least 2 with InfoMax-GAN"):
        load_config(None, ["model.name=gan_resnet_micro", "max_steps=1", "data.batch_size=1"])
    load_config(None, ["model.name=gan_resnet_micro", "max_steps=1", "data.batch_size=1", "gan.loss.infomax_d=0",
                       "gan.loss.infomax_g=0"])   # fine without InfoNCE
    with pytest.raises(ValueError, match="features are not finite"):
        feature_stats(torch.tensor([[0.0, 1.0], [float("nan"), 2.0], [1.0, 1.0]]))
    assert np.allclose(feature_stats(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))[0], [1.0, 2.0])
