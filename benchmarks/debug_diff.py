"""What the debug dump and ``fxopt diff`` cost on a GPT-2 whose backward graph has a few
thousand nodes: the issue asks that the HTML page stay usable at that size.

    python benchmarks/debug_diff.py            # 24-layer GPT-2 (transformers, random weights)
    python benchmarks/debug_diff.py --smoke    # 2 layers, seconds

Prints, in one run: the graphs' node counts; one compiled training step without and with
``debug_dir`` (the dump's overhead as a ratio); the dump's size; ``fxopt diff`` (text) and
``--html`` times; the page's size; and, when /usr/bin/chromium exists, how long headless
Chromium takes to load the page and run its script, next to an empty page (the browser's
own start-up). The tool runs on the host, so the CPU is its real device. A demonstration
pass, ``t_as_permute``, changes both the forward and the backward graphs (every ``aten.t``
becomes the equivalent ``aten.permute``), so both get diffed at full size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.fx as fx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from graph_diff import gpt2, training_step  # noqa: E402

import fxopt  # noqa: E402
from fxopt.__main__ import main as fxopt_cli  # noqa: E402
from fxopt.passes import PassContext, PassResult, PassSpec, Stage  # noqa: E402
from fxopt.testing import extra_passes  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
aten = torch.ops.aten


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


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def step_seconds(layers: int, debug_dir: str | None) -> float:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = gpt2(layers)
    with extra_passes(T_AS_PERMUTE):
        return timed(training_step, model, debug_dir)


def quiet_cli(*argv: str) -> float:
    with contextlib.redirect_stdout(io.StringIO()):
        return timed(fxopt_cli, list(argv))


def chromium_seconds(page: Path, profile: Path, repeats: int = 3) -> float:
    """Best of ``repeats`` loads (the first launch also warms the disk cache)."""
    return min(_chromium_once(page, profile) for _ in range(repeats))


def _chromium_once(page: Path, profile: Path) -> float:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--no-first-run",
               "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
               "--dump-dom", page.as_uri()]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    if result.returncode != 0 or 'class="js' not in result.stdout:
        raise RuntimeError(f"chromium did not render {page}: {result.stderr[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--smoke", action="store_true", help="2 layers")
    args = parser.parse_args()
    layers = 2 if args.smoke else args.layers
    print(f"device cpu ({platform.processor() or platform.machine()}), torch "
          f"{torch.__version__}, fxopt {fxopt.__version__}, python {platform.python_version()}")
    print(f"command: python benchmarks/debug_diff.py {' '.join(sys.argv[1:])}".rstrip())
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "dump"
        step_seconds(1, None)  # warm-up: first imports and Dynamo's one-time set-up
        plain = step_seconds(layers, None)
        dumped = step_seconds(layers, str(root))
        index = json.loads((root / "index.json").read_text())["files"]
        nodes = {f"{e['graph']}/{e['kind']}": e["nodes"] for e in index if e["data"]}
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        print(f"GPT-2 {layers} layers; largest graphs (nodes): " + ", ".join(
            f"{name} {count}" for name, count in sorted(nodes.items(), key=lambda kv: -kv[1])[:3]))
        print(f"compile + one training step: without debug_dir {plain:.2f}s, with "
              f"{dumped:.2f}s (x{dumped / plain:.2f}); dump {size / 2**20:.2f} MiB "
              f"in {len(index)} index entries")
        text = quiet_cli("diff", str(root))
        page = Path(scratch) / "diff.html"
        html = quiet_cli("diff", str(root), "--html", str(page))
        print(f"fxopt diff (text) {text:.2f}s; --html {html:.2f}s, page "
              f"{page.stat().st_size / 2**20:.2f} MiB")
        if shutil.which(CHROMIUM) is None:
            print(f"chromium: not installed at {CHROMIUM}; page load not measured")
            return
        empty = Path(scratch) / "empty.html"
        empty.write_text('<html><body><script>document.body.className="js"</script>'
                         "</body></html>")
        base = chromium_seconds(empty, Path(scratch) / "profile-empty")
        load = chromium_seconds(page, Path(scratch) / "profile-page")
        print(f"headless chromium load + script: empty page {base:.2f}s, diff page "
              f"{load:.2f}s (x{load / base:.2f})")


if __name__ == "__main__":
    main()
