"""Targets for ``fxopt plan`` in the tests: functions returning (model, example_inputs)."""

import torch
from models import Block


def fxopt_plan_target():
    torch.manual_seed(0)
    return Block(dim=64, heads=4), (torch.randn(8, 32, 64),)


def not_a_pair():
    return Block()
