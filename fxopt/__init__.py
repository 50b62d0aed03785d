"""fxopt: a torch.compile backend that cuts the memory and time of PyTorch training.

    model = torch.compile(model, backend="fxopt", options={"memory_budget": "6GiB"})

The backend is found through the ``torch_dynamo_backends`` entry point, so importing fxopt
is only needed for its API: :func:`backend` (a backend object with fixed options),
:func:`explain` (what each pass did to each graph), :mod:`fxopt.config` (options, scoped
patches) and :mod:`fxopt.testing` (compiled-vs-eager checks for pass authors).
"""

from fxopt import config, optim
from fxopt.compiler import Backend, GraphRecord, backend
from fxopt.explain import ExplainReport, explain
from fxopt.passes import PassContext, PassResult, PassSpec, Stage

__version__ = "0.1.0"

__all__ = [
    "Backend", "ExplainReport", "GraphRecord", "PassContext", "PassResult", "PassSpec",
    "Stage", "backend", "config", "explain", "optim", "__version__",
]
