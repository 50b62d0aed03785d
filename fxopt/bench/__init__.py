"""The training benchmark suite (in the spirit of TBD): representative training workloads
(`fxopt.bench.workloads`) under the baselines and fxopt configurations
(`fxopt.bench.configs`), measured for step time, throughput, peak memory, largest batch
under a cap and compile time (`fxopt.bench.measure`), reported as JSON, markdown and
charts (`fxopt.bench.report`). Run it with ``python -m fxopt bench`` (`fxopt.cli.bench`).
Each pass's own benchmark can reuse these pieces: a :class:`Workload`, a :class:`Config`
and :func:`measure`.
"""

from fxopt.bench.configs import Config, all_configs, get_configs
from fxopt.bench.measure import Measurement, Settings, largest_batch, measure
from fxopt.bench.runner import Suite, run_suite
from fxopt.bench.workloads import WORKLOADS, Workload, get_workloads

__all__ = ["WORKLOADS", "Config", "Measurement", "Settings", "Suite", "Workload",
           "all_configs", "get_configs", "get_workloads", "largest_batch", "measure",
           "run_suite"]
