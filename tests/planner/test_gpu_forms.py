"""The H100 profile's step-time predictions (fxopt.planner.forms) against the GPU table
(benchmarks/results/gpu_h100_2026-11-26.md, a copy of ../shared/gpu/h100-2026-11-26.md):
each configuration's median step time, read from the table by its name, within 25%."""

import dataclasses
import pathlib
import re

import pytest
import torch

from fxopt.optim.model import ParamInfo, plan_offload, split_subgroups
from fxopt.planner import forms
from fxopt.planner.hardware import CPU_DEFAULT, KNOWN_GPUS

TABLE = pathlib.Path(__file__).parents[2] / "benchmarks" / "results" / "gpu_h100_2026-11-26.md"
H100 = KNOWN_GPUS["H100"]
TOLERANCE = 0.25   # issue 30.5: "within 25%"


def measured_ms(section, configuration):
    """The step ms of ``configuration`` in the table under the heading starting with
    ``section`` (or "<configuration> (<a remark>)"): the median, or the middle of a range
    ("16.3-17.1")."""
    text = TABLE.read_text()
    body = text.split("\n## " + section, 1)[1].split("\n## ", 1)[0]
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and (cells[0] == configuration or cells[0].startswith(configuration + " (")):
            step = cells[1]
            if m := re.fullmatch(r"([\d.]+)-([\d.]+)", step):
                return (float(m[1]) + float(m[2])) / 2
            return float(step.split()[0])
    raise KeyError(f"{configuration!r} not in section {section!r} of {TABLE.name}")


# (section, configuration, Work) of the table's forms, sizes as its headings give them
LSTM = dict(vocab=10000, embed=512, hidden=1024, layers=2, batch=32, steps=128)
LOOP = dict(vocab=10000, embed=512, hidden=1024, batch=32, steps=64)
FORMS = [
    ("nn.LSTM LM", "eager (cuDNN)", forms.lstm_lm_work(**LSTM, form="cudnn", hw=H100)),
    ("nn.LSTM LM", "fxopt fuse_rnn=True (auto: Inductor around the fused ops)",
     forms.lstm_lm_work(**LSTM, form="fused", hw=H100)),
    ("LSTMCell loop", "eager", forms.cell_loop_work(**LOOP, form="eager", hw=H100)),
    ("LSTMCell loop", "fxopt fuse_rnn=True (auto: Inductor)",
     forms.cell_loop_work(**LOOP, form="fused", hw=H100)),
]


@pytest.mark.parametrize("section,configuration,work", FORMS,
                         ids=[f"{s}/{c}" for s, c, _ in FORMS])
def test_rnn_forms_predict_the_h100_table(section, configuration, work):
    predicted = forms.predict(work, H100).ms
    measured = measured_ms(section, configuration)
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)


def test_the_rnn_forms_differ_where_the_table_says_why():
    """cuDNN's LSTM is bound by its device chain, fuse_rnn's by the host's per-step launches
    (2 Python ops and 6 compiled launches per layer and step)."""
    cudnn, fused = (forms.predict(forms.lstm_lm_work(**LSTM, form=f, hw=H100), H100)
                    for f in ("cudnn", "fused"))
    assert cudnn.device_s > cudnn.host_s and fused.host_s > 3 * fused.device_s
    call = forms.rnn_call_work("lstm", 32, 128, 512, 1024, 2, 1, "fused", H100)
    assert call.launches == {"compiled": 6 * 256, "python": 2 * 256}


def test_fusible_cells_are_predicted_past_the_issues_bar():
    """Issue 30.2's goal for cells: at least 1.5x eager. The form the table measured
    (Python cell ops, now fx's) is host-bound; under Inductor the fusible cells launch from
    compiled code and the device's chain bounds the step: predicted 6.4 ms against eager's
    measured 23.3, and against plain torch.compile's predicted 7.4 (two GEMMs forward and
    four backward per step where fuse_rnn hoists the input projection)."""
    fusible, plain = (forms.predict(forms.cell_loop_work(**LOOP, form=f, hw=H100), H100)
                      for f in ("fusible", "plain"))
    assert measured_ms("LSTMCell loop", "eager") / fusible.ms >= 1.5
    assert fusible.host_s < fusible.device_s and fusible.ms < plain.ms


def _gpt2_params():
    from fxopt.bench.workloads import gpt2

    with torch.device("meta"):
        model = gpt2(6, 768, 12, 50257, 1024, dropout=0.0)
    # reversed: the head's gradients are ready first in the backward
    return [ParamInfo(i, p.numel()) for i, p in enumerate(reversed(list(model.parameters())))]


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_offloaded_adamw_is_the_plain_step_plus_the_simulated_optimizer(fraction):
    """The offloaded rows from the measured plain row and the optimizer model (gradients
    to the host, CPU updates, parameters back; 8 subgroups as fxopt.optim.offload)."""
    pytest.importorskip("transformers")
    subgroups = split_subgroups(_gpt2_params(), 8)
    plain = plan_offload(subgroups, H100, cpu_fraction=0.0)
    offloaded = plan_offload(subgroups, H100, cpu_fraction=fraction)
    section = "Offloaded optimizer"
    predicted = 1e3 * forms.offload_step_seconds(
        measured_ms(section, "AdamW on the device") / 1e3, plain.predicted_seconds,
        offloaded.predicted_seconds)
    measured = measured_ms(section, f"offloaded, cpu_fraction={fraction}")
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)


