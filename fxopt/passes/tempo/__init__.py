"""tempo: Tempo's memory-lean GELU, LayerNorm/RMSNorm and attention softmax-dropout.

Before autograd, on Dynamo's torch-level graph, each site the matchers in ``sites`` find is
replaced by one fxopt custom op (``fxopt.kernels.tempo``) whose autograd saves less:
GELU keeps its output and a 1-bit branch mask instead of its input; a norm keeps its output
and rstd instead of its input; the attention core keeps the softmax output and a 1-bit
dropout mask instead of the dropout output. GELU and norm outputs are kept only when the
next op keeps them anyway (a Linear or matmul in the same dtype), so a site whose output no
neighbour keeps is left alone: rewriting it would save its output in place of its input.
Under autocast a norm's fp32 output is kept by the next Linear only as that Linear's own
bf16 (fp16) cast: there tempo's op makes the cast itself, hands it to those Linears (which
then compute the very values they would) and keeps it with rstd, in place of the norm's
fp32 input (``fxopt::tempo_layer_norm`` / ``fxopt::tempo_rms_norm`` with a bf16 output when
the Linears are the only users, as in Llama, ``fxopt::tempo_layer_norm_cast`` /
``fxopt::tempo_rms_norm_cast`` with both outputs when others, a residual add, take the fp32
value).

Under ``codegen="inductor"`` the same sites get the ops' aten-only forms
(``fxopt.kernels.tempo.fusible``: autograd Functions AOTAutograd traces through) instead,
so that Inductor fuses them rather than calling opaque extern kernels.

Stats: per kind, the sites rewritten and the predicted saved-activation bytes removed per
step (``rewritten``, ``bytes_removed``); the sites left alone, per reason (``skipped``).
Default: off unless asked (``options={"tempo": True}``): the backward recomputes from
outputs (GELU's derivative from a fitted polynomial of its output: within 7.5e-5 of the
exact one on a grid of fp32 outputs and 1.6e-2 of bf16 ones, see ``fit_gelu.py``, up to
3.2e-4 with fp32 outputs right at GELU's minimum, where the output's rounding decides;
``fxopt.testing.TEMPO_TOLERANCES``), a trade of accuracy and a little time for memory that
the user opts into.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx as fx

from fxopt._compat import tree_leaves
from fxopt.kernels import tempo as _tempo_ops  # noqa: F401  (registers the ops)
from fxopt.kernels.tempo.fusible import fusible_form
from fxopt.passes.base import PassContext, PassResult, RewriteCounter, Verdicts
from fxopt.passes.tempo.graph import cast_by_savers, drop_noop_casts, kept_by_neighbour
from fxopt.passes.tempo.sites import MATCHERS, Site

__all__ = ["rewrite_sites", "tempo"]


def tempo(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    """Replace every GELU, LayerNorm/RMSNorm and softmax-dropout-matmul site that saves
    memory by a tempo custom op; with ``tempo="auto"``, only the site kinds that pay under
    the memory budget (:mod:`fxopt.passes.tempo.auto`)."""
    kinds, auto = None, None
    if ctx.options.tempo == "auto":
        from fxopt.passes.tempo.auto import choose_sites

        auto = choose_sites(gm, ctx)
        kinds = set(auto["taken"])
    fusible = ctx.codegen.fuses_pointwise
    verdicts = rewrite_sites(gm, ctx.rewrites, kinds, fusible=fusible)
    stats: dict[str, Any] = {"form": "fusible" if fusible else "custom_ops"}
    if auto is not None:
        stats["auto"] = auto
    return PassResult(gm, bool(verdicts.matched), verdicts, stats)


def rewrite_sites(gm: fx.GraphModule, rewrites: RewriteCounter,
                  kinds: set[str] | None = None, *, fusible: bool = False) -> Verdicts:
    """Rewrite the sites of ``kinds`` (None: every kind) that save memory, in place, by the
    custom ops or (``fusible``) their aten-only forms; the verdicts: per kind the sites
    rewritten and the saved bytes they remove, per site left its reason."""
    verdicts = Verdicts()
    for node in list(gm.graph.nodes):
        if node.graph is not gm.graph:  # erased by an earlier rewrite
            continue
        site = next((s for s in (m(node) for m in MATCHERS) if s is not None), None)
        if site is None:
            continue
        reason = site if isinstance(site, str) else _refusal(site)
        if reason is None and kinds is not None and site.kind not in kinds:
            reason = f"{site.kind}: not taken (tempo='auto')"
        if reason is None and not rewrites.allow():
            reason = "rewrite limit"
        if reason is not None:
            verdicts.decline(node.name, reason)
            continue
        _rewrite(gm.graph, site, fusible_form(site.op, site.args) if fusible else site.op)
        verdicts.match(site.kind, bytes=site.bytes_removed)
    return verdicts


def _refusal(site: Site) -> str | None:
    """Why a matched site is left alone, or None to rewrite it."""
    inside = set(site.replaced)
    for node in site.replaced:
        if node is not site.result and not set(node.users) <= inside:
            return f"{site.kind}: an intermediate value is used elsewhere"
    order = {n: i for i, n in enumerate(site.insert_before.graph.nodes)}
    position = order[site.insert_before]
    if any(isinstance(a, fx.Node) and order[a] >= position for a in tree_leaves(site.args)):
        return f"{site.kind}: an operand is computed after the site starts"
    if site.needs_neighbour and not kept_by_neighbour(site.result):
        return f"{site.kind}: output not kept by a neighbour (no saving)"
    return None


def _rewrite(graph: fx.Graph, site: Site, target: Any) -> None:
    if site.cast is not None:
        # the users that keep their own cast, reached without the no-op casts between
        # (a Gemma RMSNorm's fp32 type_as would turn the cast back into fp32)
        drop_noop_casts(site.result)
        site.cast = (site.cast[0], cast_by_savers(site.result)[1], site.cast[2])
    with graph.inserting_before(site.insert_before):
        op = graph.call_function(target, site.args)
        value = graph.call_function(operator.getitem, (op, 0))
        cast = (graph.call_function(operator.getitem, (op, 1))
                if site.cast is not None and site.cast[2] == 1 else value)
    names = [n.name for n in site.replaced]
    op.meta["fxopt"] = {"pass": "tempo", "kind": site.kind, "replaces": names}
    example = site.result.meta.get("example_value")
    for node in {value, cast}:
        node.meta["fxopt"] = {"pass": "tempo", "replaces": [site.result.name]}
        if example is not None:
            node.meta["example_value"] = example
    site.result.replace_all_uses_with(value)
    if site.cast is not None:  # the users that compute in the low dtype take the cast
        dtype, users, _ = site.cast
        if example is not None:
            cast.meta["example_value"] = example.to(dtype)
        for user in users:
            user.replace_input_with(value, cast)
    for node in reversed(site.replaced):
        graph.erase_node(node)
