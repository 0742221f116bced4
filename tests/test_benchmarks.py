"""The benchmark scripts stay runnable (tiny sizes; their ratios are not checked here:
speed targets live in the benchmarks, not in timed unit tests)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow      # ~5 s (make test stays under 10 minutes)
def test_bench_nac_quick_runs_and_reports_every_section():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nac.py"), "--quick"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert re.search(r"fp32 matmul peak .*: [\d,.]+ GFLOP/s", out)
    err = float(re.search(r"max \|factorized - literal\| = ([\d.e+-]+)", out).group(1))
    assert err < 1e-4  # the two read-in methods agree
    assert re.search(r"read-in speed-up \(attention forward\): [\d.]+x", out)
    assert re.search(r"throughput NAC / PIO \(inference\): [\d.]+", out)


def test_bench_block_sparse_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_block_sparse.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    diffs = [float(d) for d in re.findall(r"x +([\d.e+-]+) +\(built in", out)]
    assert len(diffs) == 12 and max(diffs) < 1e-5  # block-sparse == dense masked attention
    assert re.search(r"attention speed-up at 90% removed, block \d+: [\d.]+x", out)
    assert "whole TransformerBlock" in out


@pytest.mark.slow
def test_bench_graph_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_graph.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    diff = float(re.search(r"max \|difference\| \(float64\) ([\d.e+-]+)", out).group(1))
    assert diff < 1e-9  # matmul Eq. 9 == literal Eq. 9
    assert re.search(r"slowest match at U=\d+: [\d.]+ s", out)


@pytest.mark.slow
def test_bench_sparsify_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sparsify.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"NAC speed-up at 87.5% modules dropped: [\d.]+x", out)
    assert re.search(r"Perceiver IO speed-up at 87.5% latents dropped: [\d.]+x", out)
    rows = re.findall(r"^ +([\d.]+)% +(\d+) +[\d.]+ +[\d.]+ +([\d.]+)x +([\d.]+) +([\d.]+)x$", out, flags=re.M)
    assert [(r[0], r[1]) for r in rows] == [("0.0", "64"), ("50.0", "32"), ("75.0", "16"), ("87.5", "8")] * 2
    for model in (rows[:4], rows[4:]):   # fewer modules, fewer FLOPs; the FLOP ratio is full / dropped
        gflops = [float(r[3]) for r in model]
        assert gflops == sorted(gflops, reverse=True) and float(model[0][4]) == 1.0
        assert float(model[-1][4]) == pytest.approx(gflops[0] / gflops[-1], rel=0.05)  # GFLOPs printed to 3 decimals


@pytest.mark.slow
def test_bench_startup_runs_and_prints_a_row_per_preset():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_startup.py"), "--presets", "*micro",
                          "--repeat", "1"], capture_output=True, text=True, timeout=120, check=True).stdout
    rows = re.findall(r"^(\w+) +[\d.]+M +[\d.]+s +[\d.]+s +[\d.]+x +[\d.]+s +[\d.]+s$", out, flags=re.M)
    import modwire
    assert rows == modwire.list_models("*micro") and "vit_micro" in rows     # one row per preset, sorted


def test_bench_nfm_quick_times_every_registered_micro_pair():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nfm.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    rows = dict(re.findall(r"^(\w+) +8 +[\d.]+ +[\d.]+ +[\d.]+ +([\d.]+) +[\d.]+ ", out, flags=re.M))
    assert "preact_resnet_micro" in rows and float(rows["preact_resnet_micro"]) > 1   # two passes and readers


@pytest.mark.slow
def test_bench_nfm_compile_times_the_compiled_pair_and_the_eager_nfm_in_the_same_rounds(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nfm.py"), "--quick", "--compile",
                          "--presets", "preact_resnet_micro", "--out", str(tmp_path / "c.json"),
                          "--markdown", str(tmp_path / "c.md")], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    speed = re.search(r"^preact_resnet_micro +NFM compiled / eager \(speed: .*\): train ([\d.]+), eval ([\d.]+)$",
                      out, flags=re.M)
    row = json.loads((tmp_path / "c.json").read_text())["rows"][0]
    assert speed and float(speed[1]) == pytest.approx(row["nfm eager"] / row["nfm"], abs=0.006)
    assert row["label"] == "preact_resnet_micro" and row["nfm eager"] > 0 and row["eval nfm eager"] > 0
    base = re.search(r"^preact_resnet_micro +base compiled / eager \(speed\): train ([\d.]+), eval ([\d.]+)$", out, flags=re.M)
    assert base and float(base[1]) == pytest.approx(row["base eager"] / row["base"], abs=0.006)
    md = (tmp_path / "c.md").read_text()
    assert "torch.compile(fullgraph=True) on both sides" in md and "| NFM compiled / eager, speed (train) | (eval) |" in md
    assert "| base compiled / eager, speed (train) | (eval) |" in md


@pytest.mark.slow
def test_bench_nfm_compile_readers_compiles_only_the_readers_and_times_the_eager_nfm_beside(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nfm.py"), "--quick", "--compile", "readers",
                          "--presets", "preact_resnet_micro", "--out", str(tmp_path / "r.json"),
                          "--markdown", str(tmp_path / "r.md")], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    speed = re.search(r"^preact_resnet_micro +NFM compiled / eager \(speed: .*\): train ([\d.]+), eval ([\d.]+)$",
                      out, flags=re.M)
    result = json.loads((tmp_path / "r.json").read_text())
    row = result["rows"][0]
    assert result["compile"] == "readers" and speed
    assert float(speed[2]) == pytest.approx(row["eval nfm eager"] / row["eval nfm"], abs=0.006)
    assert "the NFM's readers compiled (each NFMLayer.read)" in (tmp_path / "r.md").read_text()


def test_bench_nfm_channels_last_times_the_channels_first_pair_in_the_same_rounds(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nfm.py"), "--quick", "--channels-last",
                          "--presets", "preact_resnet_micro", "transformer_lm_micro", "--out", str(tmp_path / "l.json"),
                          "--markdown", str(tmp_path / "l.md")], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    result = json.loads((tmp_path / "l.json").read_text())
    rows = {r["label"]: r for r in result["rows"]}
    speed = re.search(r"^preact_resnet_micro +channels-last / channels-first \(speed: .*\): NFM train ([\d.]+), "
                      r"eval ([\d.]+); base train ([\d.]+), eval ([\d.]+)$", out, flags=re.M)
    image = rows["preact_resnet_micro"]
    assert result["channels_last"] is True and speed
    for got, name in zip(speed.groups(), ("nfm", "eval nfm", "base", "eval base")):
        assert float(got) == pytest.approx(image[f"{name} channels-first"] / image[name], abs=0.006)
    assert not any(k.endswith("channels-first") for k in rows["transformer_lm_micro"])   # token ids: no image
    md = (tmp_path / "l.md").read_text()
    assert "both models and their image inputs channels-last" in md
    assert re.search(r"^\| transformer_lm_micro \|.* — \| — \| — \| — \|$", md, flags=re.M)


def test_bench_nfm_times_channels_last_copies_and_the_channels_first_models_as_they_are(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_nfm
    seen = []

    def train_step(model, inputs, precision="fp32"):
        conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels > 1)
        last = torch.channels_last
        seen.append((conv.weight.is_contiguous(memory_format=last), inputs[0][0].is_contiguous(memory_format=last),
                     inputs[0][0].is_contiguous()))
        return lambda: None
    monkeypatch.setattr(bench_nfm, "train_step", train_step)
    bench_nfm.measure("preact_resnet_micro", "nfm_preact_resnet_micro", "preact_resnet_micro", {"in_channels": 3},
                      2, 1, torch.device("cpu"), channels_last=True)          # 3 channels: the two layouts differ
    # the timed base and NFM: channels-last weights and image; the channels-first NFM and base in the same rounds
    assert seen == [(True, True, False)] * 2 + [(False, False, True)] * 2


def test_bench_nfm_refuses_channels_last_with_compile():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nfm.py"), "--quick", "--channels-last",
                           "--compile"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--channels-last times the current eager models" in done.stderr


@pytest.mark.slow      # ~5 s (make test stays under 10 minutes)
def test_bench_checkpointing_quick_times_both_sides_and_counts_what_the_forward_keeps(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_checkpointing.py"), "--quick", "--presets",
                          "vit_micro", "ni_micro", "--out", str(tmp_path / "c.json"), "--markdown", str(tmp_path / "c.md")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = {r["preset"]: r for r in json.loads((tmp_path / "c.json").read_text())["rows"]}
    assert list(rows) == ["vit_micro", "ni_micro"]
    for name, r in rows.items():
        assert 0 < r["kept_checkpointed"] < r["kept_plain"] / 2, r       # the blocks' activations are not kept
        assert r["time_ratio"] == pytest.approx(r["checkpointed_s"] / r["plain_s"]) and r["peak_plain"] is None
        printed = re.search(rf"^{name} +8 +[\d.]+ +[\d.]+ +([\d.]+) +[\d.]+ +[\d.]+ +([\d.]+)$", out, flags=re.M)
        assert printed and float(printed[2]) == pytest.approx(r["kept_ratio"], abs=0.0006)
    assert f"| ni_micro | 8 |" in (tmp_path / "c.md").read_text()


def test_bench_checkpointing_refuses_an_unknown_preset_naming_it():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_checkpointing.py"), "--presets", "vit_mikro"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown ['vit_mikro']" in done.stderr


def test_bench_nfm_renders_a_former_compiled_run_whose_compile_field_is_true(tmp_path):
    former = ROOT / "benchmarks" / "results" / "nfm_compiled_cpu_8976363.json"
    assert json.loads(former.read_text())["compile"] is True
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nfm.py"), "--from-json", str(former),
                    "--markdown", str(tmp_path / "f.md")], capture_output=True, text=True, timeout=120, check=True)
    assert (tmp_path / "f.md").read_text() == (ROOT / "benchmarks" / "results" / "nfm_compiled_cpu_8976363.md").read_text()


@pytest.mark.slow
def test_profile_nfm_prints_and_writes_the_top_operators_of_a_micro_pair(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_nfm.py"), "--pair", "micro", "--batch", "4",
                          "--top", "3", "--out", str(tmp_path / "p.json"), "--markdown", str(tmp_path / "p.md")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"^micro: base [\d.]+ ms, nfm [\d.]+ ms, readers \d+ %", out, flags=re.M)
    result = json.loads((tmp_path / "p.json").read_text())
    row = result["rows"][0]
    topk = result["keys_axis_topk"]                          # the former top-k rule beside the current one
    assert topk["former_ms"] > 0 and topk["current_ms"] > 0 and topk["shape"] == [16, 4, 44, 361]
    assert len(row["top"]) == 3 and row["nfm_ms"] > 0 and row["base_ms"] > 0        # times: not compared here
    assert row["reader_forward_product_elements"] > 0 and row["base_forward_macs"] > 0
    floor = row["floor"]                                     # two passes plus the multiplies: above 2 by construction
    assert floor["products_ms"] > 0 and floor["floor_nfm_over_base"] == pytest.approx(
        2 + floor["products_ms"] / floor["base_step_ms"], rel=0.02)
    assert "| op | self ms | share | calls |" in (tmp_path / "p.md").read_text()
    assert "Floor: the readers' multiplies alone" in (tmp_path / "p.md").read_text()


def test_bench_input_checks_runs_and_reports_the_ratio():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_input_checks.py"), "--pairs", "2",
                          "--batch", "2"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"with / without checks \(median of 2 interleaved pairs\): [\d.]+", out)
    assert re.search(r"check_input alone: \d+ us = [\d.]+% of a forward", out)


def test_graph_align_quick_prints_a_row_per_prior_and_kernel():
    out = subprocess.run([sys.executable, "-m", "modwire.experiments.graph_align", "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    rows = re.findall(r"^\| (\w+) \| 16 \| [\d.]+, [\d.]+ \| ([\d.]+) / ([\d.]+) / ([\d.]+) \| (\d+)% .* \| (\d+)% .*\|$",
                      out, flags=re.M)
    assert sorted(r[0] for r in rows) == sorted(["erdos_renyi", "planted_partition", "ring_of_cliques",
                                                 "scale_free"] * 2)
    for name, lo, med, hi, _, inv_degree in rows:
        assert float(lo) <= float(med) <= float(hi)
        assert inv_degree == "100"   # degree alignment makes the loss invariant to relabelling
        if name == "erdos_renyi":    # a constant prior: both aligns give the same loss
            assert (lo, med, hi) == ("1.000", "1.000", "1.000")


@pytest.mark.slow
def test_conditional_nac_quick_prints_what_it_saves(tmp_path):
    out = subprocess.run([sys.executable, "-m", "modwire.experiments.conditional_nac", "--quick",
                          "--seeds", "0", "--out", str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    (saved,) = json.loads((tmp_path / "run" / "experiment.json").read_text())["seeds"]
    assert json.loads((tmp_path / "run" / "study.json").read_text())["results"] == [saved]
    for fam in ("non_relational", "relational"):
        row = re.search(rf"^{fam} +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", out, re.M)
        acc, other, blank, maj, q, q36 = map(float, row.groups())
        assert acc == pytest.approx(saved["test"][f"top1_{fam}"], abs=5e-4)
        assert acc == pytest.approx(saved["image_ablation"]["own_image"][f"top1_{fam}"], abs=5e-4)
        assert other == pytest.approx(saved["image_ablation"]["other_image"][f"top1_{fam}"], abs=5e-4)
        assert blank == pytest.approx(saved["image_ablation"]["blank_image"][f"top1_{fam}"], abs=5e-4)
        assert maj == pytest.approx(saved["baselines"][fam]["majority"], abs=5e-4)
        assert q == pytest.approx(saved["baselines"][fam]["question_only"], abs=5e-4)
        assert q36 == pytest.approx(saved["baselines"][fam]["question_only_36"], abs=5e-4)
        assert 0 < maj <= 1 and 0 <= q <= 1
    sep = saved["separation_trained"]
    assert 0 <= sep["accuracy"] <= 1 and 0 < sep["chance"] < 1
    assert sep == saved["generators"]["trained"]["separation"]["question_type"]
    for g in ("trained", "untrained"):
        var = saved["generators"][g]["variance"]
        assert var["within_cell"] == pytest.approx(0.0, abs=1e-6)     # P is a function of the question
        assert saved["image_share"][g]["initial_states"]["image"] == pytest.approx(0.0, abs=1e-6)  # θ⁰: question only
    assert (tmp_path / "run" / "seed_0" / "analysis" / "link_prob_embedding.png").is_file()
    assert "~64%" in out and "53%" in out   # the paper's numbers, printed next to the run's


def test_bench_vit_quick_runs_and_matches_the_torch_encoder():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_vit.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    diff = float(re.search(r"max \|ours - peer\| = ([\d.e+-]+)", out).group(1))
    assert diff < 1e-5  # our blocks with the peer's weights compute nn.TransformerEncoder's function
    rows = re.findall(r"^  tiny, (inference|train): ([\d.]+)x$", out, flags=re.M)
    assert [r[0] for r in rows] == ["inference", "train"] and all(float(r[1]) > 0 for r in rows)


def test_bench_vit_quick_runs_in_bf16_autocast():
    # --precision bf16 only: adding --compile takes over a minute on 2 CPU cores (benchmarks/README.md)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_vit.py"), "--quick", "--precision", "bf16"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "device cpu, bf16, eager" in out.splitlines()[0]
    assert float(re.search(r"max \|ours - peer\| = ([\d.e+-]+)", out).group(1)) < 1e-5  # checked in fp32
    rows = re.findall(r"^  tiny, (inference|train): ([\d.]+)x$", out, flags=re.M)
    assert [r[0] for r in rows] == ["inference", "train"] and all(float(r[1]) > 0 for r in rows)


@pytest.mark.slow      # ~5 s (make test stays under 10 minutes)
def test_bench_ni_quick_runs_and_the_loop_matches_the_batched_functions():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ni.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    diff = float(re.search(r"max \|batched - loop\| = ([\d.e+-]+)", out).group(1))
    assert diff < 1e-5  # the per-function loop computes the same Eq. 9-11
    flop_ratio = float(re.search(r"GFLOPs per sample: batched [\d.]+, loop [\d.]+ \(loop / batched ([\d.]+)", out)[1])
    assert flop_ratio == pytest.approx(1, abs=0.01)  # same work (the batched form counts its Σ_u as a matmul)
    assert re.search(r"batched-functions speed-up at U = 5, batch \d+, inference: [\d.]+x", out)
    assert re.search(r"NI / ViT [\d.]+\)", out)
    sweep = re.findall(r"^ +(\d+) +[\d.]+ +([\d.]+)x +[\d.]+x$", out, flags=re.M)
    assert [u for u, _ in sweep] == ["1", "2", "4"] and sweep[0][1] == "1.00"


def test_bench_ait_quick_runs_and_reports_every_section():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ait.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert float(re.search(r"AiT / ViT train step time: ([\d.]+)x", out)[1]) > 0
    fwd, bwd, share = map(float, re.search(r"forward ([\d.]+)%, backward ([\d.]+)% of the step\n"
                                           r"  workspace share of the AiT step: ([\d.]+)%", out).groups())
    # --quick times 2 steps: the median of their sums is the sum of the medians (each printed to 0.1)
    assert 0 < fwd and 0 < bwd and share == pytest.approx(fwd + bwd, abs=0.2) and share < 100
    diff = float(re.search(r"max \|attend top-k - gathered\| = ([\d.e+-]+)", out)[1])
    assert diff < 1e-5  # the gathered formulation computes attend's top-k attention (AiT Eq. 3)
    for mode in ("fwd", "fwd+bwd"):
        assert re.search(rf"attend top-k / dense softmax \({re.escape(mode)}\): [\d.]+x", out)
    assert float(re.search(r"torch.topk share of the attend top-k forward: (\d+)%", out)[1]) > 0


@pytest.mark.slow
def test_bench_compile_quick_prints_and_writes_the_ratios_per_family(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_compile.py"), "--quick", "--out",
                          str(tmp_path / "c.json")], capture_output=True, text=True, timeout=600, check=True).stdout
    data = json.loads((tmp_path / "c.json").read_text())
    assert [r["preset"] for r in data["rows"]] == ["nac_micro", "perceiver_io_micro"]
    assert {"git_commit", "git_dirty", "affinity", "threads", "cpu", "date"} <= set(data["machine"])
    for row in data["rows"]:
        assert "error" not in row and row["train_compiled_over_eager"] > 0 and row["eval_bf16_over_fp32"] > 0
        assert re.search(rf"^{row['preset']} +{row['params']:,} .* train (PASS|FAIL) eval (PASS|FAIL)$", out, re.M)
    met = all(r[f"{m}_goal_met"] for r in data["rows"] for m in ("train", "eval"))
    assert data["goal"]["met"] == met and re.search(rf"for every family, train and eval: {'PASS' if met else 'FAIL'}", out)
    table = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_compile.py"), "--markdown",
                            str(tmp_path / "c.json")], capture_output=True, text=True, timeout=60, check=True).stdout
    assert table.count("\n| `") == 2 and f"| `nac_micro` | {data['rows'][0]['params']:,} |" in table


@pytest.mark.slow
def test_bench_train_loop_quick_prints_the_ratio_and_writes_json(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train_loop.py"), "--quick", "--out",
                          str(tmp_path / "t.json")], capture_output=True, text=True, timeout=300, check=True).stdout
    data = json.loads((tmp_path / "t.json").read_text())
    assert [r["case"] for r in data["rows"]] == ["vit_micro"] and {"machine", "git_commit", "date"} <= set(data)
    row = data["rows"][0]
    assert row["step_samples_per_s"] > 0 and row["ratio_w0"] > 0 and row["ratio_wauto"] > 0
    assert re.search(r"data.num_workers=auto: [\d.]+ samples/s, train / step [\d.]+ (PASS|FAIL)", out)
    assert [g["task"] for g in data["generators"]] == ["triangle", "sort_of_clevr"]


def test_bench_attention_quick_counts_fused_calls_and_writes_json(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_attention.py"), "--quick", "--out",
                          str(tmp_path / "a.json")], capture_output=True, text=True, timeout=600, check=True).stdout
    rows = {(r["preset"], r["mode"]): r for r in json.loads((tmp_path / "a.json").read_text())["rows"]}
    assert set(rows) == {(p, m) for p in ("ni_micro", "nac_micro") for m in ("eval", "train")}
    assert rows["ni_micro", "eval"]["fused"] == rows["ni_micro", "eval"]["calls"] > 0   # 5-D, augmented: fused
    assert rows["nac_micro", "train"]["fused"] < rows["nac_micro", "train"]["calls"]   # learned log K̂ on the CPU
    assert re.search(r"^ni_micro +eval +\d+ +\d+ ", out, re.M)


@pytest.mark.slow      # three runs in a subprocess (~7 CPU-s): a GPU diagnostic (benchmarks/gpu_checks.sh)
def test_check_run_determinism_quick_finds_cpu_runs_bit_identical_with_and_without_workers(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "check_run_determinism.py"), "--quick",
                          "--deterministic", "--out", str(tmp_path / "d.json")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["deterministic"] is True and {"commit", "threads", "device"} <= set(data["machine"])
    [row] = data["rows"]
    assert row["case"] == "nac_micro/toy_sets" and row["max_abs_again"] == row["max_abs_workers"] == 0.0
    assert re.search(r"^nac_micro/toy_sets +0 +0$", out, re.M)


STAND_IN = '''"""A stand-in for the authors' models/model.py: their interface (CNN_MLP_NFL(args), its own Adam,
log-probabilities from (img [B, 3, 75, 75], qst [B, 11])), none of their code."""
import torch
from torch import nn


class CNN_MLP_NFL(nn.Module):
    def __init__(self, args):
        super().__init__()
        print("a constructor that prints")
        self.conv = nn.Conv2d(3, 4, 3, stride=8)
        self.fc = nn.Linear(4 * 10 * 10 + 11, 10)
        self.optimizer = torch.optim.Adam(self.parameters(), lr=args.lr)

    def forward(self, img, qst):
        return self.fc(torch.cat([self.conv(img).flatten(1), qst], 1)).log_softmax(-1)
'''


def test_bench_nfm_authors_says_what_checkout_it_needs(tmp_path):
    script = str(ROOT / "benchmarks" / "bench_nfm_authors.py")
    for extra in ([], ["--authors-repo", str(tmp_path)]):            # none given; a directory without their files
        res = subprocess.run([sys.executable, script, "--quick", *extra], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "git clone https://github.com/Slowika/NeuralFunctionModules" in res.stderr
        assert "models/model.py" in res.stderr and "CNN_MLP_NFL" in res.stderr
        assert ("got none" if not extra else f"{tmp_path} has no models/model.py") in res.stderr


@pytest.mark.slow      # ~5 s (make test stays under 10 minutes)
def test_bench_nfm_authors_quick_times_every_side_with_a_stand_in_checkout(tmp_path):
    """The script's whole path (import from the checkout, the five models, ratios, JSON) on a stand-in for
    the authors' repository: the suite never reads their code (benchmarks/README.md says how to get it)."""
    repo = tmp_path / "NeuralFunctionModules"
    (repo / "models").mkdir(parents=True)
    (repo / "models" / "model.py").write_text(STAND_IN)
    (repo / "models" / "attentive_densenet.py").write_text("")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_nfm_authors.py"), "--authors-repo",
                          str(repo), "--quick", "--out", str(tmp_path / "a.json")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "a constructor that prints" not in out and not (repo / "models" / "__pycache__").exists()
    data = json.loads((tmp_path / "a.json").read_text())
    assert [r["model"] for r in data["rows"]] == ["authors nfm", "modwire nfm (authors' arch)",
                                                  "modwire base (authors' widths)", "modwire nfm (paper)",
                                                  "modwire base (paper)"]
    assert data["rows"][0]["params"] == 4 * 3 * 9 + 4 + 411 * 10 + 10 and all(r["train_s"] > 0 for r in data["rows"])
    assert data["machine"]["authors"]["path"] == str(repo) and data["machine"]["authors"]["git_commit"] is None
    assert {"affinity", "loadavg", "threads", "torch", "cpu", "date", "git_commit", "git_dirty"} <= set(data["machine"])
    first = data["ratios"][0]
    assert first["train"] == pytest.approx(data["rows"][0]["train_s"] / data["rows"][1]["train_s"])
    assert [g["value"] for g in data["goals"]] == [first["train"], data["ratios"][1]["train"]]
    assert all(g["pass"] is None for g in data["goals"])                                 # --quick: not checked
    assert re.search(r"^authors / modwire, same network: train [\d.]+x, eval [\d.]+x$", out, re.M)
    assert len(re.findall(r"^goal .* >= 2.0: [\d.]+ not checked \(--quick\)$", out, re.M)) == 2
    assert len(data["ratios"]) == 5 and data["batch"] == 2 and data["repeats"] == 1


