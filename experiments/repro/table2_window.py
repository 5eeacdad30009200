"""Table 2 of `coda compare --preset paper-multi` counts routing decisions outside the measurement
window (warm-up and drain), unlike every other number in the report, which counts only the
window. Minimal reproduction (about 10 s):  python experiments/repro/table2_window.py
"""

from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.sim.paper import RouteDistance
from coda.workload.spec import load_workload


class InWindow(RouteDistance):
    def __init__(self, start: float, end: float) -> None:
        super().__init__()
        self.start, self.end, self.inside = start, end, 0

    def on_route(self, snap, chosen):  # noqa: ANN001
        self.inside += self.start <= snap.now_s <= self.end
        super().on_route(snap, chosen)


wl = load_workload("synth:rate=5,duration=900,seed=0")
obs = InWindow(300.0, 900.0)
sim = Simulation(wl, SimConfig(system="coda", workers=4, warmup_s=300.0), observers=[obs])
obs.window = sim.window  # as run_preset does
res = sim.run()
s = res.summary()
print(f"Table 2 'decisions' (RouteDistance.decisions): {obs.decisions}")
print(f"decisions inside the measurement window [{res.sim.window.start_s:g}, {res.sim.window.end_s:g}] s: {obs.inside}")
print(f"requests offered in the window (the denominator of every other metric): {s['offered']}")
assert obs.decisions == obs.inside, "Table 2 counts decisions outside the window"
