"""The factory module the training-verdict tests write beside their configs (``nets.py``): a
tiny net whose ``late`` layer scales its output by 1.01 from its ``start``-th call on (a layer
bug that starts at step k). ``LATE_NET`` holds the classes; a test appends its factories."""

from __future__ import annotations

LATE_NET = """
import torch


class Late(torch.nn.Module):
    def __init__(self, start):
        super().__init__()
        self.start, self.calls = start, 0

    def forward(self, x):
        self.calls += 1
        return x * 1.01 if self.calls > self.start else x


class Net(torch.nn.Module):
    def __init__(self, start=10**6):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 16)
        self.up = torch.nn.Linear(16, 16)
        self.late = Late(start)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, input_ids):
        return self.head(self.late(torch.tanh(self.up(self.embed(input_ids)))))

"""

NETS = (
    LATE_NET
    + """
def build(**kwargs):
    return Net(**kwargs)
"""
)
