"""``fxopt plan`` and ``fxopt calibrate``: the planner from the command line.

``fxopt plan TARGET`` captures one training step of a model and prints, per captured
graph, the predicted keep-all peak and step time and the time-vs-memory Pareto frontier
(``--png`` draws it); ``--budget 6GiB`` also plans that budget with
:func:`fxopt.planner.plan_step` (as compilation does) and prints the plan as a table
(tensors recomputed, swapped and kept, predicted peak or saved bytes and step time, the
floor), and ``--save plan.json`` writes it (and the frontier PNG next to it when
matplotlib is installed); ``--dynamic`` captures with symbolic sizes and ``--fit 6GiB``
answers the largest batch that fits and its predicted throughput.

TARGET contract: ``package.module:function`` or ``path/to/file.py:function`` (the function
defaults to ``fxopt_plan_target``). The function takes no arguments and returns
``(model, example_inputs)``: an ``nn.Module`` and a tuple of its positional inputs (on the
device to plan for). The step planned is ``model(*example_inputs)`` followed by backward
of the sum of its first tensor output (a scalar loss is itself).

``fxopt calibrate [--device cuda]`` measures the device and caches its profile
(:mod:`fxopt.cli.calibrate`); ``--no-save`` only prints the rates (the GPU session's
record, which must not change the profile the rest of the session plans with).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fxopt.cli.targets import TargetError, load_function

__all__ = ["add_planner_commands", "load_target"]

DEFAULT_FUNCTION = "fxopt_plan_target"


def add_planner_commands(commands: argparse._SubParsersAction) -> None:
    """Register ``plan`` and ``calibrate`` on the ``fxopt`` command's subparsers."""
    plan = commands.add_parser("plan", help="predicted time-vs-memory frontier of a model",
                               description=__doc__.split("\n\n")[1])
    plan.add_argument("target", help="module:function or file.py[:function] returning "
                      "(model, example_inputs)")
    plan.add_argument("--budget", help="solve this memory budget (bytes, 6GiB, 50%%, 0.5)")
    plan.add_argument("--save", metavar="PLAN_JSON", help="write the plan (with --budget)")
    plan.add_argument("--joint", action="store_true", help="with a fraction --budget and "
                      "graph breaks: split it by the graphs' frontiers, all graphs known at "
                      "once (compilation, one graph at a time, replays it with plan=)")
    plan.add_argument("--tempo", choices=("off", "auto"), default="off",
                      help="with --budget: 'auto' plans tempo's site kinds jointly with the "
                      "activations (as compilation with tempo='auto' does)")
    plan.add_argument("--optimizer-subgroups", type=int, metavar="N",
                      help="with a byte --budget: plan an offloaded optimizer's N subgroups "
                      "(host or device) jointly with the activations, in one budget")
    plan.add_argument("--codegen", choices=("auto", "fx", "inductor"), default="auto",
                      help="the code generator compilation will use (its codegen option): "
                      "the graph is captured, and a saved plan replays, for that one")
    plan.add_argument("--points", type=int, default=12, help="budgets on the frontier")
    plan.add_argument("--png", metavar="PATH", help="draw the frontier (needs matplotlib; "
                      "with --save, drawn next to the plan by default)")
    plan.add_argument("--time-limit", type=float, default=10.0,
                      help="seconds per MILP solve (default 10)")
    plan.add_argument("--dynamic", action="store_true",
                      help="capture with symbolic sizes (batch, sequence length)")
    plan.add_argument("--fit", metavar="BYTES",
                      help="with --dynamic: the largest batch whose peak fits in BYTES")
    plan.add_argument("--max-batch", action="store_true", help="with a byte --budget: the "
                      "largest batch that fits with the plan's own savings (captures with "
                      "symbolic sizes, as --dynamic)")
    plan.add_argument("--symbol", help="with --fit: the size symbol to grow (default: the "
                      "first one that is dim 0 of an input)")
    plan.set_defaults(run=_plan)
    calibrate = commands.add_parser("calibrate", help="measure this device's rates and "
                                    "cache them for the planner")
    calibrate.add_argument("--device", default="cuda" if _cuda() else "cpu")
    calibrate.add_argument("--quick", action="store_true", help="tiny sizes (seconds, rough)")
    calibrate.add_argument("--threads", type=int, default=None,
                           help="measure with N CPU threads (default: torch's setting)")
    calibrate.add_argument("--force", action="store_true",
                           help="cache the profile even when a rate is more than 10x off "
                           "the device's documented default")
    calibrate.add_argument("--no-save", action="store_true",
                           help="print the rates and cache nothing (the planner keeps its "
                           "profile)")
    calibrate.set_defaults(run=_calibrate)


