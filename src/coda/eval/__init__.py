"""Evaluation above the simulator and the workloads, shipped with the package: the workload
characterization of the Coda paper's Findings (``characterize``) with its figures, and the Pareto
frontier of ``coda compare --pareto``. The paper-shaped presets are evaluation code, outside the
package (``experiments/``). Nothing below this package imports it."""