def test_gpt2_eager_against_inductor_is_the_table_ratio():
    """What codegen="auto" decides on: eager's step over Inductor's (a byte count per op of
    the block, eager's unfused, Inductor's fused)."""
    eager, inductor = (forms.predict(forms.gpt2_work(6, 768, 50257, 1024, 8, f), H100).ms
                       for f in ("eager", "inductor"))
    measured = (measured_ms("GPT-2", "eager") / measured_ms("GPT-2", "torch.compile (Inductor)"))
    assert abs(eager / inductor - measured) <= TOLERANCE * measured


@pytest.mark.xfail(strict=True, reason="GPT-2's absolute step times are predicted a third "
                   "too fast, eager and Inductor alike (32.0 and 13.6 ms against 48.3 and 21.5; "
                   "the ratio holds). Documented terms priced (ms change, eager/Inductor): GEMM "
                   "tile waves on 132 SMs +0.90, the odd vocabulary's head GEMMs off the "
                   "TMA/wgmma path at the mma.sync ceiling +0.35, flash attention at "
                   "FlashAttention-2's published H100 rates +0.76, the loss's kernel passes "
                   "+1.84/-0.61 (eager's unaligned softmax rows read 3 times; Inductor saves the "
                   "bf16 logits, not an fp32 log-softmax), autocast's parameter casts +0.37. "
                   "Unexplained: 16.3 and 7.9 ms. Candidates without a documented H100 rate: "
                   "the head's align1 GEMM kernels (an H100 report measures a pre-Hopper "
                   "fallback 3.5x slower than sm90 at another shape: +6.9 ms at that ratio), "
                   "Inductor's pad_mm choice, eager's unvectorized mixed-dtype kernels. A GPU "
                   "profile of the head's three GEMMs (kernel names, times) settles the first")
@pytest.mark.parametrize("form,configuration", [("eager", "eager"),
                                                ("inductor", "torch.compile (Inductor)")])
def test_gpt2_absolute_step_times(form, configuration):
    predicted = forms.predict(forms.gpt2_work(6, 768, 50257, 1024, 8, form), H100).ms
    measured = measured_ms("GPT-2", configuration)
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)


def test_h200_has_the_h100s_compute_and_faster_memory():
    h100, h200 = KNOWN_GPUS["H100"], KNOWN_GPUS["H200"]
    assert h200.flops == h100.flops and h200.memory_bandwidth > 1.4 * h100.memory_bandwidth
    assert h200.python_op_seconds == h100.python_op_seconds > h100.eager_op_seconds
    cudnn = forms.predict(forms.lstm_lm_work(**LSTM, form="cudnn", hw=h200), h200)
    assert cudnn.ms < forms.predict(forms.lstm_lm_work(**LSTM, form="cudnn", hw=h100), h100).ms


def test_an_odd_vocabulary_prices_the_head_gemms_off_the_hopper_path():
    """50257 bf16 elements is no multiple of 16 bytes, so the head's three GEMMs (whose row
    stride is the vocabulary) run at the unaligned rate; a vocabulary padded to 50304 does
    not, and its head is faster for more FLOPs."""
    odd, padded = (forms.gpt2_parts(6, 768, v, 1024, 8, "inductor")["head_gemms"]
                   for v in (50257, 50304))
    assert {g[0] for g in odd.gemms} == {"bfloat16_unaligned"}
    assert {g[0] for g in padded.gemms} == {"bfloat16"}
    assert forms.predict(padded, H100).device_s < forms.predict(odd, H100).device_s


def test_gemm_waves_are_quantized_by_the_sm_count():
    """An 8192 x 768 output is 384 tiles of 128 x 128: 3 waves on 132 SMs (396 slots); a
    768 x 768 weight gradient is 36 tiles, one wave; no SM count, no quantization."""
    assert forms.quantization(8192, 768, H100) == pytest.approx(384 / 396)
    assert forms.quantization(768, 768, H100) == pytest.approx(36 / 132)
    assert forms.quantization(768, 768, CPU_DEFAULT) == 1.0


def test_kernel_families_fall_back_to_the_bf16_rate():
    """A profile without the documented family rates (a calibrated one) prices unaligned
    GEMMs and flash attention as bf16 GEMMs, never at the float32 fallback of unknown
    dtypes."""
    calibrated = dataclasses.replace(H100, flops={"float32": 50e12, "bfloat16": 600e12})
    for kind in ("bfloat16_unaligned", "flash_attention_forward", "flash_attention_backward"):
        assert forms.rate(calibrated, kind) == 600e12
        assert forms.rate(H100, kind) == H100.flops[kind] < H100.flop_rate("bfloat16")