def load_target(target: str) -> tuple[Any, tuple[Any, ...]]:
    """Call TARGET (see the module doc) and check what it returns."""
    import torch

    result = load_function(target, DEFAULT_FUNCTION)()
    if (not isinstance(result, tuple) or len(result) != 2
            or not isinstance(result[0], torch.nn.Module)):
        raise TargetError(f"{target} must return (model, example_inputs), got "
                          f"{type(result).__name__}")
    model, inputs = result
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _plan(args: argparse.Namespace) -> int:

    from fxopt.cli.capture import capture_joints
    from fxopt.config import parse_memory_budget
    from fxopt.passes.swap_recompute import predict_plan_peak
    from fxopt.planner.frontier import pareto_frontier
    from fxopt.planner.hardware import profile_for
    from fxopt.planner.joint import step_problem
    from fxopt.planner.ledger import BudgetLedger, split_by_frontiers
    from fxopt.planner.plan import save_plans
    from fxopt.planner.solvers.fraction import solve_fraction
    from fxopt.planner.step import plan_step
    from fxopt.planner.symbolic import symbolic_step
    from fxopt.units import format_bytes

    try:
        model, inputs = load_target(args.target)
        budget = parse_memory_budget(args.budget, "--budget") if args.budget else None
        fit = parse_memory_budget(args.fit, "--fit") if args.fit else None
        if fit is not None and (fit.bytes is None or not args.dynamic):
            raise ValueError("--fit takes bytes (e.g. 6GiB) and needs --dynamic")
        if args.max_batch and (budget is None or budget.bytes is None):
            raise ValueError("--max-batch takes a byte --budget (e.g. 6GiB)")
        args.dynamic = args.dynamic or args.max_batch
        if args.save and budget is None:
            raise ValueError("--save needs --budget")
        if args.joint and (budget is None or budget.fraction is None):
            raise ValueError("--joint splits a fraction: give --budget as one (e.g. 0.5)")
        if (args.tempo == "auto" or args.optimizer_subgroups) and budget is None:
            raise ValueError("--tempo auto and --optimizer-subgroups plan under a budget: "
                             "give --budget")
        if args.optimizer_subgroups is not None and (budget.bytes is None
                                                     or args.optimizer_subgroups < 1):
            raise ValueError("--optimizer-subgroups takes a count >= 1 and a byte --budget "
                             "(e.g. 6GiB): a fraction bounds saved bytes only")
    except (ValueError, TypeError, ImportError) as error:
        print(f"fxopt plan: {str(error).removeprefix('fxopt: ')}", file=sys.stderr)
        return 2
    device = next((t.device for t in inputs if hasattr(t, "device")), None)
    hardware = profile_for(device or "cpu")
    # captured as compilation under these options captures it, each graph with the code
    # generator compilation resolves for it
    joints = capture_joints(model, inputs, dynamic=args.dynamic,
                            options=_compile_options(args, budget))
    ledger = BudgetLedger()  # a fraction is the model's, shared as compilation shares it
    plans = []
    built = [step_problem(joint.gm, joint.num_fwd_outputs, hardware, codegen=joint.codegen,
                          name=f"g{index}", removed_bytes=joint.removed_bytes,
                          activation_inputs=joint.activation_inputs)
             for index, joint in enumerate(joints)]
    problems = [problem for _, problem in built]
    shares: list[int | None] = [None] * len(joints)
    if args.joint:
        shares = list(split_by_frontiers([p.saved_bytes for p in problems], budget))
    print(f"fxopt plan: {args.target}: {len(joints)} graph(s); hardware {hardware.name} "
          f"({hardware.source}){'; budget split by the frontiers' if args.joint else ''}")
    for index, (joint, problem) in enumerate(zip(joints, problems, strict=True)):
        print(f"\ng{index}: keep-all peak {format_bytes(problem.keep_all_peak_bytes)}, "
              f"activations {format_bytes(problem.activation_bytes)}, predicted "
              f"step {1e3 * problem.step_seconds:.3f} ms; "
              f"{len(problem.activations.activations)} saved tensors")
        codegen = joint.codegen
        print(f"code generation: {codegen} ({codegen.reason})")
        floor = solve_fraction(problem.saved_bytes, 0)
        print(f"floor of a fraction budget (everything recomputable recomputed): "
              f"{floor.floor_fraction:.3f} of plain autograd's saved bytes "
              f"({format_bytes(floor.floor_bytes)} of {format_bytes(floor.plain_bytes)})")
        frontier = pareto_frontier(problem.activations, points=args.points,
                                   time_limit=args.time_limit, step_seconds=problem.step_seconds)
        print(frontier.table())
        plan = None if budget is None else plan_step(
            problem, budget, hardware, time_limit=args.time_limit, ledger=ledger,
            share_bytes=shares[index])
        if codegen.partitions_by_min_cut and problem.simulate is not None:
            # a byte plan has simulated the step with nothing recomputed already
            simulated = plan.predictions["keep_all_peak_bytes"] \
                if plan is not None and "fraction" not in plan.extra else problem.simulate({})
            print(f"(the keep-all peak and the frontier are the joint graph's timeline model; "
                  f"Inductor's min-cut recomputes what it fuses, and its step with nothing "
                  f"recomputed simulates to {format_bytes(int(simulated))})")
        if plan is not None:
            if "fraction" in plan.extra and codegen.partitions_by_min_cut:
                print("Inductor's budgeted min-cut meets the fraction at the partition "
                      "(compilation's explain shows what it keeps); below: fxopt's plan, "
                      "its fallback")
            elif plan.actions:  # the peak compilation predicts (and explain shows)
                predict_plan_peak(plan, joint.gm, built[index][0], joint.num_fwd_outputs,
                                  codegen)
            if "saved_bytes" in plan.predictions:
                reached = (f"predicted saved bytes "
                           f"{format_bytes(int(plan.predictions['saved_bytes']))} (share "
                           f"{format_bytes(plan.budget_bytes)} of the model's budget)")
            else:
                reached = f"predicted peak {format_bytes(int(plan.predictions['peak_bytes']))}"
            print(f"budget {budget}: {reached}, +"
                  f"{1e3 * plan.predictions['added_seconds']:.3f} ms, {len(plan.actions)} "
                  f"tensors not kept{'' if plan.feasible else ', OVER BUDGET'}")
            # the frontier's floor is the timeline model's: not the compiled step's under
            # Inductor's min-cut (the note above)
            lowest_peak = None if "fraction" in plan.extra or codegen.partitions_by_min_cut \
                else min((p.peak_bytes for p in frontier.points), default=None)
            print(plan.table(lowest_peak))
            plans.append(plan)
        png = args.png or (args.save and Path(args.save).with_suffix(".frontier.png"))
        if png:
            _draw(frontier, _per_graph(png, index, len(joints)), f"{args.target} g{index}",
                  plan)
        if args.dynamic:
            symbolic = symbolic_step(joint.gm, joint.num_fwd_outputs, hardware)
            _print_symbolic(symbolic, fit, args.symbol)
            if args.max_batch:
                _print_max_batch(symbolic, joint.gm, problem, budget.bytes, args.symbol)
    if budget is not None and joints and (args.tempo == "auto" or args.optimizer_subgroups):
        _print_joint(model, inputs, budget, hardware, joints[0].codegen, args, problems)
    if args.save:
        print(f"plan saved: {save_plans(plans, args.save)}"
              f"{f' ({len(plans)} graphs)' if len(plans) > 1 else ''}")
    return 0


