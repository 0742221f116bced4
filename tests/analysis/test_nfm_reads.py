"""modwire.analysis.nfm: which layers and passes the NFM readers read (heatmap, top-down share)."""
import math

import pytest
import torch
from torch import nn

from modwire.analysis.nfm import is_top_down, plot_read_map, read_map, read_map_from_records
from modwire.models.nfm import NFMModelRecord
from modwire.nn.nfm import NFM, NFMRecord


def rec(p, i, sources, mass, null):
    return NFMRecord(p, i, sources, torch.tensor(mass, dtype=torch.float64), torch.tensor(null, dtype=torch.float64))


def test_read_map_averages_records_and_splits_top_down():
    # 2 passes × 2 blocks; batch of 2 then batch of 1 (every sample weighted equally)
    def batch(scale, b):
        return [rec(0, 0, [], [[]] * b, [1.0] * b),
                rec(0, 1, [(0, 0)], [[0.5 * scale]] * b, [1 - 0.5 * scale] * b),
                rec(1, 0, [(0, 0), (0, 1)], [[0.2, 0.6]] * b, [0.2] * b),
                rec(1, 1, [(0, 0), (0, 1), (1, 0)], [[0.1, 0.3, 0.4]] * b, [0.2] * b)]
    rm = read_map_from_records([batch(1.0, 2), batch(0.4, 1)])
    assert rm.samples == 3 and rm.readers == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert rm.sources == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert math.isclose(rm.mass[1, 0].item(), (2 * 0.5 + 0.2) / 3)
    assert torch.isnan(rm.mass[0]).all() and torch.isnan(rm.mass[1, 1:]).all() and torch.isnan(rm.mass[3, 3])
    # top-down: earlier pass and block >= the reader's; reader (1, 0) reads (0, 0) and (0, 1), both top-down
    assert is_top_down((1, 0), (0, 0)) and is_top_down((1, 1), (0, 1)) and not is_top_down((1, 1), (0, 0))
    td = rm.top_down_share()
    assert torch.isnan(td[:2]).all()
    assert math.isclose(td[2].item(), 1.0) and math.isclose(td[3].item(), 0.3 / 0.8)
    s = rm.summary()
    assert math.isclose(s["top_down_share"], (1.0 + 0.375) / 2) and s["samples"] == 3


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = NFM([nn.Conv2d(2, 3, 3, 2, 1), nn.Conv2d(3, 3, 3, 1, 1)], channels=[2, 3, 3], k=2)

    def forward_record(self, x):
        h = self.body(x, record=True)
        return NFMModelRecord(logits=h.mean((2, 3)), states=h, nfm=list(self.body.records))


def test_read_map_of_a_model_and_heatmap(tmp_path):
    torch.manual_seed(0)
    model = Tiny().train()
    loader = [(torch.randn(4, 2, 8, 8), torch.zeros(4)) for _ in range(3)]
    rm = read_map(model, loader, max_batches=2)
    assert model.training and rm.samples == 8
    total = rm.mass.nan_to_num(0).sum(-1) + rm.null       # each reader's mass sums to one
    torch.testing.assert_close(total, torch.ones(4, dtype=torch.float64))
    path = plot_read_map(rm, tmp_path / "reads.png")
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="is NFM enabled"):
        read_map_from_records([])
