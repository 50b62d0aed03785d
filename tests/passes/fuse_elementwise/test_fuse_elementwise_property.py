"""fuse_elementwise on random pointwise DAGs (hypothesis): random ops over inputs of
broadcasting shapes and mixed float dtypes; fused outputs and gradients equal eager's.
Examples are few and derandomised so CI runs the same cases every time."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fxopt.kernels import triton_runs_on
from fxopt.testing import assert_same_as_eager

pytestmark = pytest.mark.skipif(not triton_runs_on("cpu"),
                                reason="needs Triton's interpreter (TRITON_INTERPRET=1)")

settings.register_profile("fxopt-fusion", max_examples=5, derandomize=True, deadline=None,
                          database=None)

# Total functions only (no nan from the random values), so every case compares, at each
# dtype's default tolerance (fxopt.testing.TOLERANCES): the fused kernel computes each op in
# fp32 and rounds to the op's dtype as eager does; only its exp/tanh/erf may differ from
# ATen's in the last fp32 bits, which moves a bf16 or fp16 rounding by at most one ulp.
UNARY = [torch.sigmoid, torch.tanh, torch.relu, F.gelu, F.silu, lambda x: x * 0.5 + 1,
         lambda x: x.clamp(-0.5, 0.5), lambda x: torch.exp(-x * x), lambda x: x.float()]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum,
          lambda x, y: torch.where(x > y, x, y), lambda x, y: x / (1 + y * y)]
SHAPES = [(3, 5), (5,), (3, 1), ()]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@st.composite
def dags(draw):
    inputs = [(draw(st.sampled_from(SHAPES[1:])) if i else SHAPES[0],
               draw(st.sampled_from(DTYPES))) for i in range(draw(st.integers(2, 3)))]
    steps = []
    for n in range(draw(st.integers(3, 6))):
        available = len(inputs) + n
        if draw(st.booleans()):
            steps.append((draw(st.integers(0, len(UNARY) - 1)),
                          draw(st.integers(0, available - 1))))
        else:
            steps.append((draw(st.integers(0, len(BINARY) - 1)),
                          draw(st.integers(0, available - 1)), draw(st.integers(0, available - 1))))
    extra = draw(st.integers(0, len(inputs) + len(steps) - 1))
    return inputs, steps, extra


def build(steps, extra):
    def fn(*args):
        values = list(args)
        for step in steps:
            if len(step) == 2:
                values.append(UNARY[step[0]](values[step[1]]))
            else:
                values.append(BINARY[step[0]](values[step[1]], values[step[2]]))
        return values[-1] * 1.5, values[extra] + 0.25
    return fn


@settings(settings.get_profile("fxopt-fusion"))
@given(dags())
def test_random_pointwise_dags_match_eager(dag):
    inputs, steps, extra = dag
    torch._dynamo.reset()
    args = [torch.randn(shape).to(dtype).requires_grad_() for shape, dtype in inputs]
    comparison = assert_same_as_eager(build(steps, extra), args, {"fuse_elementwise": True,
                                                                    "strict": True})
    assert comparison.fired("fuse_elementwise")