def _compile_options(args: argparse.Namespace, budget: Any) -> Any:
    """The options of the compilation this plan stands for: the budget, the code generator
    (and tempo='auto') as given; with ``--save`` the saved plan replayed (``plan=``), so the
    code generator is the one that replay resolves, as without it the one the budget alone
    resolves."""
    import dataclasses

    from fxopt import config

    options = config.resolve({"memory_budget": budget, "codegen": args.codegen,
                              "tempo": "auto" if args.tempo == "auto" else None})
    return dataclasses.replace(options, plan=args.save)  # a file still to be written


def _print_joint(model: Any, inputs: Any, budget: Any, hardware: Any, codegen: Any,
                 args: argparse.Namespace, problems: list[Any]) -> None:
    """The shared-budget plan of every graph (tempo sites x activations x optimizer subgroups)."""
    from fxopt.cli.capture import capture_dynamo
    from fxopt.optim.shared_budget import plan_model, subgroups_of
    from fxopt.passes.tempo.auto import tempo_variants

    if args.tempo == "auto":
        graphs = [tempo_variants(gm, example, hardware, codegen=codegen, name=f"g{index}")
                  for index, (gm, example) in enumerate(capture_dynamo(model, inputs))]
    else:
        graphs = [{(): problem} for problem in problems]
    subgroups = (subgroups_of(model.parameters(), args.optimizer_subgroups)
                 if args.optimizer_subgroups else None)
    for index, choice in enumerate(plan_model(graphs, budget, hardware, subgroups=subgroups,
                                              time_limit=args.time_limit)):
        print(f"\ng{index} {choice.table()}")


def _per_graph(path: str | Path, index: int, graphs: int) -> Path:
    path = Path(path)
    return path.with_name(f"{path.stem}_g{index}{path.suffix}") if graphs > 1 else path


def _draw(frontier: Any, png: Path, title: str, plan: Any) -> None:
    """The frontier PNG, a byte plan marked on it; a line saying so when matplotlib is not
    installed."""
    chosen = (None if plan is None or "peak_bytes" not in plan.predictions else
              (int(plan.predictions["peak_bytes"]), plan.predictions["added_seconds"]))
    try:
        print(f"frontier drawn: {frontier.plot(png, title=title, chosen=chosen)}")
    except RuntimeError as error:  # matplotlib missing
        print(f"frontier not drawn: {str(error).removeprefix('fxopt: ')}")


