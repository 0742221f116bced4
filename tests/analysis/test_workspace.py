"""modwire.analysis.workspace: the Associative Transformer's analyses (AiT App. A.4 Eq. 9 / Figure 7,
Figure 2, §5.6 / Figure 10, App. A.7 / Figure 11) on hand-made weights, fake workspace records and
real models."""
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

import modwire
from modwire.analysis.workspace import (attention_sparsity, checkpoint_dirs, collect_energies, diversity_counts,
                                        diversity_over_training, energy_summary, head_medians,
                                        model_patch_diversity, patch_diversity, pool_layout,
                                        slot_attention_maps, sparsity_scores)


@dataclass
class FakeRecord:
    """The fields of modwire.nn.workspace.WorkspaceRecord the analyses read."""

    weights: torch.Tensor
    energy_before: torch.Tensor
    energy_after: torch.Tensor
    num_tokens: int
    memory: torch.Tensor | None = None


class FakeAiT(torch.nn.Module):
    """forward_record(x) → one record per layer whose weights are ``x`` itself ([P, A, M, L]
    per layer stacked on dim 0), energies before = 1, after = 1 - x's first pool row."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))

    def forward_record(self, x):
        layers = [FakeRecord(w, torch.ones(2, 3), 1 - w.flatten()[:6].view(2, 3), 3) for w in x]
        return SimpleNamespace(workspace=layers, propagator_attention=[])


# ----------------------------------------------------------------------------- Eq. 9

def _brute_force(row: list[float], mass: float) -> int:
    """Eq. 9 read literally: the smallest s with the s largest weights summing to >= mass (exact
    rational arithmetic on the float values, so no rounding question arises)."""
    from fractions import Fraction

    ordered = sorted((Fraction(w) for w in row), reverse=True)
    total = Fraction(0)
    for s, w in enumerate(ordered, start=1):
        total += w
        if total >= Fraction(mass):
            return s
    return len(row)


def test_one_hot_rows_need_one_patch_and_uniform_rows_need_the_ceiling_of_0_9_n():
    eye = torch.eye(7).expand(2, 3, 7, 7)                              # [B, H, N, N], one-hot rows
    assert torch.equal(attention_sparsity(eye), torch.ones(2, 3, 7, dtype=torch.long))
    for dtype in (torch.float32, torch.float64):
        for n in range(1, 80):
            uniform = torch.full((n,), 1.0 / n, dtype=dtype)
            assert attention_sparsity(uniform).item() == math.ceil(0.9 * n - 1e-9), (n, dtype)


def test_the_bound_is_inclusive_ties_do_not_matter_and_mass_is_configurable():
    rows = torch.tensor([[0.5, 0.4, 0.1, 0.0],        # 0.5 + 0.4 = 0.9 exactly (up to rounding): 2
                         [0.39, 0.11, 0.5, 0.0],      # 0.5 + 0.39 = 0.89 < 0.9: 3
                         [0.3, 0.1, 0.3, 0.3],        # ties: 0.9 after the three 0.3s
                         [0.0, 0.95, 0.05, 0.0]], dtype=torch.float64)   # one weight above the mass
    assert attention_sparsity(rows).tolist() == [2, 3, 3, 1]
    assert attention_sparsity(torch.tensor([0.25, 0.25, 0.25, 0.25]), mass=0.5).item() == 2
    assert attention_sparsity(torch.tensor([0.25, 0.25, 0.25, 0.25]), mass=1.0).item() == 4
    assert attention_sparsity(torch.tensor([0.2, 0.2, 0.1]), mass=0.9).item() == 3   # total < mass: N


def test_matches_the_literal_definition_on_random_softmax_rows():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(3 * torch.randn(4, 3, 9, 9, generator=g), dim=-1)
    w[0, 0, 0] = torch.tensor([0.2] * 3 + [0.1] * 4 + [0.0] * 2)        # ties and zeros
    got = attention_sparsity(w, mass=0.9, tol=0.0)
    assert got.shape == (4, 3, 9) and got.dtype == torch.long
    want = torch.tensor([_brute_force(r, 0.9) for r in w.double().reshape(-1, 9).tolist()]).view(4, 3, 9)
    assert torch.equal(got, want)
    assert got[0, 0, 0].item() == 6                                    # 0.2*3 + 0.1*3 = 0.9


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        attention_sparsity(torch.tensor([0.5, -0.1, 0.6]))
    with pytest.raises(ValueError, match=r"mass must be in \(0, 1\]"):
        attention_sparsity(torch.tensor([1.0]), mass=1.5)
    with pytest.raises(ValueError, match="floating-point"):
        attention_sparsity(torch.tensor([1, 0]))


def test_head_medians_are_the_midpoint_for_an_even_count():
    assert head_medians(torch.tensor([[1.0, 2, 3, 4], [5, 1, 3, 0]])).tolist() == [2.5, 2.0]


def test_vit_scores_are_averaged_over_samples_whatever_the_batching():
    torch.manual_seed(0)
    model = modwire.create_model("vit_micro").eval()                   # 2 layers x 2 heads, 17 tokens
    x = torch.rand(6, 1, 8, 8)
    with torch.no_grad():
        att = model.forward_record(x).propagator_attention
    want = [attention_sparsity(a).double().mean(dim=0) for a in att]   # [H, N] per layer
    batches = [(x[:4], torch.zeros(4)), (x[4:], torch.zeros(2))]        # (x, y) loader items
    got = sparsity_scores(model, batches)
    assert len(got) == 2 and got[0].shape == (2, 17)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    assert 1 <= got[0].min() and got[0].max() <= 17
    one = sparsity_scores(model, batches, max_batches=1)
    torch.testing.assert_close(one[1], attention_sparsity(att[1][:4]).double().mean(dim=0))
    with pytest.raises(ValueError, match="empty"):
        sparsity_scores(model, [])


# ----------------------------------------------------------------------------- Figure 2

def _squashed(b: int = 3, a: int = 2, m: int = 4, n: int = 5) -> FakeRecord:
    """Weight of slot j, head h, sample s, token t = 1000 s + 100 h + 10 j + t (easy to read back)."""
    s, h, j, t = torch.meshgrid(torch.arange(b), torch.arange(a), torch.arange(m), torch.arange(n), indexing="ij")
    per_sample = (1000 * s + 100 * h + 10 * j + t).double()           # [B, A, M, N]
    pool = per_sample.permute(1, 2, 0, 3).reshape(1, a, m, b * n)      # position l = b*N + n
    return FakeRecord(pool, torch.zeros(b, n), torch.zeros(b, n), n)


def test_slot_maps_cut_each_sample_out_of_the_squashed_pool_and_drop_extra_tokens():
    rec = _squashed()                                                  # N = 5: a 2x2 grid + 1 extra token
    assert pool_layout(rec) == (3, 5)
    maps = slot_attention_maps(rec, (2, 2), head=1)
    assert maps.shape == (3, 4, 2, 2)
    assert maps[2, 3].tolist() == [[2130, 2131], [2132, 2133]]         # sample 2, head 1, slot 3, tokens 0..3
    torch.testing.assert_close(rec.weights[0, 1, 3, 10:14].float().view(2, 2), maps[2, 3])
    mean = slot_attention_maps(rec, (2, 2), samples=[1])               # mean over the two heads
    assert mean.shape == (1, 4, 2, 2) and mean[0, 0, 0, 0].item() == 1050
    per_sample = FakeRecord(rec.weights[0].unflatten(-1, (3, 5)).permute(2, 0, 1, 3), rec.energy_before,
                            rec.energy_after, 5)                      # the per-sample pool [B, A, M, N]
    assert pool_layout(per_sample) == (3, 5)
    torch.testing.assert_close(slot_attention_maps(per_sample, (2, 2), head=1), maps)


def test_slot_maps_refuse_what_does_not_fit():
    rec = _squashed()
    with pytest.raises(ValueError, match="needs 9 tokens, the pool has 5"):
        slot_attention_maps(rec, (3, 3))
    with pytest.raises(ValueError, match="head 2 out of range"):
        slot_attention_maps(rec, (2, 2), head=2)
    with pytest.raises(ValueError, match="do not fit num_tokens=4"):
        pool_layout(FakeRecord(rec.weights, rec.energy_before, rec.energy_after, 4))


# ----------------------------------------------------------------------------- Figure 10

def test_diversity_counts_distinct_positions_over_all_selections_per_head():
    w = torch.zeros(1, 3, 2, 4)                       # [P, A, M, L]
    w[0, 0, 0, [0, 1]] = 0.5                          # head 0: slots pick {0, 1} and {1, 2}: 3 distinct of 4
    w[0, 0, 1, [1, 2]] = 0.5
    w[0, 1, :, [0, 1]] = 0.5                          # head 1: both slots pick {0, 1}: 2 of 4 = 1/M
    w[0, 2, 0, 3] = 1.0                               # head 2: one slot, one patch: 1 of 1
    distinct, total = diversity_counts(w)
    assert distinct.tolist() == [3, 2, 1] and total.tolist() == [4, 4, 1]
    assert patch_diversity(w).tolist() == [0.75, 0.5, 1.0]
    assert patch_diversity(FakeRecord(w, torch.zeros(1, 4), torch.zeros(1, 4), 4)).tolist() == [0.75, 0.5, 1.0]
    pools = torch.cat([w, w])                         # two per-sample pools: positions never shared across pools
    assert patch_diversity(pools).tolist() == [0.75, 0.5, 1.0]
    assert math.isnan(patch_diversity(torch.zeros(1, 1, 2, 3)).item())


def test_model_diversity_adds_counts_over_batches_and_layers_and_tracks_checkpoints():
    a = torch.zeros(2, 1, 1, 2, 4)                    # batch 1: layer 0 picks {0,1},{0,1}: 2/4; layer 1 {0},{1}: 2/2
    a[0, 0, 0, :, :2] = 1
    a[1, 0, 0, 0, 0] = a[1, 0, 0, 1, 1] = 1
    b = torch.zeros(2, 1, 1, 2, 4)                    # batch 2: layer 0 {0,1},{2,3}: 4/4; layer 1 {3},{3}: 1/2
    b[0, 0, 0, 0, :2] = b[0, 0, 0, 1, 2:] = 1
    b[1, 0, 0, :, 3] = 1
    model = FakeAiT()
    got = model_patch_diversity(model, [a, b])
    assert got.shape == (2, 1) and got[:, 0].tolist() == [6 / 8, 3 / 4]
    assert model_patch_diversity(model, [a, b], max_batches=1)[:, 0].tolist() == [0.5, 1.0]
    history = diversity_over_training([model, model], [(a, None)])
    assert [step for step, _ in history] == [0, 1] and history[1][1][:, 0].tolist() == [0.5, 1.0]
    with pytest.raises(TypeError, match="records no global workspace"):
        model_patch_diversity(modwire.create_model("vit_micro"), [torch.rand(1, 1, 8, 8)])


def test_checkpoint_dirs_lists_one_checkpoint_per_step_in_step_order(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("last-00000030", "best-00000010", "best-00000020.1", "last-00000010", ".last-00000040.tmp"):
        (root / name).mkdir(parents=True)
        (root / name / "model.safetensors").write_bytes(b"")
    (root / "last").symlink_to("last-00000030")
    (root / "best").symlink_to("best-00000020.1")
    (root / "empty-00000050").mkdir()
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["best-00000010", "best-00000020.1", "last-00000030"]
    with pytest.raises(FileNotFoundError, match="no checkpoints/ directory"):
        checkpoint_dirs(tmp_path / "nothing")


# ----------------------------------------------------------------------------- Figure 11

def hopfield_energy_eq7(xi: torch.Tensor, patterns: torch.Tensor, beta: float) -> torch.Tensor:
    """AiT Eq. 7 read literally, one state at a time: E(ξ) = -lse(β, X ξ) + ½ ξ·ξ + β⁻¹ log M + ½ ζ²
    with lse(β, z) = β⁻¹ log Σ_i exp(β z_i), ζ = max_i ||X_i|| (Eq. 8), X the M stored patterns."""
    out = []
    m = patterns.shape[0]
    zeta = max(float(torch.linalg.vector_norm(p)) for p in patterns.double())
    for state in xi.double():
        z = [float(torch.dot(p, state)) for p in patterns.double()]
        lse = math.log(sum(math.exp(beta * v) for v in z)) / beta
        out.append(-lse + 0.5 * float(torch.dot(state, state)) + math.log(m) / beta + 0.5 * zeta ** 2)
    return torch.tensor(out, dtype=torch.float64)


def test_energy_summary_means_and_fraction_decreased():
    before = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    after = torch.tensor([[0.0, 2.0], [1.0, 5.0]])                    # down, same, down, up
    (s,) = energy_summary([(before, after)])
    assert s == {"mean_before": 2.5, "mean_after": 2.0, "mean_change": -0.5, "fraction_decreased": 0.5, "tokens": 4}
    assert energy_summary([FakeRecord(torch.zeros(1, 1, 1, 2), before, after, 2)]) == [s]
    with pytest.raises(ValueError, match="same, non-zero number of tokens"):
        energy_summary([(before, after[:1])])


def test_collect_energies_concatenates_samples_per_layer():
    w = torch.rand(2, 1, 1, 2, 3)                     # two layers
    got = collect_energies(FakeAiT(), [w, w + 1])
    assert len(got) == 2 and got[0][0].shape == (4, 3)
    torch.testing.assert_close(got[1][1], torch.cat([1 - w[1].flatten()[:6].view(2, 3),
                                                     -w[1].flatten()[:6].view(2, 3)]).double())


def test_one_step_retrieval_lowers_the_literal_eq7_energy_of_states_near_a_pattern():
    """The literal Eq. 7 has its minimum near a stored pattern (β large, well-separated patterns),
    and one update ξ ← softmax(β X ξ)ᵀ X (Eq. 8) lowers it: the property Figure 11 reads off."""
    g = torch.Generator().manual_seed(0)
    patterns = 3 * torch.linalg.qr(torch.randn(6, 4, generator=g, dtype=torch.float64))[0].T   # 4 orthogonal, norm 3
    xi = patterns[[0, 2]] + 0.8 * torch.randn(2, 6, generator=g, dtype=torch.float64)
    new = torch.softmax(2.0 * xi @ patterns.T, dim=-1) @ patterns
    before, after = hopfield_energy_eq7(xi, patterns, 2.0), hopfield_energy_eq7(new, patterns, 2.0)
    assert (after < before).all()
    assert hopfield_energy_eq7(patterns[:1], patterns, 50.0).item() == pytest.approx(0.0, abs=0.05)


# ----------------------------------------------------------------------------- plots

def test_plots_write_files(tmp_path):
    from modwire.analysis.plots import plot_attention_sparsity, plot_energy, plot_patch_diversity, plot_slot_maps

    scores = [torch.rand(3, 17) * 17, torch.full((3, 17), 4.0)]        # a constant head draws too
    assert plot_attention_sparsity(scores, tmp_path / "s.png").stat().st_size > 0
    maps = slot_attention_maps(_squashed(), (2, 2))
    assert plot_slot_maps(maps, tmp_path / "m.png", images=torch.rand(3, 1, 8, 8)).stat().st_size > 0
    assert plot_slot_maps(maps, tmp_path / "m2.png").stat().st_size > 0
    history = [(10, torch.tensor([[0.5, 0.7]])), (20, torch.tensor([[0.8, float("nan")]]))]
    assert plot_patch_diversity(history, tmp_path / "d.png").stat().st_size > 0
    e = torch.rand(4, 5)
    assert plot_energy([(e, e - 0.1), (e, e + 0.1)], tmp_path / "e.png").stat().st_size > 0
    with pytest.raises(ValueError, match="3 images for 2 samples"):
        plot_slot_maps(maps[:2], tmp_path / "x.png", images=torch.rand(3, 1, 8, 8))


def test_records_without_weights_or_energies_say_why():
    rec = FakeRecord(None, None, None, 4)
    with pytest.raises(ValueError, match="memory forward was off"):
        patch_diversity(rec)
    with pytest.raises(ValueError, match="memory forward was off"):
        slot_attention_maps(rec, (2, 2))
    with pytest.raises(ValueError, match="no Hopfield energies"):
        energy_summary([rec])


# ----------------------------------------------------------------------------- experiments/ait_analysis.py

def _train(out, model: str, overrides: tuple[str, ...] = ()) -> None:
    from modwire.training import load_config, train

    cfg = load_config(None, [f"out_dir={out}", f"model.name={model}", "data.task=triangle", "data.batch_size=8",
                             "data.params={size: {train: 32, val: 16, test: 16}}", "max_steps=2", "progress=false",
                             "model.overrides={tokenizer: {patch_size: 16}}", *overrides])   # 64x64: 16 patches
    assert train(cfg)["status"] == "finished"


def test_script_arguments_are_checked():
    from modwire.experiments import ait_analysis as script
    for argv in ([], ["run", "--mass", "1.5"], ["run", "--samples", "0"]):
        with pytest.raises(SystemExit) as e:
            script.parse(argv)
        assert e.value.code == 2


def test_script_on_a_vit_run_writes_the_sparsity_violins_and_its_numbers(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from modwire.experiments import ait_analysis as script
    _train(tmp_path / "vit", "vit_micro")
    out = tmp_path / "out"
    assert script.main(["--vit", str(tmp_path / "vit"), "--out", str(out), "--samples", "12", "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())["vit"]
    _, model, batches = script.load(str(tmp_path / "vit"), 12, None)
    assert sum(len(b[0]) for b in batches) == 12 and len(batches) == 2         # the run's batch size, 8
    want = [head_medians(s).tolist() for s in sparsity_scores(model, batches)]
    assert summary["median_per_head"] == want and summary["tokens"] == 17     # 16 patches + CLS
    with pytest.raises(SystemExit, match="records no global workspace"):
        script.main([str(tmp_path / "vit"), "--out", str(out), "--no-plots"])
    script.main(["--vit", str(tmp_path / "vit"), "--out", str(out), "--samples", "8"])
    assert (out / "vit_sparsity.png").stat().st_size > 0


# ----------------------------------------------------------------------------- a real AiT (models/ait.py)

def _workspace_inputs(model, x):
    """forward_record(x) plus the input of every workspace layer (a forward pre-hook)."""
    seen = []
    hooks = [s.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach())) for s in model.workspaces]
    try:
        with torch.no_grad():
            out = model.forward_record(x)
    finally:
        for h in hooks:
            h.remove()
    return out, seen


@pytest.mark.parametrize("pool", ["batch", "sample"])
def test_ait_slot_maps_hold_each_slots_top_k_selection_over_the_images(pool):
    torch.manual_seed(0)
    model = modwire.create_model("ait_micro", pool=pool).eval()     # 4x4 patches, 8 slots, k = 6, 2 heads
    k, m = model.config.bottleneck_size, model.config.num_slots
    out, _ = _workspace_inputs(model, torch.rand(3, 1, 8, 8))
    rec = out.workspace[0]
    assert pool_layout(rec) == (3, 16)
    for head in range(2):
        maps = slot_attention_maps(rec, model.embed.grid, head=head)  # [3, M, 4, 4]
        selected = (maps > 0).sum(dim=(-1, -2))                       # [B, M]
        if pool == "batch":   # each slot picks k patches from the pool of all 3 images
            assert selected.sum(dim=0).tolist() == [k] * m
        else:                 # each slot picks k patches of every image
            assert selected.tolist() == [[k] * m] * 3
        distinct, total = diversity_counts(rec.weights[:, head:head + 1])
        assert total.item() == m * k * (1 if pool == "batch" else 3)
        assert distinct.item() == (maps.sum(dim=1) > 0).sum().item()   # positions any slot picked


def test_ait_energies_are_eq7_of_the_workspace_tokens_and_the_memory_is_left_alone():
    from modwire.nn.workspace import hopfield_energy

    torch.manual_seed(0)
    model = modwire.create_model("ait_micro").eval()
    memory = [s.memory.clone() for s in model.workspaces]
    x = torch.rand(2, 1, 8, 8)
    out, inputs = _workspace_inputs(model, x)
    for space, rec, tokens in zip(model.workspaces, out.workspace, inputs):
        with torch.no_grad():
            xi = space.norm(tokens)                                     # Ξ^t [B, N, E]
            patterns = space.up(rec.memory)[0]                          # f_LT(γ^{t+1}) [M, E]
            retrieved = torch.softmax(space.beta * xi @ patterns.T, dim=-1) @ patterns   # Eq. 8, one step
        for b in range(2):
            want_before = hopfield_energy_eq7(xi[b], patterns, space.beta)
            want_after = hopfield_energy_eq7(retrieved[b], patterns, space.beta)
            torch.testing.assert_close(rec.energy_before[b].double(), want_before, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(rec.energy_after[b].double(), want_after, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(hopfield_energy(xi[b], patterns, space.beta).double(), want_before,
                                       rtol=1e-4, atol=1e-4)
    energies = collect_energies(model, [(x, None)])
    summary = energy_summary(energies)
    assert [s["tokens"] for s in summary] == [32, 32]
    assert summary[0]["fraction_decreased"] == (energies[0][1] < energies[0][0]).double().mean().item()
    model_patch_diversity(model, [(x, None)])
    assert all(torch.equal(a, s.memory) for a, s in zip(memory, model.workspaces))   # evaluation keeps γ


def test_ait_diversity_over_a_list_of_models_matches_each_models_records():
    torch.manual_seed(0)
    models = [modwire.create_model("ait_micro").eval() for _ in range(2)]
    x = torch.rand(4, 1, 8, 8)
    history = diversity_over_training(models, [(x[:2], None), (x[2:], None)])
    for (step, got), model in zip(history, models):
        want = []
        for part in (x[:2], x[2:]):
            with torch.no_grad():
                want.append(torch.stack([torch.stack(diversity_counts(r.weights))
                                         for r in model.forward_record(part).workspace]))
        counts = sum(want)                                             # [layers, 2, A]
        torch.testing.assert_close(got, counts[:, 0].double() / counts[:, 1].double())
    assert [s for s, _ in history] == [0, 1]
    without = modwire.create_model("ait_micro", workspace=False).eval()
    with pytest.raises(TypeError, match="records no global workspace"):
        model_patch_diversity(without, [x])


def test_script_on_an_ait_run_writes_every_figure_and_its_numbers(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from modwire.experiments import ait_analysis as script
    _train(tmp_path / "ait", "ait_micro", ("aux_loss_weights={balance: 0.01}",))
    _train(tmp_path / "vit", "vit_micro")
    out = tmp_path / "out"
    assert script.main([str(tmp_path / "ait"), "--vit", str(tmp_path / "vit"), "--out", str(out),
                        "--samples", "16", "--head", "1"]) == 0
    for name in ("slot_maps", "diversity", "energy", "ait_sparsity", "vit_sparsity"):
        assert (out / f"{name}.png").stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    ait = summary["ait"]
    assert ait["memory_unchanged"] is True and ait["skipped"] == {} and ait["layers"] == 2
    _, model, batches = script.load(str(tmp_path / "ait"), 16, None)
    assert [d["step"] for d in ait["diversity"]] == [2]                 # best-2 and last-2: one point
    assert ait["diversity"][0]["per_head"] == model_patch_diversity(model, batches).tolist()
    assert ait["energy"] == energy_summary(collect_energies(model, batches))
    k = model.config.bottleneck_size
    selected = torch.tensor(ait["slot_maps"]["selected_per_slot"])      # [4 images of the pool of 8, M]
    with torch.no_grad():
        rec = model.forward_record(batches[0][0]).workspace[0]
    maps = slot_attention_maps(rec, model.embed.grid, head=1)           # all 8 images: each slot picks k
    assert torch.equal(selected, (maps[:4] > 0).sum(dim=(-1, -2))) and (maps > 0).sum(dim=(0, 2, 3)).eq(k).all()


def test_ait_ablations_without_weights_or_energies_are_named():
    x = [(torch.rand(2, 1, 8, 8), None)]
    with pytest.raises(ValueError, match="memory forward was off"):
        model_patch_diversity(modwire.create_model("ait_micro", eval_memory_forward=False).eval(), x)
    with pytest.raises(ValueError, match="no Hopfield energies"):
        collect_energies(modwire.create_model("ait_micro", retrieval="attention").eval(), x)
