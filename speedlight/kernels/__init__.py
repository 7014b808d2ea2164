"""Triton kernels only, one file per op family."""
