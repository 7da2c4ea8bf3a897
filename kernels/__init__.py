"""Triton kernels, each with a plain-torch reference. Filled by the kernel work."""
