"""Calls that write tensors as a side effect, though neither their name nor their schema says so: a batch or instance
norm's running statistics in training, an embedding's weight renormalized to `max_norm` (`mutation.hidden_writes`).
Before the seventy-eighth session such a call ran on the module's own buffers while the IR read them as values: a read
of the statistics after the call gave the old ones, a read before it the new ones (and CSE merged the two)."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dlblas_compiler as dc


class StatsAround(nn.Module):
    """Reads a batch norm's running mean before and after the norm updates it, an instance norm's after."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x, x3):
        before = self.bn.running_mean * 2
        y = self.bn(x)
        z = F.instance_norm(x3, self.rm, self.rv, use_input_stats=True, momentum=0.5)
        return y, before, self.bn.running_mean * 2, z, self.rm + 0


class RenormedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, max_norm=1.0)

    def forward(self, ids):
        old = self.emb.weight * 1
        return self.emb(ids), old, self.emb.weight * 2


def _compiled(m, how):
    if how == "dynamo":
        torch._dynamo.reset()
        return torch.compile(m, backend="dlblas", options={"backend": "interpret", "tune": "none"})
    return dc.compile(m, backend=how)


@pytest.mark.parametrize("how", ["reference", "interpret", "dynamo"])
def test_running_statistics_written_in_training_are_read_in_eagers_order(how):
    torch.manual_seed(0)
    m = StatsAround().train()
    with torch.no_grad():
        m.bn.weight.normal_()
    twin = copy.deepcopy(m)
    cm = _compiled(m, how)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # (the statistics move at every call)
        x, x3 = torch.randn(5, 4, generator=g) * 3 + 1, torch.randn(2, 3, 5, generator=g) * 2 - 1
        with torch.no_grad():
            got, want = cm(x, x3), twin(x, x3)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(m.state_dict().items(), twin.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert m.bn.num_batches_tracked.item() == 3


@pytest.mark.parametrize("how", ["reference", "interpret", "dynamo"])
def test_an_embeddings_weight_renormalized_in_forward_is_read_in_eagers_order(how):
    torch.manual_seed(0)
    m = RenormedEmbedding()
    with torch.no_grad():
        m.emb.weight.mul_(3)
    twin = copy.deepcopy(m)
    cm = _compiled(m, how)
    ids = torch.tensor([[1, 4, 4], [7, 0, 2]])
    with torch.no_grad():
        got, want = cm(ids), twin(ids)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.emb.weight, twin.emb.weight, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got[1], got[2] / 2)  # (the rows it touched changed)


class OnlyTheNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.emb = nn.Embedding(10, 4, max_norm=1.0)

    def forward(self, x, ids):
        return self.bn(x) + self.emb(ids)


@pytest.mark.parametrize("how", ["reference", "dynamo"])
def test_a_side_effect_nothing_else_reads_writes_the_tensor_itself(how):
    """Where the call is the only reader of what it writes, it writes the module's tensors themselves, as eager: no
    copies and nothing copied back (an embedding's whole weight had been cloned and copied back on every call)."""
    torch.manual_seed(0)
    m = OnlyTheNorms().train()
    with torch.no_grad():
        m.emb.weight.mul_(3)
    twin = copy.deepcopy(m)
    cm = _compiled(m, how)
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        x, ids = torch.randn(5, 4, generator=g) * 2 + 1, torch.randint(0, 10, (5,), generator=g)
        with torch.no_grad():
            torch.testing.assert_close(cm(x, ids), twin(x, ids), rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(m.state_dict().items(), twin.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    if how == "reference":
        assert not cm._spec().imported.writes or all(k != "param" or "emb" not in key
                                                     for k, key, _ in cm._spec().imported.writes)  # fmt: skip
