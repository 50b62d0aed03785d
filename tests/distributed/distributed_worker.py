"""One rank of the distributed tests (tests/distributed/test_distributed.py starts two).

``python distributed_worker.py ddp|fsdp2 OUT_JSON`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set: builds a tiny transformers GPT-2 (dropout off, so that runs compare
exactly), wraps it in DDP or FSDP2 (``fully_shard``) on the CPU with gloo, and per fxopt
configuration runs one step uncompiled and one compiled with fxopt from the same weights
and data (different data per rank, so the gradients are really all-reduced). Rank 0 writes,
per configuration, the largest loss and gradient differences, which fxopt passes fired, and
the gradient scale, to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import transformers
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

import fxopt

VOCAB = 64
CONFIGS = {"defaults": {}, "budget-0.5": {"codegen": "fx", "memory_budget": 0.5},
           "tempo": {"tempo": True}}


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=1,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager", use_cache=False)
    return transformers.GPT2LMHeadModel(config).train()


def wrap(model: torch.nn.Module, how: str) -> torch.nn.Module:
    if how == "ddp":
        return DistributedDataParallel(model)
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    return model


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A gradient as one plain tensor (FSDP2's are sharded DTensors)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def step(how: str, options: dict | None, ids: torch.Tensor
         ) -> tuple[float, dict[str, torch.Tensor], list]:
    model = wrap(gpt2(), how)
    backend = None if options is None else fxopt.backend(**options)
    run = model if backend is None else torch.compile(model, backend=backend)
    loss = run(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {name: full(p.grad).detach().clone() for name, p in model.named_parameters()}
    fired = sorted({r.name for g in (backend.graphs if backend else []) for r in g.passes
                    if r.fired})
    return loss.item(), grads, fired


def main() -> None:
    how, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    ids = torch.randint(0, VOCAB, (2, 12))
    ref_loss, ref_grads, _ = step(how, None, ids)
    results = {}
    for name, options in CONFIGS.items():
        torch._dynamo.reset()
        loss, grads, fired = step(how, options, ids)
        assert grads.keys() == ref_grads.keys()
        results[name] = {
            "loss_diff": abs(loss - ref_loss),
            "grad_diff": max((g - ref_grads[k]).abs().max().item() for k, g in grads.items()),
            "grad_scale": max(g.abs().max().item() for g in ref_grads.values()),
            "fired": fired,
        }
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
