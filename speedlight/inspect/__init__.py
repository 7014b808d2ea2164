"""`speedlight inspect`: what the compiler made of an op's kernels, with or without a GPU.

launches  run an op's case and record every Triton launch (arguments, specialisation,
          grid) and, under the interpreter, the bytes each launch loads and stores
compile   compile each distinct launch for a target (sm_80, sm_90a, sm_100a, native)
sass      read resources, SASS instruction mix and per-source-line memory access widths
case_report  occupancy, waves, bytes against the OpSpec's compulsory bytes, findings
display   rich tables; command: the CLI
"""
