"""Targets for ``fxopt plan`` in the tests: functions returning (model, example_inputs)."""

import torch
from models import Block


def fxopt_plan_target():
    torch.manual_seed(0)
    return Block(dim=64, heads=4), (torch.randn(8, 32, 64),)


def not_a_pair():
    return Block()


class _Broken(torch.nn.Module):
    """Two blocks with a data-dependent branch between them: two Dynamo graphs."""

    def __init__(self):
        super().__init__()
        self.first, self.second = Block(dim=32, heads=4), Block(dim=32, heads=2)

    def forward(self, x):
        h = self.first(x)
        if h.abs().sum() >= 0:  # always true; a tensor's truth value breaks the graph
            h = h * 2
        return self.second(h)


def graph_break():
    torch.manual_seed(0)
    return _Broken(), (torch.randn(4, 16, 32),)
