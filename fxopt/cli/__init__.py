"""The ``fxopt`` command line's front ends: each command's argparse parser and printing.

`fxopt.__main__` builds the ``fxopt`` command from these modules: ``diff``
(:mod:`~fxopt.cli.debug`), ``plan`` and ``calibrate`` (:mod:`~fxopt.cli.planner`),
``profile`` (:mod:`~fxopt.cli.profile`), ``bench`` (:mod:`~fxopt.cli.bench`);
:mod:`~fxopt.cli.targets` loads the ``script.py:function`` a command is pointed at. The
work itself stays in the layered packages (debug, planner, profile, bench), which never
import this one, so the command line can depend on everything and nothing depends on it.
"""
