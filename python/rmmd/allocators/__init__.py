"""Allocators that make a framework take its memory from rmmd, one module per
framework, each imported only when asked for (the package works where a
framework is absent):

- :mod:`rmmd.allocators.torch`: PyTorch (a ``torch.cuda.MemPool`` over rmmd,
  or rmmd as the whole process's allocator);
- :mod:`rmmd.allocators.cupy`: CuPy (``cupy.cuda.set_allocator``).
"""
