"""`mini-trainer plan`: per-GPU memory and step time of a training configuration, before a GPU
is booked.

The counts come from the code that trains, not from a separate formula: the real model is built
from `config.json` on the meta device (`training/model_setup.meta_model`, adapted by the real
method), the FSDP2 units are `model_setup.fsdp_units`, the dtypes `model_setup.shard_policy`,
the optimizer groups `method.param_groups`, and the activations are traced by running the real
decoder forward on meta tensors (`activations.py`). What cannot be traced that way (the loss
head's buffers, FSDP2's buffers, allocator overhead, host memory) is a formula, and the output
says so line by line. See docs/plan.md.

Modules: `inputs` (flags, cluster, model folder), `model` (meta model and its counts),
`activations` (the trace), `memory` (phases, peak, largest T), `host` (per node), `render`
(table and JSON). The measured side (for benchmarks/plan.py) is a training-loop instrument,
`training/memory_probe.py`.
"""
