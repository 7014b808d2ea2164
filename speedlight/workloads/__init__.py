"""What the tools run and count, shared by profile, bench, shape and the report.

models  what --model builds: the default small Llama, a MODELS family, a config.json, a
        user's callable; the Workload (model, inputs, loss) every tool runs
costs   FLOPs and compulsory bytes per aten op, each with the formula that produced it
moe     a mixture of experts' routed block: its modules, uniform routing's rows per expert,
        the expert GEMMs' FLOPs
"""
