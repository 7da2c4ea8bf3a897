"""Autoregressive image generation: spatial 2-D drafting and relaxed acceptance. Filled by the image issue."""
