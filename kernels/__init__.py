"""The real kernel side (CUDA through CuPy, CPU emulation, profiler): see issue 4."""
