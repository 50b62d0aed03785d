"""Tempo's memory-lean ops (custom ops ``fxopt::tempo_*``): GELU that saves its output and
a 1-bit branch mask, LayerNorm/RMSNorm that save their output and rstd, and the attention
core softmax -> dropout -> matmul that saves the softmax output and a 1-bit dropout mask.
Importing this package registers the ops; ``fit_gelu.py`` is the checked-in fit of GELU's
derivative (``gelu_coefficients.py`` its output)."""

from fxopt.kernels.tempo import attention, gelu, norm  # noqa: F401  (register the ops)
