"""The training benchmark suite (in the spirit of TBD): representative training workloads
(`fxopt.bench.workloads`) under the baselines and fxopt configurations
(`fxopt.bench.configs`), measured for step time, throughput, peak memory, largest batch
under a cap and compile time (`fxopt.bench.measure`), reported as JSON, markdown and
charts (`fxopt.bench.report`). Run it with ``python -m fxopt bench`` (`fxopt.cli.bench`).
The scripts under ``benchmarks/`` share these pieces: the models of
`fxopt.bench.workloads` (one LSTM LM, the LSTMCell loop, a GPT-2 builder), the one timing
and interleaving helper `fxopt.bench.timing`, and `fxopt.bench.table` (a benchmark as a
list of cases run under a deadline, rows written as they come: the GPU check).
"""

from fxopt.bench.configs import Config, all_configs, get_configs
from fxopt.bench.measure import Measurement, Settings, largest_batch, measure
from fxopt.bench.runner import Suite, run_suite
from fxopt.bench.workloads import WORKLOADS, Workload, get_workloads

__all__ = ["WORKLOADS", "Config", "Measurement", "Settings", "Suite", "Workload",
           "all_configs", "get_configs", "get_workloads", "largest_batch", "measure",
           "run_suite"]
