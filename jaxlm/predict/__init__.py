"""Predicted GPU time, on any machine: compile training's own step for a GPU, read the program, price its kernels,
calibrate by a measured GPU. Read top to bottom:

- `target`: the GPU (a row of jaxlm.analysis.devices or a file) and the one `--target` flag group;
- `compile`: lower and compile the step for it, the compiled row (memory plan, program facts, prediction);
- `hlo`, `cost`, `program`: the optimised program read: its kernels and what each does, its static facts;
- `efficiency`, `roofline`: each kernel priced by its shape at the GPU's rates, the prediction and its summary;
- `calibration`: measured over predicted from a profiled GPU, applied to later predictions;
- `rows`, `store`: compiled benchmark rows (`python -m jaxlm.bench model --target`) and the compiled figures' file.
"""
