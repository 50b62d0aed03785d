"""Helpers that make other libraries' models compile into fewer Dynamo graphs.

transformers 5.x patches logging helpers onto ``logging.Logger`` (``warning_once``,
``warning_advice``, ``info_once``) and calls them inside model code; Dynamo cannot trace a
logger method, so it breaks the graph there. On GPT-2 the break falls between the LM head
and the loss (``PreTrainedModel.loss_function`` warns that ``loss_type`` is unset), so
the two land in different graphs and ``fuse_linear_cross_entropy`` cannot see them
together. :func:`ignore_transformers_logging` makes Dynamo skip those calls (they then do
not log while Dynamo traces them; outside compiled code they log as before).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import Any

from fxopt import _compat

__all__ = ["ignore_transformers_logging", "transformers_logging_functions"]

_WRAPPERS = ("warning_once", "warning_advice", "info_once")


def transformers_logging_functions() -> set[Any]:
    """The logger wrappers transformers patches onto ``logging.Logger`` when its logging
    module is imported; that module is imported here if transformers is installed and has
    not been yet (a script that builds its model inside ``ignore_transformers_logging``
    imports it too late: benchmarks/fuse_linear_cross_entropy_step.py's GPT-2 kept its
    break that way, and measured no fused loss). Empty when transformers is not
    installed."""
    if not all(hasattr(logging.Logger, name) for name in _WRAPPERS) \
            and importlib.util.find_spec("transformers") is not None:
        importlib.import_module("transformers.utils.logging")
    return {getattr(logging.Logger, name) for name in _WRAPPERS
            if hasattr(logging.Logger, name)}


def ignore_transformers_logging() -> Any:
    """A context manager (and decorator) under which Dynamo traces through transformers'
    logging calls instead of breaking the graph at them. Dynamo reads it when it traces, so
    wrap the compiled model's first call (and any call that recompiles)::

        with fxopt.ignore_transformers_logging():
            loss = compiled(input_ids, labels=labels).loss
    """
    return _compat.dynamo_ignoring_functions(transformers_logging_functions())