@pytest.mark.slow
def test_bench_flex_quick_writes_a_row_per_preset_and_mode(tmp_path):
    out = tmp_path / "flex.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_flex.py"), "--quick", "--out", str(out)],
                   capture_output=True, text=True, timeout=600, check=True)
    data = json.loads(out.read_text())
    assert data["machine"]["torch"] and "pinned_to" in data["machine"]
    rows = {(r["preset"], r["mode"]): r for r in data["rows"]}
    assert set(rows) == {(p, m) for p in ("nac_micro", "ni_micro", "vit_micro") for m in ("eval", "train")}
    for (preset, mode), r in rows.items():
        assert r["sdpa_ms"] > 0 and 0 <= r["flex_calls"] <= r["calls"]
        if mode == "eval":                      # FlexAttention runs every attention call in evaluation
            assert r["flex_calls"] == r["calls"] > 0 and r["flex_ms"] > 0
        else:                                   # on the CPU, training takes SDPA: nothing timed
            assert r["flex_calls"] == 0 and r["flex_ms"] is None


@pytest.mark.slow
def test_bench_thp_times_each_pair_in_children_without_and_with_the_variable(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_thp.py"), "--pairs", "soc", "--rounds", "2",
                          "--repeats", "1", "--out", str(tmp_path / "t.json"), "--markdown", str(tmp_path / "t.md")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    (row,) = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert [r["thp"] for r in row["rounds"]["off"]] == [False, False]       # each side's children saw its setting
    assert [r["thp"] for r in row["rounds"]["on"]] == [True, True]
    assert row["nfm speed"] == pytest.approx(row["off"]["nfm"] / row["on"]["nfm"])
    assert row["nfm/base on"] == pytest.approx(row["on"]["nfm"] / row["on"]["base"])
    assert row["on"]["nfm"] > row["on"]["base"] > 0
    assert f"{row['nfm speed']:.2f}×" in (tmp_path / "t.md").read_text() and "Sort-of-CLEVR" in out


@pytest.mark.parametrize("flag", ["--rounds", "--repeats"])
def test_bench_thp_refuses_a_count_below_one_naming_it(flag):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_thp.py"), flag, "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{flag}: expected an integer >= 1, got 0" in done.stderr
    assert "Traceback" not in done.stderr
