"""The views of a capture, drawn with pyqtgraph: heatmap, Grad-CAM, histogram, statistics,
saliency and gradient flow; the timeline, the comparison and the model graph. A view only
draws the arrays the engine computes (``gradexplorer.analysis``, ``gradexplorer.recording``,
``gradexplorer.model_graph``); it never imports the window.

Modules
-------
capture_views
    ``CaptureViews``: every view of one capture, a selector bar and the flow chart.
view_context
    What every view of a capture looks at: the capture, the batch, the selection.
heatmap_view
    One sample's gradient, activation or gradient × activation at a layer.
gradcam_view
    Grad-CAM of a layer over the sample's picture.
histogram_view
    Histogram of a tensor, from the capture's statistics.
stats_table
    Every tensor's statistics of a layer and call, exportable as CSV.
saliency_view
    Input-gradient saliency next to the input.
flow_view
    Gradient flow: a bar per layer on a log scale.
timeline_view
    A watch log or a dataset capture over steps: layers × steps.
compare_view
    Where two captures diverge: table and A | B | A−B heatmaps.
graph_view
    The model graph: pannable, zoomable, coloured by gradients.
color_bar
    The graph view's colour bar.
graph_picture
    PNG pictures of the model graph, drawn by Qt's SVG renderer.
plot_style
    How the plots look: colour maps, image plots, log axes, flag colours.
export
    Writing PNG plots and CSV statistics.
"""

__all__ = [
    "capture_views", "view_context", "heatmap_view", "gradcam_view", "histogram_view", "stats_table",
    "saliency_view", "flow_view", "timeline_view", "compare_view", "graph_view", "color_bar", "graph_picture",
    "plot_style", "export",
]
