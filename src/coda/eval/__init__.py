"""Evaluation above the simulator and the workloads: the paper-shaped presets (``paper``) and the
workload characterization of the Coda paper's Findings (``characterize``), with their reports and
figures. Nothing below this package imports it."""
