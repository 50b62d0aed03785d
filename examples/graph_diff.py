"""What did each pass do to my graphs? fxopt's debug dump and ``fxopt diff`` on GPT-2.

    python examples/graph_diff.py                        # tiny GPT-2 (transformers, random weights)
    fxopt diff fxopt_debug/tempo                         # per pass: nodes added/removed/changed
    fxopt diff fxopt_debug/plain fxopt_debug/tempo       # two option sets, graph by graph
    fxopt diff fxopt_debug/tempo --html diff.html        # side by side in a browser

It runs one training step (forward and backward) of a tiny transformers GPT-2 compiled by
fxopt twice, dumping with ``options={"debug_dir": ...}``: with the default options
(fxopt_debug/plain) and with the ``tempo`` pass, which replaces GPT-2's GELU, LayerNorms and
attention softmax-dropout by memory-lean fxopt ops before autograd (fxopt_debug/tempo). It
prints what tempo did to the captured graph, then how the two runs' joint, forward and
backward graphs differ, with the activation memory each keeps for backward, and writes the
HTML page (fxopt_debug/diff.html).
"""

from __future__ import annotations

import argparse

import torch

from fxopt.__main__ import main as fxopt_cli

VOCAB = 97


def gpt2(layers: int) -> torch.nn.Module:
    """A transformers GPT-2 with random weights, small enough for a CPU."""
    import transformers

    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64,
                                     n_layer=layers, n_head=4, bos_token_id=0,
                                     eos_token_id=0, use_cache=False,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).train()


def training_step(model: torch.nn.Module, debug_dir: str | None, batch: int = 2,
                  length: int = 16, **options: object) -> None:
    """One forward and backward of ``model`` compiled by fxopt with ``options`` (dumping
    to debug_dir)."""
    if debug_dir is not None:
        options["debug_dir"] = debug_dir
    compiled = torch.compile(model, backend="fxopt", options=options)
    ids = torch.randint(0, VOCAB, (batch, length))
    compiled(input_ids=ids, labels=ids).loss.backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="fxopt_debug", help="where to write the two dumps")
    parser.add_argument("--html", help="where to write the HTML page (default: DIR/diff.html)")
    parser.add_argument("--layers", type=int, default=2, help="GPT-2 layers")
    args = parser.parse_args()
    plain, lean = f"{args.dir}/plain", f"{args.dir}/tempo"
    for debug_dir, options in ((plain, {}), (lean, {"tempo": True})):
        torch._dynamo.reset()
        torch.manual_seed(0)
        training_step(gpt2(args.layers), debug_dir, **options)
    print(f"$ fxopt diff {lean} --stat")
    fxopt_cli(["diff", lean, "--stat"])
    print(f"\n$ fxopt diff {plain} {lean} --stat")
    fxopt_cli(["diff", plain, lean, "--stat"])
    fxopt_cli(["diff", lean, "--html", args.html or f"{args.dir}/diff.html"])


if __name__ == "__main__":
    main()