def _print_symbolic(step: Any, fit: Any, symbol: str | None) -> None:
    from fxopt.units import format_bytes

    if not step.symbols:
        print("sizes: static (no symbolic dimension in this graph)")
        return
    for name, hint in step.symbols.items():
        print(f"size {name} = {hint} at capture, found at {', '.join(step.origins[name])}")
    if fit is None:
        return
    symbol = symbol or _batch_symbol(step)
    if symbol is None:
        print("--fit: no size symbol is dim 0 of an input; pass --symbol")
        return
    answer = step.largest_fitting(symbol, fit.bytes)
    if answer is None:
        print(f"--fit: even {symbol} = 1 does not fit in {format_bytes(fit.bytes)}")
        return
    best, peak, throughput = answer
    print(f"largest {symbol} that fits in {format_bytes(fit.bytes)}: {best} (predicted peak "
          f"{format_bytes(int(peak))}, {throughput:.1f} {symbol}/s predicted)")


def _batch_symbol(step: Any) -> str | None:
    """The first size symbol that is dim 0 of an input (the batch, usually)."""
    return next((n for n, where in step.origins.items()
                 if any(w.endswith("[0]") for w in where)), None)


def _print_max_batch(step: Any, joint_gm: Any, problem: Any, budget: int,
                     symbol: str | None) -> None:
    from fxopt.planner.batch import largest_batch
    from fxopt.planner.solvers.milp import lowest_peak_plan
    from fxopt.units import format_bytes

    symbol = symbol or _batch_symbol(step)
    if symbol is None:
        print("--max-batch: no size symbol is dim 0 of an input; pass --symbol")
        return
    floor = lowest_peak_plan(problem.activations)
    counts = {a: sum(1 for v in floor.actions.values() if v == a) for a in ("recompute", "swap")}
    kept = step.largest_fitting(symbol, budget)
    answer = largest_batch(step, joint_gm, problem.activations, floor.actions,
                           floor.added_seconds, symbol, budget)
    if answer is None:
        print(f"--max-batch: even {symbol} = 1 does not fit in {format_bytes(budget)}")
        return
    best, peak, throughput = answer
    print(f"largest {symbol} that fits in {format_bytes(budget)} with the plan's savings "
          f"(lowest-peak plan: {counts['recompute']} recomputed, {counts['swap']} swapped): "
          f"{best} (predicted peak {format_bytes(int(peak))}, {throughput:.1f} {symbol}/s "
          f"predicted); with everything kept: {kept[0] if kept else 'none'}")


def _calibrate(args: argparse.Namespace) -> int:
    from fxopt.cli.calibrate import PLAUSIBLE_FACTOR, calibrate, implausible
    from fxopt.planner.hardware import default_profile, save_calibrated

    sizes = {"size": 256, "copy_mib": 16, "adam_params": 1 << 18} if args.quick else {}
    try:
        profile = calibrate(args.device, threads=args.threads, **sizes)
    except (RuntimeError, ValueError) as error:
        print(f"fxopt calibrate: {error}", file=sys.stderr)
        return 2
    for name, rate in profile.flops.items():
        print(f"matmul {name:<9} {rate / 1e12:10.3f} TFLOP/s")
    print(f"memory bandwidth  {profile.memory_bandwidth / 1e9:10.1f} GB/s")
    if profile.host_device_bandwidth is not None:
        print(f"host<->device     {profile.host_device_bandwidth / 1e9:10.1f} GB/s")
    print(f"CPU Adam          {profile.cpu_update_params_per_second / 1e6:10.1f} Mparams/s")
    print(f"per-node overhead {profile.node_overhead_seconds * 1e6:10.1f} us")
    for what, rate in (("special functions", profile.transcendental_per_second),
                       ("random numbers", profile.random_per_second)):
        if rate is not None:
            print(f"{what:<17} {rate / 1e6:10.1f} M elements/s")
    problems = implausible(profile, default_profile(args.device))
    for problem in problems:
        print(f"fxopt calibrate: implausible: {problem}", file=sys.stderr)
    if args.no_save:
        print("not saved (--no-save)")
        return 0
    if problems and not args.force:
        print(f"fxopt calibrate: NOT saved: rates more than {PLAUSIBLE_FACTOR:.0f}x off the "
              "documented default would mislead the planner (a busy machine, or --quick's "
              "tiny sizes); rerun without --quick on an idle machine, or pass --force to "
              "cache it anyway", file=sys.stderr)
        return 1
    path = save_calibrated(profile, args.device)
    print(f"saved: {path} (profile_for uses it; delete it to use the defaults)")
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
