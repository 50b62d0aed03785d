"""fxopt.devices.indexed: the device every torch.cuda call is given carries its index."""

import torch

from fxopt.devices import indexed


def test_an_unindexed_cuda_device_becomes_the_current_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert indexed(torch.device("cuda")) == torch.device("cuda", 3)
    assert indexed("cuda") == indexed(None) == torch.device("cuda", 3)
    assert indexed("cuda:1") == indexed(1) == torch.device("cuda", 1)
    assert indexed("cpu") == torch.device("cpu")


def test_without_cuda_the_device_is_left_for_torch_to_refuse(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert indexed("cuda") == torch.device("cuda")
