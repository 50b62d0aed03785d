"""fxopt: a torch.compile backend that cuts the memory and time of PyTorch training.

    model = torch.compile(model, backend="fxopt", options={"memory_budget": "6GiB"})

The backend is found through the ``torch_dynamo_backends`` entry point, so importing fxopt
is only needed for its API: :func:`backend` (a backend object with fixed options),
:func:`explain` (what each pass did to each graph), :mod:`fxopt.config` (options, scoped
patches), :mod:`fxopt.testing` (compiled-vs-eager checks for pass authors), and
:func:`profile_memory` (a training step's memory by category),
:func:`ignore_transformers_logging` (no graph breaks at transformers' logging calls);
:mod:`fxopt.optim` (optimizer-state offload) and :class:`Plan` (the planner's answer, saved
and replayed with ``options={"plan": path}``).
"""

from fxopt import config, optim
from fxopt.compiler import Backend, GraphRecord, backend
from fxopt.explain import ExplainReport, explain
from fxopt.graph_breaks import ignore_transformers_logging
from fxopt.lm_outputs import drop_logits
from fxopt.passes import PassContext, PassResult, PassSpec, Stage
from fxopt.planner import Plan
from fxopt.profile import profile_memory

__version__ = "0.1.0"

__all__ = [
    "Backend", "ExplainReport", "GraphRecord", "PassContext", "PassResult", "PassSpec",
    "Plan", "Stage", "backend", "config", "drop_logits", "explain",
    "ignore_transformers_logging", "optim",
    "profile_memory", "__version__",
]
