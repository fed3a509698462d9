"""2-D pictures of captured tensors, one sample at a time.

The views draw what this module computes. A per-sample tensor is read by its shape:

* ``(C, H, W)`` conv map: one channel, a grid of the top-k channels, or the channels
  reduced to one map (mean, mean |x|, L2).
* ``(N, C)`` tokens: when ``N`` (or ``N - 1``, a class token first) is a perfect square,
  a ``sqrt(N) x sqrt(N)`` grid per channel, like a conv map (the class token is
  dropped); otherwise the ``N x C`` matrix itself (rows are tokens).
* ``(C,)`` vector: a strip wrapped row by row into a near-square grid, always (so that a
  thousand logits stay readable with a locked aspect); the unused cells are NaN.
* ``(C, T, H, W)`` video: one time step, or the mean over time, then as a conv map.
* A scalar is a 1 x 1 picture; more than four dimensions fold the leading ones into
  channels.

Tiled pictures separate their tiles by 1-pixel NaN lines, which the views draw
transparent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from gradexplorer.analysis.token_grid import aligned_token_grid
from gradexplorer.base.errors import GradExplorerError

#: What a heatmap can show.
TENSOR_KINDS = ("grad_output", "activation", "grad_x_activation")
#: How a heatmap shows channels.
DISPLAYS = ("channel", "topk", "reduce")
#: Channel reductions: mean, mean of absolute values, L2 norm.
REDUCTIONS = ("mean", "mean_abs", "l2")
#: Layout names returned by ``layout_of``.
LAYOUTS = ("scalar", "vector", "matrix", "spatial")


@dataclass(frozen=True)
class Layout:
    """How a per-sample tensor is laid out as pictures.

    Attributes
    ----------
    kind : str
        ``"spatial"`` (channels of 2-D maps: conv, square token grids, video),
        ``"matrix"`` (tokens that do not form a square: shown as N x C), ``"vector"`` or
        ``"scalar"``.
    channels : int
        Number of channels (spatial), values (vector), or columns (matrix).
    height, width : int
        Size of one map (spatial), of the matrix, or of the wrapped vector grid.
    source : str
        ``"conv"``, ``"tokens"``, ``"video"``, ``"folded"`` (more than 4 dimensions),
        or the kind itself.
    class_token : bool
        Tokens whose first one is dropped (a ViT class token).
    time_steps : int
        ``T`` of a video map, else 0.
    """

    kind: str
    channels: int = 1
    height: int = 1
    width: int = 1
    source: str = ""
    class_token: bool = False
    time_steps: int = 0

    @property
    def has_channels(self) -> bool:
        """Whether channel controls (index, top-k, reduce) apply."""
        return self.kind == "spatial"


def _wrap_width(n: int) -> int:
    return max(1, math.ceil(math.sqrt(n)))


def grid_columns(k: int, tile: tuple[int, int], aspect: float) -> int:
    """How many tiles wide a grid of ``k`` tiles of ``tile`` = (height, width) cells best
    fills a plot ``aspect`` times as wide as it is tall (square cells): the most of the
    plot's area covered, fewer columns on a tie. A square grid of 16 tiles in a plot twice
    as wide as tall covers about half of it; 8 × 2 covers all of it.

    Parameters
    ----------
    k : int
    tile : (int, int)
    aspect : float
        Width over height of the plot; not positive or not finite: the square grid.
    """
    k = max(1, int(k))
    if not (aspect > 0 and math.isfinite(aspect)):
        return _wrap_width(k)
    h, w = max(1, tile[0]) + 1, max(1, tile[1]) + 1
    best, best_cover = _wrap_width(k), -1.0
    for cols in range(1, k + 1):
        rows = math.ceil(k / cols)
        grid = (cols * w) / (rows * h)
        cover = min(grid / aspect, aspect / grid) * k / (rows * cols)
        if cover > best_cover + 1e-9:
            best, best_cover = cols, cover
    return best


def layout_of(sample_shape: Sequence[int], input_shape: Sequence[int] | None = None) -> Layout:
    """How a tensor of one sample (no batch dimension) is shown.

    Parameters
    ----------
    sample_shape : sequence of int
        Shape of one sample, e.g. ``(64, 16, 16)`` or ``(197, 768)``.
    input_shape : sequence of int, optional
        The model input's shape (batch first). Tokens ``(T, C)`` fold into a square
        grid only when it lines up with an image input (``gradexplorer.analysis.token_grid``); for a
        sequence input they stay a tokens × channels matrix. Unknown: the plain rule.

    Returns
    -------
    Layout
    """
    shape = tuple(int(s) for s in sample_shape)
    if len(shape) == 0:
        return Layout("scalar", source="scalar")
    if len(shape) == 1:
        n = shape[0]
        w = _wrap_width(n)
        return Layout("vector", channels=n, height=max(1, math.ceil(n / w)), width=w, source="vector")
    if len(shape) == 2:
        n, c = shape
        grid = aligned_token_grid(n, input_shape)
        if grid is not None:
            return Layout("spatial", c, grid.side, grid.side, "tokens", class_token=grid.class_token)
        return Layout("matrix", channels=c, height=n, width=c, source="tokens")
    if len(shape) == 3:
        c, h, w = shape
        return Layout("spatial", c, h, w, "conv")
    if len(shape) == 4:
        c, t, h, w = shape
        return Layout("spatial", c, h, w, "video", time_steps=t)
    c = int(np.prod(shape[:-2]))
    return Layout("spatial", c, shape[-2], shape[-1], "folded")


def describe_layout(shape: Sequence[int], batched: bool = True, input_shape: Sequence[int] | None = None) -> str:
    """One line saying how a captured tensor is shown.

    Parameters
    ----------
    shape : sequence of int
        The tensor's shape, with the batch dimension first unless ``batched`` is False.
    batched : bool
        Whether ``shape[0]`` is the batch.
    input_shape : sequence of int, optional
        The model input's shape, as for ``layout_of``.

    Returns
    -------
    str
        E.g. ``"conv map (B, 64, 16, 16): 64 channels of 16×16"``.
    """
    shape = tuple(int(s) for s in shape)
    sample = shape[1:] if batched and shape else shape
    dims = ", ".join((["B"] if batched else []) + [str(s) for s in sample])
    lay = layout_of(sample, input_shape)
    if lay.kind == "scalar":
        return f"scalar per sample ({dims})"
    if lay.kind == "vector":
        return f"vector ({dims}): {lay.channels} values, wrapped into {lay.height}×{lay.width}"
    if lay.kind == "matrix":
        why = "a sequence" if input_shape is not None and len(input_shape) in (2, 3) else "not a square grid"
        return f"tokens ({dims}): {lay.height} tokens × {lay.channels} channels ({why})"
    grid = f"{lay.height}×{lay.width}"
    if lay.source == "tokens":
        cls = "class token + " if lay.class_token else ""
        return f"tokens ({dims}): {cls}{grid} grid, {lay.channels} channels"
    if lay.source == "video":
        return f"video map ({dims}): {lay.channels} channels × {lay.time_steps} steps of {grid}"
    if lay.source == "folded":
        return f"map ({dims}): leading dimensions folded into {lay.channels} channels of {grid}"
    return f"conv map ({dims}): {lay.channels} channels of {grid}"


def grad_x_activation(activation: torch.Tensor | None, gradient: torch.Tensor | None) -> torch.Tensor | None:
    """Element-wise gradient × activation (the first-order contribution of each value).

    Parameters
    ----------
    activation, gradient : torch.Tensor or None
        Same shape (any; usually one layer's output and its gradient).

    Returns
    -------
    torch.Tensor or None
        float32 product, or ``None`` when either is missing.

    Raises
    ------
    GradExplorerError
        When the shapes differ.
    """
    if activation is None or gradient is None:
        return None
    if tuple(activation.shape) != tuple(gradient.shape):
        raise GradExplorerError(
            f"The gradient has shape {tuple(gradient.shape)} but the activation {tuple(activation.shape)}.",
            "Use the gradient and activation of the same layer and call.",
        )
    return activation.detach().float() * gradient.detach().float()


def _maps(t: torch.Tensor, lay: Layout, time_index: int | None) -> torch.Tensor:
    """``(C, H, W)`` float32 for a spatial layout."""
    t = t.detach().float()
    if lay.source == "tokens":
        if lay.class_token:
            t = t[1:]
        return t.reshape(lay.height, lay.width, lay.channels).permute(2, 0, 1)
    if lay.source == "video":
        if time_index is None:
            return t.mean(dim=1)
        if not 0 <= time_index < lay.time_steps:
            raise GradExplorerError(
                f"Time step {time_index} is out of range (0..{lay.time_steps - 1}).", "Pick a valid time step."
            )
        return t[:, time_index]
    if lay.source == "folded":
        return t.reshape(lay.channels, lay.height, lay.width)
    return t


def _np(maps: torch.Tensor) -> np.ndarray:
    return maps.detach().float().cpu().numpy()


# Reductions run in NumPy, on one thread: on a busy CPU torch's multi-threaded reductions
# wait for a free core, many times longer than the work itself, and a redraw must not pause
# (docs/benchmarks.md, "The window").
def reduce_channels(maps: torch.Tensor, how: str) -> np.ndarray:
    """Reduce ``(C, H, W)`` over channels with ``mean``, ``mean_abs`` or ``l2``: ``(H, W)`` float32."""
    a = _np(maps)
    if how == "mean":
        out = a.mean(axis=0, dtype=np.float64)
    elif how == "mean_abs":
        out = np.abs(a).mean(axis=0, dtype=np.float64)
    elif how == "l2":
        out = np.sqrt(np.einsum("chw,chw->hw", a, a, dtype=np.float64))
    else:
        raise GradExplorerError(f"Unknown channel reduction '{how}'.", f"Use one of {', '.join(REDUCTIONS)}.")
    return out.astype(np.float32)


def _norms(maps: torch.Tensor) -> np.ndarray:
    a = _np(maps).reshape(maps.shape[0], -1)
    return np.sqrt(np.einsum("ci,ci->c", a, a, dtype=np.float64))


def channel_norms(tensor_sample: torch.Tensor, time_index: int | None = None) -> np.ndarray:
    """L2 norm of every channel of a spatial per-sample tensor, ``(C,)`` float64."""
    lay = layout_of(tensor_sample.shape)
    if not lay.has_channels:
        raise GradExplorerError(
            f"A tensor of shape {tuple(tensor_sample.shape)} has no channels to rank.", "Use a spatial layer."
        )
    return _norms(_maps(tensor_sample, lay, time_index))


@dataclass
class Heatmap:
    """A 2-D picture of one sample's tensor.

    Attributes
    ----------
    array : numpy.ndarray
        ``(rows, cols)`` float32, row-major; NaN where there is nothing (tile separators,
        the end of a wrapped vector).
    layout : Layout
    display : str
        ``"channel"``, ``"topk"``, ``"reduce"``, or ``"all"`` (vector, matrix, scalar).
    channels : list of int
        Channel shown in each tile, in tile order (row-major); one entry for a single
        channel, empty for a reduction or a whole tensor.
    tile_rows, tile_cols : int
        Grid of tiles (1 x 1 unless top-k).
    tile_height, tile_width : int
        Size of one tile, without its separator.
    """

    array: np.ndarray
    layout: Layout
    display: str
    channels: list[int] = field(default_factory=list)
    tile_rows: int = 1
    tile_cols: int = 1
    tile_height: int = 0
    tile_width: int = 0

    def locate(self, row: int, col: int) -> tuple[int | None, int, int, int | None] | None:
        """What is at pixel ``(row, col)`` of ``array``.

        Returns
        -------
        tuple or None
            ``(channel, row_in_tile, col_in_tile, flat_index)``: channel is None for
            reductions and non-spatial layouts; ``flat_index`` is the value's index in a
            vector, None otherwise. ``None`` outside the picture or on a separator.
        """
        rows, cols = self.array.shape
        if not (0 <= row < rows and 0 <= col < cols):
            return None
        if self.display == "topk":
            tr, r = divmod(row, self.tile_height + 1)
            tc, c = divmod(col, self.tile_width + 1)
            if r == self.tile_height or c == self.tile_width:
                return None
            i = tr * self.tile_cols + tc
            if i >= len(self.channels):
                return None
            return self.channels[i], r, c, None
        if self.layout.kind == "vector":
            flat = row * self.layout.width + col
            return (None, row, col, flat) if flat < self.layout.channels else None
        channel = self.channels[0] if self.display == "channel" and self.channels else None
        return channel, row, col, None


def _tile(arr: np.ndarray, cols: int) -> np.ndarray:
    k, h, w = arr.shape
    rows = math.ceil(k / cols)
    out = np.full((rows * (h + 1) - 1, cols * (w + 1) - 1), np.nan, dtype=np.float32)
    for i in range(k):
        r, c = divmod(i, cols)
        out[r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = arr[i]
    return out


def _numpy2d(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().cpu().numpy(), dtype=np.float32)


def heatmap(
    tensor_sample: torch.Tensor,
    display: str = "channel",
    *,
    channel: int = 0,
    k: int = 16,
    reduce: str = "mean",
    rank_by: torch.Tensor | None = None,
    time_index: int | None = None,
    input_shape: Sequence[int] | None = None,
    columns: int | None = None,
) -> Heatmap:
    """A 2-D picture of one sample's activation, gradient or gradient × activation.

    Parameters
    ----------
    tensor_sample : torch.Tensor
        One sample (no batch dimension); see the module docstring for the layouts.
    display : {"channel", "topk", "reduce"}
        One channel, a grid of the ``k`` channels with the largest ranking norm, or the
        channels reduced to one map. Ignored (the whole tensor is shown) for vectors,
        N x C matrices and scalars.
    channel : int
        The channel for ``display="channel"``.
    k : int
        How many channels the top-k grid shows (capped at the channel count). The grid
        is ``ceil(sqrt(k))`` tiles wide, largest first, row by row.
    reduce : {"mean", "mean_abs", "l2"}
        The reduction for ``display="reduce"``.
    rank_by : torch.Tensor, optional
        Same shape as ``tensor_sample``; the top-k channels are those with the largest L2
        norm of this tensor (the views pass the gradient). Defaults to the tensor itself.
    time_index : int, optional
        For video maps ``(C, T, H, W)``: the time step; ``None`` averages over time.
    input_shape : sequence of int, optional
        The model input's shape, as for ``layout_of``.
    columns : int, optional
        How many tiles wide the top-k grid is (a view fits it to its plot's shape:
        ``grid_columns``); default ``ceil(sqrt(k))``.

    Returns
    -------
    Heatmap

    Raises
    ------
    GradExplorerError
        For an unknown display or reduction, a channel or time step out of range, or a
        ``rank_by`` of another shape.
    """
    if display not in DISPLAYS:
        raise GradExplorerError(f"Unknown heatmap display '{display}'.", f"Use one of {', '.join(DISPLAYS)}.")
    t = tensor_sample.detach()
    if t.is_complex():
        t = t.abs()
    lay = layout_of(t.shape, input_shape)
    if lay.kind == "scalar":
        return Heatmap(_numpy2d(t.reshape(1, 1)), lay, "all", tile_height=1, tile_width=1)
    if lay.kind == "vector":
        flat = t.float().reshape(-1)
        padded = torch.full((lay.height * lay.width,), float("nan"))
        padded[: flat.numel()] = flat
        return Heatmap(_numpy2d(padded.reshape(lay.height, lay.width)), lay, "all",
                       tile_height=lay.height, tile_width=lay.width)
    if lay.kind == "matrix":
        return Heatmap(_numpy2d(t), lay, "all", tile_height=lay.height, tile_width=lay.width)

    maps = _maps(t, lay, time_index)
    if display == "channel":
        if not 0 <= channel < lay.channels:
            raise GradExplorerError(
                f"Channel {channel} is out of range: this tensor has {lay.channels} channels.",
                f"Pick a channel from 0 to {lay.channels - 1}.",
            )
        return Heatmap(_numpy2d(maps[channel]), lay, "channel", [channel],
                       tile_height=lay.height, tile_width=lay.width)
    if display == "reduce":
        return Heatmap(np.ascontiguousarray(reduce_channels(maps, reduce)), lay, "reduce",
                       tile_height=lay.height, tile_width=lay.width)

    if rank_by is None:
        rank_maps = maps
    else:
        if tuple(rank_by.shape) != tuple(t.shape):
            raise GradExplorerError(
                f"Cannot rank channels by a tensor of shape {tuple(rank_by.shape)} for one of {tuple(t.shape)}.",
                "Rank by the gradient of the same layer, call and sample.",
            )
        rank_maps = _maps(rank_by, lay, time_index)
    k = max(1, min(int(k), lay.channels))
    # NaN norms would sort unpredictably; they rank last. Stable sort: ties keep channel order.
    norms = np.nan_to_num(_norms(rank_maps), nan=-1.0)
    idx = np.argsort(-norms, kind="stable")[:k]
    cols = min(k, max(1, int(columns))) if columns else _wrap_width(k)
    tiled = _tile(_np(maps)[idx], cols)
    return Heatmap(tiled, lay, "topk", [int(i) for i in idx], math.ceil(k / cols), cols, lay.height, lay.width)


def is_signed(arr: np.ndarray | torch.Tensor) -> bool:
    """Whether any finite value is negative (then a diverging colour map is right)."""
    a = np.asarray(arr.detach().float().cpu() if isinstance(arr, torch.Tensor) else arr, dtype=np.float64)
    finite = a[np.isfinite(a)]
    return bool(finite.size) and bool(finite.min() < 0)


def symmetric_levels(arr: np.ndarray | torch.Tensor, signed: bool | None = None) -> tuple[float, float]:
    """Colour levels for a picture.

    Parameters
    ----------
    arr : array
        Any shape; NaN and Inf are ignored.
    signed : bool, optional
        Force symmetric (True) or ``(0, max)`` (False) levels; by default symmetric when
        any value is negative (``is_signed``).

    Returns
    -------
    (float, float)
        ``(-m, m)`` with ``m`` the largest finite magnitude for signed data, ``(0, max)``
        otherwise (``(min, max)`` if the minimum is above zero is not used, so that
        colour always means the same distance from zero). Never an empty range: all-zero
        or all-NaN data get ``(-1, 1)`` or ``(0, 1)``.
    """
    a = np.asarray(arr.detach().float().cpu() if isinstance(arr, torch.Tensor) else arr, dtype=np.float64)
    finite = a[np.isfinite(a)]
    if signed is None:
        signed = bool(finite.size) and bool(finite.min() < 0)
    if signed:
        m = float(np.abs(finite).max()) if finite.size else 0.0
        return (-m, m) if m > 0 else (-1.0, 1.0)
    hi = float(finite.max()) if finite.size else 0.0
    return (0.0, hi) if hi > 0 else (0.0, 1.0)


def display_image(input_sample: torch.Tensor) -> np.ndarray | None:
    """A picture of a preprocessed input, for overlays: ``(H, W, 3)`` uint8 or None.

    Each channel is min-max scaled on its own, which inverts a per-channel normalisation
    exactly when each channel of the original spans its full range (nearly so for
    photos). ``(3, H, W)`` is RGB, ``(1, H, W)`` or ``(H, W)`` grey; any other channel
    count shows the first three channels (or the first one). Not an image: None.
    """
    t = input_sample.detach().float().cpu()
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.dim() != 3 or t.shape[1] < 2 or t.shape[2] < 2:
        return None
    t = t[:3] if t.shape[0] >= 3 else t[:1]
    t = torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)
    lo = t.amin(dim=(1, 2), keepdim=True)
    span = t.amax(dim=(1, 2), keepdim=True) - lo
    t = torch.where(span > 0, (t - lo) / span.clamp_min(1e-12), torch.zeros_like(t))
    if t.shape[0] == 1:
        t = t.expand(3, -1, -1)
    return np.ascontiguousarray((t.permute(1, 2, 0).numpy() * 255.0).round().clip(0, 255).astype(np.uint8))


def saliency_map(input_grad_sample: torch.Tensor) -> np.ndarray:
    """Input-gradient saliency of one sample: ``|grad|``, max over channels.

    Parameters
    ----------
    input_grad_sample : torch.Tensor
        Gradient with respect to one input sample: ``(C, H, W)`` images give
        ``(H, W)``; a 2-D gradient (a grey picture, or tokens) is shown whole; other
        shapes as ``heatmap`` shows them, in absolute value.

    Returns
    -------
    numpy.ndarray
        2-D float32, non-negative (NaN where there is no value).
    """
    g = input_grad_sample.detach().float()
    if g.dim() == 3:
        return _numpy2d(g.abs().amax(dim=0))
    if g.dim() == 2:
        return _numpy2d(g.abs())
    hm = heatmap(g.abs(), "reduce", reduce="mean_abs") if layout_of(g.shape).has_channels else heatmap(g.abs())
    return hm.array
