"""`speedlight inspect`: what the compiler made of an op's kernels, with or without a GPU.

One flow for every compiler: Triton's kernels (launches captured from the op's run,
compiled by compile.TritonCompiler) and CUDA C++ kernels (an OpSpec's launches, compiled by
cuda_compile.NvccCompiler) are read into one report (case_report), judged by one set of
findings (findings) and one guard (guard), written as one kind of row and printed in one
set of tables (display).

launches  run an op's case and record every Triton launch (arguments, specialisation,
          grid) and, under the interpreter, the bytes each launch loads and stores
compile   compile each distinct launch for a target (sm_80, sm_90a, sm_100a, native)
cuda      the CUDA C++ side: nvcc's kernels read into the same report
sass      read resources, SASS instruction mix and per-source-line memory access widths
case_report  the report: occupancy, waves, bytes against the OpSpec's compulsory bytes
run       inspect cases end to end; display: rich tables; command: the CLI
"""
