"""The GPU check: fxopt against what users already have, side by side in one process, in
at most 6 minutes of one H100 with compiles included (issue 30.1). Run it first whenever a
GPU is lent (``benchmarks/gpu_session.sh`` runs it after ``fxopt doctor`` and
``pytest -m gpu``).

Sections and configurations (the shape of ``../shared/gpu/h100-2026-11-26.md``, whose
configuration names the rows keep, so that runs compare row by row):

- GPT-2 (transformers GPT2LMHeadModel, 6 x 768, 12 heads, seq 1024, batch 8, vocab 50257,
  SDPA, dropout 0.1, bf16 autocast, the model's own loss with labels = input ids, random
  weights, no optimizer): eager, torch.compile, Inductor at activation_memory_budget 0.5,
  per-block torch.utils.checkpoint; fxopt defaults, tempo=True, memory_budget=0.5 (not
  strict), a byte budget low enough that it must swap (0.4 x eager's peak plus resident);
  and, with transformers' logging graph break ignored (the head and the loss in one graph),
  torch.compile against fxopt's fuse_linear_cross_entropy and fxopt's defaults (whether
  the break holds the defaults' extra logits tensor of the first H100 run).
- The nn.LSTM LM (Embedding(10000, 512) -> nn.LSTM(512, 1024, 2 layers) -> Linear, batch
  32 x seq 128, fp32, Dynamo's allow_rnn): eager (cuDNN), fuse_rnn="auto" (the cost
  model's choice: cuDNN, run once by library_rnn), fuse_rnn=True (its sequence ops: per
  layer one op stepping the fused cells, the launches from Python; predicted host-bound at
  20.6 ms on an H100 against cuDNN's 13.6), memory_budget=0.5 (recompute_rnn), eager
  under checkpoint.
- The LSTMCell loop (the same embedding, one LSTMCell(512, 1024) stepped 64 times, batch
  32): eager, torch.compile, fuse_rnn=True (its fusible cells under Inductor: predicted
  6.4 ms on an H100 against eager's 23.3 and plain torch.compile's 7.4), fuse_rnn=True with
  memory_budget=0.5, eager under checkpoint.
- AdamW (GPT-2 as above without dropout, batch 4): AdamW on the device (Inductor) against
  ``fxopt.optim.offload`` at cpu_fraction 0.5 and 1.0, and at 1.0 with 32 subgroups, where
  the plan stages some on the device (``offload_optimizer=True``).
- GEMMs of that GPT-2 in bf16, one training step's worth each (forward, input gradient,
  weight gradient), against the cost model's prediction (``fxopt.planner.forms`` on the
  device's profile; issue 30.5): the LM head at the odd vocabulary 50257 (the profile's
  "bfloat16_unaligned" rate) and at 50264 (aligned), the head at 50257 under
  torch.compile (does Inductor pad it?), and one MLP layer (768 -> 3072); each row names
  the kernels that ran (torch.profiler), so the odd head's GEMM kernel is on record.
  GPT-2's eager, torch.compile and fxopt-defaults rows name a step's eight longest
  kernels too, where issue 30.5's unexplained milliseconds are to be found.

Every measured row also notes how long the device was busy in one more (profiled) step,
against the step's median: a step far longer than its kernels is bound by the host's
launches (the cost model's two bounds). A row of :data:`KERNELS_AGAINST` also sets its
step's kernels, by family, against another row's of this run (tempo's against the
defaults', the fused loss's against plain torch.compile's, ...): the families that added
or saved the most device time. Priority order: GPT-2's first three rows, the fused
loss's rows, the RNN rows the cost model chose, the budgets and peers, the optimizer, the
GEMMs, and last the nn.LSTM unrolled against the cost model's advice (its compile outlasted
100 s on a fresh H200).

fxopt is always a ``fxopt.backend(...)`` object (the GPU machine runs a source checkout,
without the ``"fxopt"`` entry point). Per configuration: step time from CUDA events
(median of ``--steps`` after ``--warmup``, min-max in brackets), peak above resident
(``torch.cuda.max_memory_allocated`` on the indexed device, reset before the timed steps,
less what was allocated before the first step), compile time (the first step's wall time),
the first step's loss against the section's eager one (seeded alike; dropout makes a
compiled step's masks differ from eager's, so GPT-2's losses agree to about 1e-2, not
bitwise), and the passes that fired. Configurations run in priority order under
``--deadline-s``; each row is written as it comes (see `fxopt.bench.table`).

``--tiny`` runs the same configurations at tiny sizes on the CPU: wall-clock times, no
peak (the CPU allocator keeps no peak statistic), fx code generation for fxopt and no
Inductor peers (a C++ build per graph would not fit a test). It is the test suite's smoke
run (tests/bench/test_gpu_check_smoke.py), not a measurement.

    PYTHONPATH=. python benchmarks/gpu_check.py                      # on one GPU
    PYTHONPATH=. python benchmarks/gpu_check.py --tiny --out-dir /tmp/gpucheck
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import fxopt
from fxopt import _compat
from fxopt.bench import timing
from fxopt.bench.configs import checkpoint_blocks, checkpoint_each
from fxopt.bench.table import Case, Row, markdown_tables, read_rows, run_cases, write_atomically
from fxopt.bench.workloads import LSTMCellLoopLM, LSTMLanguageModel, gpt2
from fxopt.devices import indexed

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger("gpu_check")


@dataclass(frozen=True)
class Sizes:
    gpt2: dict[str, int]          # layers, hidden, heads, vocab, positions
    gpt2_batch: int
    gpt2_seq: int
    optim_batch: int
    lstm: dict[str, int]          # vocab, hidden, layers, embed
    loop: dict[str, int]          # vocab, hidden, layers, embed
    rnn_batch: int
    lstm_seq: int
    loop_steps: int
    warmup: int
    steps: int


REAL = Sizes(dict(layers=6, hidden=768, heads=12, vocab=50257, positions=1024), 8, 1024, 4,
             dict(vocab=10000, hidden=1024, layers=2, embed=512),
             dict(vocab=10000, hidden=1024, layers=1, embed=512), 32, 128, 64, 3, 10)
TINY = Sizes(dict(layers=1, hidden=32, heads=2, vocab=101, positions=64), 2, 32, 2,
             dict(vocab=50, hidden=24, layers=2, embed=16),
             dict(vocab=50, hidden=24, layers=1, embed=16), 2, 8, 8, 1, 3)

TITLES = {
    "gpt2": "## GPT-2 (transformers), 6 layers x 768, 12 heads, seq 1024, batch 8, vocab 50257",
    "lstm": "## nn.LSTM LM: Embedding(10000, 512) -> nn.LSTM(512, 1024, num_layers=2, "
            "batch_first) -> Linear(1024, 10000)",
    "loop": "## LSTMCell loop (EcoRNN's case): Embedding(10000, 512) -> nn.LSTMCell(512, 1024) "
            "stepped 64 times -> Linear",
    "optim": "## Offloaded optimizer: GPT-2 as above without dropout, batch 4 x 1024, bf16 "
             "autocast, AdamW(lr=1e-4)",
    "gemm": "## GEMMs of GPT-2 (batch 8 x seq 1024 tokens), bf16: forward, input and weight "
            "gradients (the cost model's rates; no peak, no loss)",
}


# each section's row whose first loss the others are compared with
REFERENCES = {"gpt2": "eager", "lstm": "eager (cuDNN)", "loop": "eager",
              "optim": "AdamW on the device"}
# rows whose profiled step's kernels are set against another row's of the section (when
# that one ran in the same process): where a pass's device time goes, by kernel family
# (issue 29.2: tempo cost 31% of the H200's step, and no row said in which kernels)
_DEFAULTS, _PLAIN_UNBROKEN = ("fxopt defaults (auto: Inductor)",
                              "torch.compile (Inductor), logging break ignored")
KERNELS_AGAINST = {
    ("gpt2", "fxopt tempo=True"): _DEFAULTS,
    ("gpt2", "fxopt memory_budget=0.5, not strict"): _DEFAULTS,
    ("gpt2", "fxopt defaults, logging break ignored"): _DEFAULTS,
    ("gpt2", "fxopt fuse_linear_cross_entropy=True, logging break ignored"): _PLAIN_UNBROKEN,
    ("gpt2", "fxopt fuse_linear_cross_entropy=True, fxopt.drop_logits, logging break "
             "ignored"): _PLAIN_UNBROKEN,
    ("loop", "fxopt fuse_rnn=True (auto: Inductor, fusible cells)"): "torch.compile (Inductor)",
    ("lstm", 'fxopt fuse_rnn="auto" (cost model)'): "eager (cuDNN)",
    ("lstm", "fxopt fuse_rnn=True (sequence ops)"): "eager (cuDNN)",
}


class Check:
    """The configurations of one run and what they share (device, sizes, eager's losses,
    measured peaks a later configuration sizes itself by)."""

    def __init__(self, device: torch.device, sizes: Sizes, tiny: bool) -> None:
        self.device, self.sizes, self.tiny = device, sizes, tiny
        self.eager_loss: dict[str, float] = {}
        # (section, configuration) -> peak + resident bytes (a resumed row's: its peak)
        self.peaks: dict[tuple[str, str], int] = {}
        # (section, configuration) -> its profiled step's kernel families (this run's rows)
        self.kernels: dict[tuple[str, str], dict[str, tuple[int, float]]] = {}

    # ---- building blocks ----------------------------------------------------------

    def fxopt(self, **options: Any) -> fxopt.Backend:
        if self.tiny:
            options.setdefault("codegen", "fx")  # no Inductor C++ build in the smoke run
        return fxopt.backend(**options)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def restore(self, rows: list[Row]) -> None:
        """Take what later configurations need from the rows of an earlier run (``--resume``):
        the sections' reference losses and the measured peaks (in MiB, without what was
        resident then)."""
        for row in rows:
            if row.status != "ok":
                continue
            if REFERENCES.get(row.section) == row.name and row.loss_text:
                self.eager_loss[row.section] = float(row.loss_text.split()[0])
            if row.peak.replace(".", "", 1).isdigit():
                self.peaks[(row.section, row.name)] = int(float(row.peak) * 2**20)

    def measure(self, row: Row, step: Callable[[], torch.Tensor],
                backends: tuple[fxopt.Backend, ...] = (), top: int = 0) -> None:
        """Time ``step`` (returns the loss) into ``row``; its loss is compared with the
        section's reference row's (:data:`REFERENCES`). One more step, profiled, gives the
        device's busy time and, with ``top``, that many of its longest kernels."""
        reference = REFERENCES[row.section]
        device = self.device
        timing.sync(device)
        resident = timing.resident_bytes(device)
        losses: list[float] = []

        def counted() -> None:
            if losses:
                step()
                return
            torch.manual_seed(1)  # the same dropout draws as the eager row's first step
            losses.append(float(step()))

        taken = timing.time_steps(counted, device, warmup=max(0, self.sizes.warmup - 1),
                                  steps=self.sizes.steps,
                                  before_timed=lambda: timing.reset_peak(device))
        row.step = taken.text()
        row.compile = f"{taken.first_s:.1f}"
        peak = timing.peak_above(device, resident or 0)
        if peak is not None:
            row.peak = f"{peak / 2**20:.0f}"
            self.peaks[(row.section, row.name)] = peak + (resident or 0)
        else:
            row.peak = "- (CPU: not measured)"
        row.loss = losses[0]
        if row.name == reference:
            self.eager_loss[row.section] = row.loss
        ref = self.eager_loss.get(row.section)
        row.loss_text = (f"{row.loss:.4f}" if ref is None or row.name == reference
                         else f"{row.loss:.4f} ({row.loss - ref:+.1e})")
        _note_fired(row, backends)
        kernels = _profiled(counted, device)
        row.notes.append(device_busy(kernels, device, taken.median_ms))
        if top:
            row.notes.append(top_kernels(kernels, device, top))
        families = self.kernels[(row.section, row.name)] = kernel_families(kernels)
        against = KERNELS_AGAINST.get((row.section, row.name))
        if (row.section, against) in self.kernels:
            row.notes.append(kernel_difference(families, self.kernels[(row.section, against)],
                                               against, device))

    # ---- GPT-2 ---------------------------------------------------------------------

    def gpt2_step(self, prepare: Callable[[torch.nn.Module], Any], dropout: float = 0.1,
                  batch: int | None = None, optimizer: Callable[[Any, Any], Any] | None = None
                  ) -> tuple[Callable[[], torch.Tensor], tuple[Any, torch.Tensor]]:
        """One GPT-2 training step (returns its loss), and the model ``prepare`` made with
        the input ids it runs on. With an ``optimizer``, one forward and backward run before
        it is made, as fxopt's README has users do: the offload plan reads the gradient
        order and the backward's length that compilation records (made before, it has
        neither and cannot say whether the host keeps up); the row's compile time then
        leaves that compilation out."""
        s = self.sizes
        torch.manual_seed(0)
        with torch.device(self.device):
            model = gpt2(dropout=dropout, **s.gpt2)
        model.train()
        compiled = prepare(model)
        ids = torch.randint(0, s.gpt2["vocab"], (batch or s.gpt2_batch, s.gpt2_seq),
                            device=self.device)
        opt = None
        if optimizer is not None:
            with self.autocast():
                compiled(input_ids=ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)
            opt = optimizer(model, compiled)

        def step() -> torch.Tensor:
            with self.autocast():
                loss = compiled(input_ids=ids, labels=ids).loss
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)
            return loss.detach()

        return step, (compiled, ids)

    def gpt2_row(self, row: Row, prepare: Callable[[torch.nn.Module], Any], sites: bool,
                 backends: tuple[fxopt.Backend, ...] = ()) -> None:
        """Measure GPT-2 as ``prepare`` makes it into ``row``; ``sites``: also what is alive
        at the peak (:meth:`peak_sites`) and the kernels that took the most time in one
        more step (:func:`top_kernels`: where issue 30.5's unexplained milliseconds go)."""
        step, built = self.gpt2_step(prepare)
        self.measure(row, step, backends, top=8 if sites else 0)
        if sites:
            self.peak_sites(row, *built)

    def gpt2_case(self, prepare: Callable[[torch.nn.Module], Any],
                  context: Callable[[], Any] = contextlib.nullcontext,
                  sites: bool = False) -> Callable[[Row], None]:
        def run(row: Row) -> None:
            with context():
                self.gpt2_row(row, prepare, sites)
        return run

    def gpt2_interleaved(self, row: Row) -> None:
        """fxopt's defaults and plain torch.compile stepped in turn, in the same rounds:
        issue 29.1's bar (fxopt's step <= 1.03 x plain's) needs their ratio without the
        drift between two rows measured a minute apart (the H200's first run had the
        defaults at 1.14 x, its second at 0.99 x). The row's step is fxopt's; its notes,
        plain's in the same rounds and the per-round ratio. Both models are resident, so
        the peak is the rows above's."""
        backend = self.fxopt()
        steps = {"fxopt": self.gpt2_step(lambda m: torch.compile(m, backend=backend))[0],
                 "torch.compile": self.gpt2_step(torch.compile)[0]}
        times = timing.interleaved(steps, self.device, warmup=self.sizes.warmup,
                                   rounds=2 * self.sizes.steps)
        ours, plain = times["fxopt"], times["torch.compile"]
        ratios = sorted(a / b for a, b in zip(ours.times_s, plain.times_s, strict=True))
        row.step, row.compile = ours.text(), f"{ours.first_s:.1f}"
        row.peak, row.loss_text = "- (both resident)", "-"
        row.notes += [f"torch.compile in the same rounds: {plain.text()}",
                      f"fxopt / torch.compile per round: median "
                      f"{ratios[len(ratios) // 2]:.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})"]
        _note_fired(row, (backend,))

    def gpt2_fxopt(self, context: Callable[[], Any] = contextlib.nullcontext,
                   sites: bool = False, drop_logits: bool = False,
                   **options: Any) -> Callable[[Row], None]:
        """GPT-2 compiled by a backend made when the case runs (a refused option fails the
        row, not the list), every step under ``context``; ``sites``: as :meth:`gpt2_row`;
        ``drop_logits``: the model wrapped by :func:`fxopt.drop_logits` first."""
        def run(row: Row) -> None:
            with context():
                backend = self.fxopt(**options)
                self.gpt2_row(row, lambda m: torch.compile(
                    fxopt.drop_logits(m) if drop_logits else m, backend=backend), sites,
                              (backend,))
        return run

    def peak_sites(self, row: Row, compiled: Any, ids: torch.Tensor) -> None:
        """Note what is alive at the peak of a GPT-2 step of ``compiled`` on ``ids``, by
        category and the op or compiled graph that allocated it (``fxopt.profile_memory``,
        one more step): where a configuration's peak differs from another's (issue 29.1's
        extra logits tensor under fxopt's defaults), these say which allocation it is."""
        with self.autocast():
            profile = fxopt.profile_memory(compiled, {"input_ids": ids, "labels": ids},
                                           loss_fn=lambda out: out.loss, warmup=0, steps=1)
        mib = 2 ** 20
        parts = [f"profiled peak {profile.peak_bytes / mib:.0f} MiB in {profile.peak_phase}"]
        for category in ("activations", "temporaries", "other"):
            top = profile.peak_sites.get(category, [])[:3]
            if top:
                parts.append(f"{category} {profile.peak_categories[category] / mib:.0f} MiB: "
                             + ", ".join(f"{site} {size / mib:.0f}" for site, size in top))
        row.notes.append("; ".join(parts))

    def byte_budget(self, row: Row) -> None:
        """fxopt under a byte budget low enough that it must swap: 0.4 x eager's peak
        (with what was resident), strict off (a budget under the floor runs the floor's
        plan, warned)."""
        eager = ("gpt2", "eager")
        if eager not in self.peaks and not self.tiny:
            raise RuntimeError("needs GPT-2 eager's peak, which did not run")
        budget = int(0.4 * self.peaks.get(eager, 2**24))
        backend = self.fxopt(memory_budget=budget, strict=False)
        row.notes.append(f"budget {budget / 2**20:.0f} MiB")
        self.gpt2_row(row, lambda m: torch.compile(m, backend=backend), False, (backend,))

    # ---- RNNs ------------------------------------------------------------------------

    def rnn_case(self, section: str, prepare: Callable[[torch.nn.Module], Any],
                 backend: fxopt.Backend | None = None,
                 form: str | None = None) -> Callable[[Row], None]:
        """The section's RNN model as ``prepare`` makes it; ``form``: the cost model's form
        of what runs (``fxopt.planner.forms``' lstm_lm_work / cell_loop_work), whose
        predicted step on the device's profile the row notes (issue 30.2's check)."""
        s = self.sizes

        def run(row: Row) -> None:
            torch.manual_seed(0)
            if section == "lstm":
                model, seq = LSTMLanguageModel(**s.lstm), s.lstm_seq
            else:
                model, seq = LSTMCellLoopLM(**s.loop), s.loop_steps
            model = model.to(self.device).train()
            compiled = prepare(model)
            tokens = torch.randint(0, model.vocab, (s.rnn_batch, seq + 1), device=self.device)

            def step() -> torch.Tensor:
                loss = compiled(tokens)
                loss.backward()
                model.zero_grad(set_to_none=True)
                return loss.detach()

            self.measure(row, step, (backend,) if backend else ())
            if form is not None:
                row.notes.append(self.rnn_prediction(section, form))
        return run

    def rnn_prediction(self, section: str, form: str) -> str:
        from fxopt.planner import forms, profile_for

        s, hw = self.sizes, profile_for(self.device)
        if section == "lstm":
            sizes = {k: s.lstm[k] for k in ("vocab", "embed", "hidden", "layers")}
            work = forms.lstm_lm_work(**sizes, batch=s.rnn_batch, steps=s.lstm_seq, form=form,
                                      hw=hw)
        else:
            sizes = {k: s.loop[k] for k in ("vocab", "embed", "hidden")}
            work = forms.cell_loop_work(**sizes, batch=s.rnn_batch, steps=s.loop_steps,
                                        form=form, hw=hw)
        return f"predicted {forms.predict(work, hw).ms:.2f} ms ({hw.name} profile, {form})"

    def rnn_compiled(self, section: str, form: str | None = None,
                     **options: Any) -> Callable[[Row], None]:
        def run(row: Row) -> None:
            backend = self.fxopt(**options)
            self.rnn_case(section, lambda m: torch.compile(m, backend=backend), backend,
                          form)(row)
        return run

    # ---- the offloaded optimizer ---------------------------------------------------

    def optim_case(self, cpu_fraction: float | None, state_share: float | None = None,
                   **offload_options: Any) -> Callable[[Row], None]:
        """AdamW on the device (``cpu_fraction`` and ``state_share`` None) or offloaded with
        ``cpu_fraction``, or with a device budget of ``state_share`` times AdamW's state
        (the plan's own choice), and ``offload_options`` (``fxopt.optim.offload``'s:
        subgroups, staged)."""
        def run(row: Row) -> None:
            if cpu_fraction is None and state_share is None:
                backend = self.fxopt() if self.tiny else None

                def adamw(model: Any, compiled: Any) -> Any:
                    return torch.optim.AdamW(model.parameters(), lr=1e-4)
            else:
                backend = self.fxopt(offload_optimizer=True)

                def adamw(model: Any, compiled: Any) -> Any:
                    state = 8 * sum(p.numel() for p in model.parameters())  # AdamW's fp32
                    budget = None if state_share is None else int(state_share * state)
                    offloaded = fxopt.optim.offload(
                        torch.optim.AdamW(model.parameters(), lr=1e-4), backend,
                        model=compiled, cpu_fraction=cpu_fraction,
                        gpu_state_budget_bytes=budget, **offload_options)
                    made.append(offloaded)
                    return offloaded

            def prepare(model: torch.nn.Module) -> Any:
                return torch.compile(model, backend=backend or "inductor")

            made: list[Any] = []
            step, _ = self.gpt2_step(prepare, dropout=0.0, batch=self.sizes.optim_batch,
                                     optimizer=adamw)
            self.measure(row, step, (backend,) if backend else ())
            if made:  # issue 30.3: the plan's predicted step against the measured one
                row.notes.append(f"plan: {made[-1].plan.summary()}")
        return run

    # ---- GEMMs against the cost model -------------------------------------------------

    def gemm_case(self, width_in: int, width_out: int,
                  compile_it: bool = False) -> Callable[[Row], None]:
        """The three GEMMs of a linear layer ``width_in -> width_out`` over GPT-2's tokens
        (forward, input gradient, weight gradient) in bf16, timed as one step; notes: the
        achieved TFLOP/s and the cost model's prediction on the device's profile."""
        from fxopt.planner import forms, profile_for

        def gemms(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> Any:
            return x @ w.t(), g @ w, g.t() @ x

        def run(row: Row) -> None:
            s, device = self.sizes, self.device
            tokens = s.gpt2_batch * s.gpt2_seq
            make = torch.Generator(device=device).manual_seed(0)
            x, w, g = (torch.randn(*shape, device=device, dtype=torch.bfloat16,
                                   generator=make)
                       for shape in ((tokens, width_in), (width_out, width_in),
                                     (tokens, width_out)))
            fn = torch.compile(gemms) if compile_it else gemms
            taken = timing.time_steps(lambda: fn(x, w, g), device,
                                      warmup=self.sizes.warmup, steps=self.sizes.steps)
            row.step, row.compile = taken.text(2), f"{taken.first_s:.1f}"
            row.peak = row.loss_text = "-"
            hw = profile_for(device)
            work = forms.head_gemms_work(tokens, width_in, width_out, compiled=compile_it)
            kind = work.gemms[0][0]
            flops = 3 * 2.0 * tokens * width_in * width_out
            row.notes += [f"{flops / taken.median_ms / 1e9:.3g} TFLOP/s",
                          f"predicted {forms.predict(work, hw).ms:.2f} ms "
                          f"({hw.name} profile, {kind})",
                          top_kernels(_profiled(lambda: fn(x, w, g), device), device, 3)]
        return run

    # ---- the list, in priority order -----------------------------------------------

    def cases(self) -> list[Case]:
        """Every configuration, most wanted first (what a cut-off run must have)."""
        inductor_peer = not self.tiny   # Inductor's C++ build does not fit the CPU smoke
        g = [Case("gpt2", "eager", self.gpt2_case(lambda m: m, sites=True), 60)]
        if inductor_peer:
            g.append(Case("gpt2", "torch.compile (Inductor)",
                          self.gpt2_case(torch.compile, sites=True), 90))
        g.append(Case("gpt2", "fxopt defaults (auto: Inductor)", self.gpt2_fxopt(sites=True),
                      90))
        g.append(Case("gpt2", "fxopt defaults and torch.compile, interleaved",
                      self.gpt2_interleaved, 120))
        lstm = [Case("lstm", "eager (cuDNN)",
                     self.rnn_case("lstm", lambda m: m, form="cudnn"), 30),
                Case("lstm", 'fxopt fuse_rnn="auto" (cost model)',
                     self.rnn_compiled("lstm", "library", fuse_rnn="auto"), 90),
                Case("lstm", "fxopt fuse_rnn=True (sequence ops)",
                     self.rnn_compiled("lstm", "sequence", fuse_rnn=True), 100)]
        loop = [Case("loop", "eager", self.rnn_case("loop", lambda m: m, form="eager"), 30),
                Case("loop", "fxopt fuse_rnn=True (auto: Inductor, fusible cells)",
                     self.rnn_compiled("loop", "fusible", fuse_rnn=True), 90)]
        if inductor_peer:  # what a user picks instead (issue 30.2's fusible-cell prediction)
            loop.insert(1, Case("loop", "torch.compile (Inductor)",
                                self.rnn_case("loop", torch.compile, form="plain"), 90))
        optim = [Case("optim", "AdamW on the device", self.optim_case(None), 90),
                 # issue 30.3's bar: at the plan's own choice, <= 1.3 x the device step
                 # where the host keeps up (the plan's note says whether it does)
                 Case("optim", "offloaded, device state budget 0.5 x AdamW's (the plan's "
                      "choice)", self.optim_case(None, state_share=0.5), 90),
                 Case("optim", "offloaded, cpu_fraction=0.5", self.optim_case(0.5), 90),
                 Case("optim", "offloaded, cpu_fraction=1.0", self.optim_case(1.0), 90),
                 # the plan's own staging choice (Deep Optimizer States' staged device
                 # updates), which it takes from about 20 host-resident subgroups
                 Case("optim", "offloaded, cpu_fraction=1.0, 32 subgroups (plan stages)",
                      self.optim_case(1.0, subgroups=32), 90)]
        hidden, vocab = self.sizes.gpt2["hidden"], self.sizes.gpt2["vocab"]
        aligned = -(-vocab // 8) * 8
        gemm = [Case("gemm", f"LM head {hidden} -> {vocab}", self.gemm_case(hidden, vocab), 30),
                Case("gemm", f"LM head {hidden} -> {aligned} (aligned)",
                     self.gemm_case(hidden, aligned), 30),
                Case("gemm", f"MLP {hidden} -> {4 * hidden}",
                     self.gemm_case(hidden, 4 * hidden), 30)]
        if inductor_peer:
            gemm.insert(2, Case("gemm", f"LM head {hidden} -> {vocab}, torch.compile",
                                self.gemm_case(hidden, vocab, compile_it=True), 60))
        # issue 29.3's bar (peak <= 0.6 x plain Inductor's at <= 1.05 x its step) compares
        # these two: the head and the loss in one graph, transformers' logging break removed
        unbroken = fxopt.ignore_transformers_logging
        loss = [Case("gpt2", "fxopt fuse_linear_cross_entropy=True, logging break ignored",
                      self.gpt2_fxopt(context=unbroken, fuse_linear_cross_entropy=True), 90),
                 # issue 29.1's GPU gap (fxopt's defaults one bf16 logits tensor above plain
                 # torch.compile): is it the break? compare with the plain row above
                 Case("gpt2", "fxopt defaults, logging break ignored",
                      self.gpt2_fxopt(context=unbroken), 90)]
        if inductor_peer:
            loss.insert(0, Case("gpt2", "torch.compile (Inductor), logging break ignored",
                                 self.gpt2_case(torch.compile, context=unbroken), 90))
        # issue 29.3's bar again, the logits no longer a graph output: the head's whole
        # product goes (the step above makes the logits for transformers' output)
        loss.append(Case(
            "gpt2", "fxopt fuse_linear_cross_entropy=True, fxopt.drop_logits, logging break "
            "ignored", self.gpt2_fxopt(context=unbroken, drop_logits=True,
                                       fuse_linear_cross_entropy=True), 90))
        # the fused loss's chunk trade (W's fp32 gradient read and written per chunk against
        # the chunks' temporaries): the first fused-loss row takes
        # fuse_linear_cross_entropy_chunks' choice (the fewest chunks that keep the step's
        # peak), this one the default 8
        loss.append(Case(
            "gpt2", "fxopt fuse_linear_cross_entropy=True, default chunks, logging break "
            "ignored", self.gpt2_fxopt(context=unbroken, fuse_linear_cross_entropy=True,
                                       rewrite_limit={"fuse_linear_cross_entropy_chunks": 0}),
            90))
        # issue 29.2: tempo cost 31% of the step on the H200 (20.7 against 15.8 ms); its
        # longest kernels against the defaults' say where
        later = [Case("gpt2", "fxopt tempo=True", self.gpt2_fxopt(sites=True, tempo=True), 90),
                 Case("gpt2", "fxopt memory_budget=0.5, not strict",
                      self.gpt2_fxopt(memory_budget=0.5, strict=False), 90),
                 Case("gpt2", "fxopt byte budget (must swap)", self.byte_budget, 90),
                 Case("lstm", "fxopt memory_budget=0.5 (recompute_rnn)",
                      self.rnn_compiled("lstm", memory_budget=0.5, strict=False), 60),
                 Case("loop", "fxopt fuse_rnn=True, memory_budget=0.5",
                      self.rnn_compiled("loop", fuse_rnn=True, memory_budget=0.5,
                                        strict=False), 90)]
        if inductor_peer:
            later.append(Case("gpt2", "Inductor activation_memory_budget=0.5", self.gpt2_case(
                torch.compile, context=lambda: _compat.activation_memory_budget(0.5)), 90))
        later += [Case("gpt2", "per-block torch.utils.checkpoint (eager)",
                       self.gpt2_case(_checkpoint_blocks), 60),
                  Case("lstm", "eager, whole model under torch.utils.checkpoint",
                       self.rnn_case("lstm", lambda m: _checkpoint_whole(m)), 30),
                  Case("loop", "eager under torch.utils.checkpoint",
                       self.rnn_case("loop", lambda m: _checkpoint_whole(m)), 30)]
        # the GEMM rows were measured on the H200 (2026-11-27) and only back the cost
        # model's rates: they go last
        return g + loss + lstm + loop + later + optim + gemm


def _checkpoint_blocks(model: torch.nn.Module) -> torch.nn.Module:
    checkpoint_blocks(model, list(model.transformer.h))
    return model


def _checkpoint_whole(model: torch.nn.Module) -> torch.nn.Module:
    checkpoint_each([model])
    return model


def _profiled(fn: Callable[[], Any], device: torch.device) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of each kernel that one call of ``fn`` ran (torch.profiler;
    on the CPU, of each op: the smoke run's stand-in)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        timing.sync(device)
    return [(event.name, event.time_range.start, event.time_range.end)
            for event in prof.events()
            if (event.device_type == torch.autograd.DeviceType.CUDA) == cuda]


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The time covered by at least one of ``intervals`` (kernels on several streams that
    overlap count once)."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def device_busy(kernels: list[tuple[str, float, float]], device: torch.device,
                step_ms: float) -> str:
    """How much of a step the device spent running ``kernels`` (:func:`_profiled`, one more
    step), against the step's measured median: where it is well under the step, the host's
    launches bound it and fewer launches pay; near it, the device's work does (the cost
    model's two bounds, issue 30.5)."""
    busy = busy_us([(start, end) for _, start, end in kernels]) / 1e3
    what = "kernels" if device.type == "cuda" else "ops (CPU)"
    return (f"device busy {busy:.2f} ms ({busy / step_ms:.0%} of the step), "
            f"{len(kernels)} {what}")


def top_kernels(kernels: list[tuple[str, float, float]], device: torch.device,
                count: int) -> str:
    """The ``count`` of ``kernels`` (:func:`_profiled`) that took the most device time, by
    name (on the CPU the ops): which GEMM kernel a head of an odd vocabulary runs, and where
    a step's time goes, for the cost model (issue 30.5)."""
    totals: dict[str, float] = {}
    for name, start, end in kernels:
        name = name.replace("|", "/")[:90]
        totals[name] = totals.get(name, 0.0) + end - start
    top = sorted(totals.items(), key=lambda item: -item[1])[:count]
    what = "kernels" if device.type == "cuda" else "ops (CPU, under the profiler)"
    return f"top {what}: " + "; ".join(f"{name} {us / 1e3:.2f} ms" for name, us in top)


def kernel_families(kernels: list[tuple[str, float, float]]) -> dict[str, tuple[int, float]]:
    """Launches and device µs of ``kernels`` (:func:`_profiled`) per family: the name
    without Inductor's trailing kernel number (``triton_poi_fused_add_3`` and ``_add_7``
    are one family), so that two compilations of a model compare kernel by kernel."""
    families: dict[str, tuple[int, float]] = {}
    for name, start, end in kernels:
        family = re.sub(r"_\d+$", "", name.replace("|", "/"))[:90]
        count, us = families.get(family, (0, 0.0))
        families[family] = (count + 1, us + end - start)
    return families


def kernel_difference(ours: dict[str, tuple[int, float]], theirs: dict[str, tuple[int, float]],
                      against: str, device: torch.device, shown: int = 4) -> str:
    """What a row's profiled step ran beyond ``against``'s (:func:`kernel_families` of
    each): both totals, then the ``shown`` families that added the most device time and
    those that saved the most, each with its launches in both."""
    def total(families: dict[str, tuple[int, float]]) -> tuple[int, float]:
        return (sum(c for c, _ in families.values()),
                sum(us for _, us in families.values()) / 1e3)

    def change(name: str) -> float:
        return ours.get(name, (0, 0.0))[1] - theirs.get(name, (0, 0.0))[1]

    def listed(names: list[str]) -> str:
        return "; ".join(f"{name} {change(name) / 1e3:+.2f} ms ({ours.get(name, (0,))[0]} "
                         f"against {theirs.get(name, (0,))[0]})" for name in names) or "none"

    names = sorted(set(ours) | set(theirs), key=change)
    added = [n for n in reversed(names) if change(n) > 0][:shown]
    saved = [n for n in names if change(n) < 0][:shown]
    (n_ours, ms_ours), (n_theirs, ms_theirs) = total(ours), total(theirs)
    what = "kernels" if device.type == "cuda" else "ops (CPU)"
    return (f"{what} against {against}: {n_ours} ({n_theirs}), {ms_ours:.2f} ms "
            f"({ms_theirs:.2f}); most added: {listed(added)}; most saved: {listed(saved)}")


def _fired(backends: tuple[fxopt.Backend, ...]) -> list[str]:
    """The passes that changed a graph (swap_recompute with its planned swaps,
    fuse_linear_cross_entropy_chunks with each op's default and chosen pieces)."""
    fired: dict[str, list[str]] = {}
    swaps = 0
    for backend in backends:
        for graph in backend.graphs:
            for record in graph.passes:
                if not record.fired:
                    continue
                plan = record.stats.get("plan") or {}
                swaps += sum(a == "swap" for a in (plan.get("actions") or {}).values())
                fired.setdefault(record.name, []).extend(
                    f"{row['form']} {row['default_pieces']} -> {row['pieces']} pieces"
                    for row in record.stats.get("sizes", ()) if "block_bytes" in row)
    if "swap_recompute" in fired:
        fired["swap_recompute"].append(f"{swaps} swaps")
    return [f"{name} ({', '.join(details)})" if details else name
            for name, details in fired.items()]


def _note_fired(row: Row, backends: tuple[fxopt.Backend, ...]) -> None:
    """Note on ``row`` the passes that fired (none: no note)."""
    fired = _fired(backends)
    if fired:
        row.notes.append("fired: " + ", ".join(fired))


# ---- the file ------------------------------------------------------------------------

def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # absent or broken: the header says so
        return "absent"


def _run_text(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=20,
                              cwd=REPO).stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        return "-"


def header(device: torch.device, argv: list[str], tiny: bool) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(indexed(device))
        driver = _run_text(["nvidia-smi", "--query-gpu=driver_version",
                            "--format=csv,noheader"]).splitlines()[0]
    else:
        name, driver = platform.processor() or "cpu", "-"
    rev = _run_text(["git", "rev-parse", "--short", "HEAD"])
    dirty = _run_text(["git", "status", "--porcelain", "--untracked-files=no"])
    title = ("# fxopt GPU check: TINY smoke run on the CPU (not a measurement)" if tiny
             else f"# fxopt GPU check on one {name}")
    return "\n".join([
        title, "",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. "
        f"Device: {name} (driver {driver}). Python {platform.python_version()}, torch "
        f"{torch.__version__}, triton {_version('triton')}, transformers "
        f"{_version('transformers')}; fxopt at {rev}"
        + (" (with uncommitted changes)" if dirty not in ("", "-") else "") + ".",
        "Command: `" + " ".join(["python", *argv]) + "`",
        "All configurations in one process, in priority order, Dynamo reset between them. "
        "Step: " + ("wall clock (CPU)" if device.type != "cuda" else "CUDA events") +
        " around one training step, median after warm-up (min-max). Peak: "
        "max_memory_allocated during the timed steps less what was allocated before the "
        "first step. Compile: the first step's wall time. Loss: the first step's, against "
        "the section's eager (dropout masks differ between eager and compiled steps).",
    ])


def _environment(text: str) -> str:
    """The day, device and versions of a results file's header (its "Date:" line up to the
    fxopt revision): a resumed run keeps rows only from a file where these are its own."""
    line = next((x for x in text.splitlines() if x.startswith("Date: ")), "")
    day, _, rest = line.partition(" ")[2].partition(" ")
    return day + " " + rest.partition(" UTC. ")[2].partition("; fxopt at")[0]


def gpu_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-tiny"
    name = torch.cuda.get_device_name(indexed(device))
    for known in ("H200", "H100", "A100", "L40S", "B200"):
        if known in name:
            return known.lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="tiny sizes on the CPU (the test suite's smoke run)")
    parser.add_argument("--device", help="default: cuda (cpu with --tiny)")
    parser.add_argument("--deadline-s", type=float, default=330.0,
                        help="stop starting configurations after this many seconds")
    parser.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--also-to", action="append", default=[], metavar="DIR",
                        help="write the results file here too, as each configuration "
                        "ends (gpu_session.sh keeps a copy that outlives the device "
                        "command's output folder, for --resume)")
    parser.add_argument("--only", nargs="*", help="run only the configurations whose "
                        "names contain one of these strings")
    parser.add_argument("--resume", action="store_true", help="keep the rows that ran in "
                        "the results file already there and run the others (a second "
                        "run in the same GPU lease goes on where the first stopped)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device (use --tiny for the CPU smoke run)")
    torch._dynamo.config.allow_rnn = True   # Dynamo traces nn.LSTM (else: a graph break)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    check = Check(device, TINY if args.tiny else REAL, args.tiny)
    cases = check.cases()
    if args.only:
        cases = [c for c in cases if any(s in c.name for s in args.only)]
    path = Path(args.out_dir) / f"gpu_check_{gpu_slug(device)}.md"
    top = header(device, [Path(sys.argv[0]).name if argv is None else "gpu_check.py",
                          *(sys.argv[1:] if argv is None else argv)], args.tiny)
    kept: dict[tuple[str, str], Row] = {}
    if args.resume and path.exists():
        earlier_text = path.read_text()
        if _environment(earlier_text) != _environment(top):
            parser.error(f"--resume: {path} is from another day, device or versions "
                         f"({_environment(earlier_text)!r}); move it away or run without "
                         f"--resume")
        earlier = read_rows(earlier_text, TITLES)
        check.restore(earlier)
        kept = {(r.section, r.name): r for r in earlier}
        top += f"\nResumed: {len(kept)} configurations kept from the earlier run's file."
        log.info("resuming %s: %d configurations kept", path, len(kept))
    copies = [path.parent, *map(Path, args.also_to)]
    for folder in copies:
        folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def write(rows: list[Row]) -> None:
        done = sum(r.status != "not run" for r in rows)
        text = (top + f"\nProgress: {done} of {len(rows)} configurations, "
                f"{time.monotonic() - started:.0f} s (deadline {args.deadline_s:.0f} s).\n"
                + markdown_tables(rows, TITLES))
        for folder in copies:
            write_atomically(folder / path.name, text)

    run_cases(cases, deadline_s=args.deadline_s, write=write, device=str(device),
              order=list(TITLES), kept=kept)
    log.info("wrote %s", path)
    return path


if __name__ == "__main__":
    main()
