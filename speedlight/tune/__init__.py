"""`speedlight tune`: choose each op's launch configuration per GPU and shape, ahead of time.

sweep    the tasks (one per shape bucket of a suite: its candidate configurations) and the
         one function that runs a task: prune by what inspect reads from each compiled
         kernel, then on the GPU time the survivors with bench's timer and verify the
         fastest with verify's harness; one row per (shape, configuration)
command  the CLI: tasks in, rows out (tune.jsonl), the table of winners written where the
         ops read it (speedlight/tuning.py)

tune sits on top of inspect, bench and verify (as pipeline/ does); see DESIGN-NOTES.
"""
