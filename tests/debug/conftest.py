"""Dumps shared by the debug tests: an MLP compiled with test passes that change its
forward graph (and record each pass's true input and output), and the same MLP compiled
without them, each into its own debug_dir."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from debug_passes import PLANS_ONLY, SPLIT_ADDMM, GraphRecorder
from models import MLP

from fxopt.compiler import Backend
from fxopt.testing import extra_passes


@dataclass
class Dumped:
    root: Path
    recorder: GraphRecorder
    backend: Backend

    def dumped(self, graph: str) -> str:
        """The dump's name ("g0/forward") of a graph the compiler named ("g7/forward"):
        a dump numbers its own graphs."""
        compiled_as, _, kind = graph.partition("/")
        files = json.loads((self.root / "index.json").read_text())["files"]
        local = next(e["graph"] for e in files if e["compiled_as"] == compiled_as)
        return f"{local}/{kind}" if kind else local


def compile_and_step(model, args, root, passes=()):
    """One forward and backward under fxopt with debug_dir=root and extra passes."""
    recorder = GraphRecorder()
    with extra_passes(*passes):
        backend = Backend({"debug_dir": str(root)}, instruments=(recorder,))
        torch.compile(model, backend=backend)(*args).sum().backward()
    torch._dynamo.reset()
    return Dumped(root, recorder, backend)


@pytest.fixture(scope="session")
def mlp_dump(tmp_path_factory):
    torch.manual_seed(0)
    return compile_and_step(MLP(), (torch.randn(3, 13),), tmp_path_factory.mktemp("passes"),
                            (SPLIT_ADDMM, PLANS_ONLY))


@pytest.fixture(scope="session")
def plain_dump(tmp_path_factory):
    torch.manual_seed(0)
    return compile_and_step(MLP(), (torch.randn(3, 13),), tmp_path_factory.mktemp("plain"))
