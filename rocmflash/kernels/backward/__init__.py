"""The backward: the ``@jit`` kernels (``kernel``: preprocess, dK/dV and dQ) and their host side (``host``:
launch, per-arch default config, head-dim splits, the attention-sink gradient).
"""
