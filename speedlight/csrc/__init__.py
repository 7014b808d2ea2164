"""CUDA C++ sources and their loader.

The kernels live in torch-free `.cu` files (with their header) that nvcc compiles alone, so
`speedlight inspect` compiles and reads them on any machine; a thin binding
(`*_binding.cpp`) turns torch tensors into the launchers' arguments. `loader` builds the
two with torch.utils.cpp_extension on first use on a CUDA machine (never at import).
"""
