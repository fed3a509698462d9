"""The procedural shapes: reproducible from a seed, masks exactly the painted pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradexplorer.models import shape_pictures as shapes


def test_same_seed_gives_same_pixels_label_and_mask():
    a_image, a_label, a_mask = shapes.draw_sample(123)
    b_image, b_label, b_mask = shapes.draw_sample(np.random.default_rng(123))
    assert np.array_equal(np.asarray(a_image), np.asarray(b_image))
    assert a_label == b_label
    assert np.array_equal(a_mask, b_mask)


def test_different_seeds_give_different_pictures():
    pictures = [np.asarray(shapes.draw_sample(seed)[0]) for seed in range(5)]
    for i in range(5):
        for j in range(i + 1, 5):
            assert not np.array_equal(pictures[i], pictures[j])


@pytest.mark.parametrize("label", range(len(shapes.SHAPE_CLASSES)))
def test_mask_is_exactly_the_pixels_painted_with_the_shape_colour(label):
    for seed in range(10):
        image, got_label, mask = shapes.draw_sample(seed, label=label)
        pixels = np.asarray(image)
        assert got_label == label
        assert image.mode == "RGB" and image.size == (64, 64)
        assert mask.dtype == bool and mask.shape == (64, 64)
        inside = pixels[mask]
        colour = inside[0]
        assert (inside == colour).all(), "a masked pixel was not painted with the shape colour"
        # The shape's border pixels must not share its colour, or the mask would be too small.
        grown = mask.copy()
        grown[1:] |= mask[:-1]
        grown[:-1] |= mask[1:]
        grown[:, 1:] |= mask[:, :-1]
        grown[:, :-1] |= mask[:, 1:]
        ring = grown & ~mask
        assert (pixels[ring] != colour).any(axis=1).mean() > 0.9


def test_shape_is_fully_inside_and_sized_25_to_45_percent():
    for seed in range(60):
        _, _, mask = shapes.draw_sample(seed)
        assert not (mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any())
        rows = np.flatnonzero(mask.any(axis=1))
        cols = np.flatnonzero(mask.any(axis=0))
        extent = max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1
        # Extent of the shape is at most its circumscribed diameter (45% of 64 px, plus rounding);
        # the narrowest class (a triangle) still spans 75% of its smallest diameter (16 px).
        assert 10 <= extent <= 31


def test_shapes_are_placed_all_over_not_only_in_the_centre():
    centres = []
    for seed in range(200):
        _, _, mask = shapes.draw_sample(seed)
        ys, xs = np.nonzero(mask)
        centres.append((ys.mean(), xs.mean()))
    centres = np.array(centres)
    offsets = np.abs(centres - 31.5)
    assert (offsets.max(axis=1) > 10).mean() > 0.3
    assert centres.min() < 20 and centres.max() > 44


def test_every_class_is_drawn_and_forced_labels_are_checked():
    labels = {shapes.draw_sample(seed)[1] for seed in range(100)}
    assert labels == set(range(len(shapes.SHAPE_CLASSES)))
    with pytest.raises(ValueError):
        shapes.draw_sample(0, label=len(shapes.SHAPE_CLASSES))


def test_other_sizes_work():
    image, _, mask = shapes.draw_sample(5, size=96)
    assert image.size == (96, 96) and mask.shape == (96, 96) and mask.any()


def test_make_dataset_is_deterministic_and_matches_draw_sample():
    images, labels, masks = shapes.make_dataset(20, seed=9)
    assert images.shape == (20, 3, 64, 64) and images.dtype == torch.float32
    assert labels.shape == (20,) and labels.dtype == torch.int64
    assert masks.shape == (20, 64, 64) and masks.dtype == torch.bool
    assert images.min() >= 0.0 and images.max() <= 1.0
    again = shapes.make_dataset(20, seed=9)
    assert torch.equal(images, again[0]) and torch.equal(labels, again[1]) and torch.equal(masks, again[2])

    rng = np.random.default_rng(9)
    for i in range(3):
        image, label, mask = shapes.draw_sample(rng)
        assert torch.equal(images[i], shapes.to_tensor(image))
        assert labels[i].item() == label
        assert np.array_equal(masks[i].numpy(), mask)


def test_normalisation_constants_match_the_data():
    images, _, _ = shapes.make_dataset(300, seed=31)
    mean = images.mean(dim=(0, 2, 3))
    std = images.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1)
    assert torch.allclose(mean, torch.tensor(shapes.MEAN), atol=0.03)
    assert torch.allclose(std, torch.tensor(shapes.STD), atol=0.03)
    normalised = shapes.normalize(images)
    assert normalised.shape == images.shape
    assert torch.allclose(normalised * torch.tensor(shapes.STD).view(3, 1, 1)
                          + torch.tensor(shapes.MEAN).view(3, 1, 1), images, atol=1e-6)
