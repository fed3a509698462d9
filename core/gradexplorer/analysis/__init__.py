"""What the views show, computed as arrays from a capture: heatmaps, Grad-CAM, saliency,
gradient flow.

Modules
-------
heatmaps
    2-D pictures of captured tensors, one sample at a time.
gradcam
    Grad-CAM heatmaps and overlays.
saliency
    Saliency of a sequence input, per token.
gradient_flow
    One number per captured layer in forward order, and the layers to worry about.
token_grid
    When a sequence of tokens is a square picture of patches.
class_names
    Class names and top predicted classes.
capture_summary
    What is derived from a capture once: layer flags, norms, the layer the views open on.
"""

__all__ = ["heatmaps", "gradcam", "saliency", "gradient_flow", "token_grid", "class_names", "capture_summary"]
