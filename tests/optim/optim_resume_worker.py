"""The resumed half of the offloaded optimizer's resume tests, run in a process of its own.

``python optim_resume_worker.py CHECKPOINT DTYPE ORDER MODE OUT [CHECKPOINT DTYPE ORDER
MODE OUT ...]`` runs one resume per five arguments (one process for all, which saves a torch
import each): it builds a fresh model (other initial weights, so every load must take
effect) and an offloaded AdamW of MODE (``MODES``) with a StepLR schedule, loads CHECKPOINT
in ORDER ("wrap-then-load":
optimizer built, then the model's weights loaded; "load-then-wrap": weights loaded, then the
optimizer built), trains ``STEPS`` more steps with gradient clipping and saves the model's
and the optimizer's state dicts to OUT. The test module imports the same builders, so both
halves train one recipe.
"""

import sys

import torch
from torch import nn

import fxopt

STEPS = 5
ORDERS = ("wrap-then-load", "load-then-wrap")
# The offload options of each mode: half the subgroups on the host (host and device
# updates), or all of them there, half updated on the host, half staged to the device.
MODES = {"split": {"cpu_fraction": 0.5}, "staged": {"cpu_fraction": 1.0, "staged": 0.5}}


def build_model(dtype: torch.dtype, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(13, 37), nn.GELU(), nn.Linear(37, 5)).to(dtype)


def build_optimizer(model: nn.Module, mode: str = "split"):
    # 4 subgroups: two update paths run in each mode
    optimizer = fxopt.optim.offload(
        torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), model,
        subgroups=4, **MODES[mode])
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def train(model: nn.Module, optimizer, scheduler, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        x = torch.randn(6, 13, generator=generator).to(dtype)
        optimizer.zero_grad()
        model(x).float().pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)  # in place
        optimizer.step()
        scheduler.step()


def resume(checkpoint_path: str, dtype_name: str, order: str, mode: str,
           out_path: str) -> None:
    checkpoint = torch.load(checkpoint_path)
    model = build_model(getattr(torch, dtype_name), seed=123)
    if order == "wrap-then-load":
        optimizer, scheduler = build_optimizer(model, mode)
        model.load_state_dict(checkpoint["model"])
    elif order == "load-then-wrap":
        model.load_state_dict(checkpoint["model"])
        optimizer, scheduler = build_optimizer(model, mode)
    else:
        raise ValueError(f"unknown order {order!r}; expected one of {ORDERS}")
    optimizer.load_state_dict(checkpoint["optim"])
    scheduler.load_state_dict(checkpoint["sched"])
    train(model, optimizer, scheduler, STEPS, seed=1)
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, out_path)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if not arguments or len(arguments) % 5:
        raise SystemExit(__doc__)
    for start in range(0, len(arguments), 5):
        resume(*arguments[start:start + 5])
