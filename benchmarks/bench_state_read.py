"""CPU of read_state of one state (best of 5): from the input path (ids checked again, every footer
read) and from the state's Parts. Usage: python benchmarks/bench_state_read.py INPUT STATE"""
import sys
import time
from pathlib import Path

from gedp.running.engine import input_states, read_state
from gedp.synth.columns import CONFIDENTIAL

path, state = sys.argv[1], sys.argv[2]
inputs = input_states(path)
stored = inputs.codes[state]
sources = {"path": path}
try:
    from gedp.synth.io import parts_holding
    sources["parts"] = parts_holding(Path(path), "state", inputs.codes, inputs.stamps)[state]
except ImportError:
    pass
for name, source in sources.items():
    best = []
    for _ in range(5):
        cpu = time.process_time()
        read_state(source, state, CONFIDENTIAL, stored)
        best.append(time.process_time() - cpu)
    print(f"read_state({name}) state {state}: best cpu {min(best):.3f} s")
