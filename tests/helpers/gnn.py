"""The GraphSAGE model, training loop and evaluation shared by the accuracy tests."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


class SAGE(torch.nn.Module):
    def __init__(self, dims: list[int], dropout: float, normalize_rows: bool = False):
        from torch_geometric.nn import SAGEConv

        super().__init__()
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout, self.normalize_rows = dropout, normalize_rows

    def forward(self, x, edge_index):
        if self.normalize_rows:  # bag-of-words rows sum to 1 (PyG's NormalizeFeatures)
            x = x / x.sum(1, keepdim=True).clamp(min=1)
        for i, conv in enumerate(self.convs):
            if i or self.normalize_rows:
                x = F.dropout(x, self.dropout, self.training)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def train(model, loader, epochs: int, lr: float, weight_decay: float = 0.0) -> list[float]:
    """Train; returns the mean loss of each epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(epochs):
        model.train()
        total = steps = 0
        for batch in loader:
            opt.zero_grad()
            out = model(batch.x.float(), batch.edge_index)[:batch.batch_size]   # bf16/fp16 transport: upcast
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            opt.step()
            total, steps = total + loss.detach().item(), steps + 1
        losses.append(total / steps)
    return losses


@torch.no_grad()
def accuracy(model, loader, expected_nodes: np.ndarray) -> float:
    """Accuracy over the loader's seeds, which must cover ``expected_nodes`` exactly once."""
    model.eval()
    correct, seen = 0, []
    for batch in loader:
        pred = model(batch.x.float(), batch.edge_index)[:batch.batch_size].argmax(1)
        correct += int((pred == batch.y[:batch.batch_size]).sum())
        seen.append(batch.n_id[:batch.batch_size])
    seen = torch.cat(seen)
    assert sorted(seen.tolist()) == sorted(np.asarray(expected_nodes).tolist()), "evaluation must cover the split once"
    return correct / seen.numel()
