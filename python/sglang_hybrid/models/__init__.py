"""Plain-torch reference models, registered for the CPU device only.

On GPU/ROCm the fork serves upstream SGLang's own model classes; these
references run where upstream's classes cannot (CPU CI) and are the numerical
oracles for our GPU kernels.
"""
