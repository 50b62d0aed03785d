"""What did each pass do to my graphs? fxopt's debug dump and ``fxopt diff`` on GPT-2.

    python examples/graph_diff.py                  # tiny GPT-2 (transformers, random weights)
    fxopt diff fxopt_debug                         # per pass: nodes added/removed/changed
    fxopt diff fxopt_debug --html diff.html        # side by side in a browser

It compiles a tiny transformers GPT-2 with ``options={"debug_dir": ...}``, runs one
training step (forward and backward), then prints ``fxopt diff --stat`` and writes the HTML
page (fxopt_debug/diff.html). So that something changes whatever passes this fxopt
version has, the example adds a demonstration pass, ``t_as_permute``: it rewrites each
``aten.t`` (a transpose, in the forward and backward graphs) as the equivalent
``aten.permute`` and records its provenance as every pass must (``node.meta["fxopt"]``,
fxopt/passes/README.md rule 5).
"""

from __future__ import annotations

import argparse

import torch
import torch.fx as fx

from fxopt.__main__ import main as fxopt_cli
from fxopt.passes import PassContext, PassResult, PassSpec, Stage
from fxopt.testing import extra_passes

aten = torch.ops.aten
VOCAB = 97


def t_as_permute(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    """Demonstration pass: ``aten.t(x)`` -> ``aten.permute(x, [1, 0])`` (same view)."""
    rewritten = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.t.default)):
        if not ctx.rewrites.allow():
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(aten.permute.default, (node.args[0], [1, 0]))
        new.meta["val"] = node.meta["val"]
        new.meta["fxopt"] = {"pass": "t_as_permute", "replaces": [node.name]}
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        rewritten += 1
    return PassResult(gm, rewritten > 0, {"sites": rewritten})


T_AS_PERMUTE = PassSpec(name="t_as_permute", stages=(Stage.FORWARD, Stage.BACKWARD),
                        description="demonstration: aten.t as aten.permute", run=t_as_permute,
                        default=lambda ctx: True, default_text="on (example)")


def gpt2(layers: int) -> torch.nn.Module:
    """A transformers GPT-2 with random weights, small enough for a CPU."""
    import transformers

    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64,
                                     n_layer=layers, n_head=4, bos_token_id=0,
                                     eos_token_id=0, use_cache=False,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).train()


def training_step(model: torch.nn.Module, debug_dir: str | None, batch: int = 2,
                  length: int = 16) -> None:
    """One forward and backward of ``model`` compiled by fxopt (dumping to debug_dir)."""
    options = {} if debug_dir is None else {"debug_dir": debug_dir}
    compiled = torch.compile(model, backend="fxopt", options=options)
    ids = torch.randint(0, VOCAB, (batch, length))
    compiled(input_ids=ids, labels=ids).loss.backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="fxopt_debug", help="the debug_dir to write")
    parser.add_argument("--html", help="where to write the HTML page (default: DIR/diff.html)")
    parser.add_argument("--layers", type=int, default=2, help="GPT-2 layers")
    args = parser.parse_args()
    torch.manual_seed(0)
    with extra_passes(T_AS_PERMUTE):
        training_step(gpt2(args.layers), args.dir)
    print(f"$ fxopt diff {args.dir} --stat")
    fxopt_cli(["diff", args.dir, "--stat"])
    fxopt_cli(["diff", args.dir, "--html", args.html or f"{args.dir}/diff.html"])


if __name__ == "__main__":
    main()
