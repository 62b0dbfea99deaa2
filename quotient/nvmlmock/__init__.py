"""A mock NVIDIA driver library for machines without a GPU: the agent's real NVML path, exercised end to end.

``mock_nvml.c`` (package data) is a ``libnvidia-ml.so.1`` written against NVIDIA's published ``nvml.h``; ``build``
compiles it per driver ``profiles`` entry and caches it; ``state`` writes the file it reads its GPUs from; ``mirror``
writes an emulated node's fake GPUs into that file, so an agent process per emulated node measures them through the
unpatched pynvml.

Why here, in the local composition root, and not under ``agent/``: the agent must not know whether its driver is
real. It reaches the mock exactly as it reaches a driver, through the dynamic loader, and imports nothing from it;
the mock is a tool of the demo, the benchmarks and the tests, like the emulator beside it, and the agent's image
need not carry a C source and a compiler driver.
"""
