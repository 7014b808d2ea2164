"""`speedlight profile`: where a model's time and memory go, what bounds each op, and which
op chains a speedlight op would replace.

models    what --model builds (the default small Llama, MODELS families, config.json, callables)
capture   warm-up, clean timed steps, recorded steps (every aten op, its module, its time)
costs     FLOPs and compulsory bytes per aten op, each with the formula that produced it
roofline  floors on the target (probe's measured ceilings, else the datasheet), bounds
analyze   rows and aggregates (op type, module, class, phase, bound, top ops)
memory    peak memory from tensor lifetimes, by parameters, gradients, optimizer, activations
patterns  the fusable chains in the recorded op graph;  advice  what each would save
schema    the JSON document, field by field;  render / html / charts  terminal, HTML, SVG
"""
