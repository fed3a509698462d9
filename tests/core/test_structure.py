"""The module tree kept between captures (core/gradexplorer/capturing/structure.py): what it answers is
what walking the live tree answers, after every kind of change to the tree."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.selection import is_leaf, resolve_layers
from gradexplorer.capturing.structure import structure_of


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 3)), nn.Tanh())


def _agrees(model: nn.Module) -> None:
    """Everything the structure answers, against a fresh walk of the tree."""
    s = structure_of(model)
    named = list(model.named_modules())
    assert s.named_modules() == named
    assert list(s.names) == [n for n, _ in named] and len(s) == len(named)
    assert [s.children_of(n) for n, _ in named] == [not is_leaf(m) for _, m in named]
    assert all(s.module(n) is m for n, m in named)
    assert s.selected(None) == resolve_layers(model, None)
    assert s.of_type(nn.Linear) == [(n, m) for n, m in named if n and isinstance(m, nn.Linear)]


def test_the_structure_is_kept_while_the_tree_stays_and_answers_as_a_walk():
    model = _model()
    first = structure_of(model)
    _agrees(model)
    model(torch.randn(2, 4))  # running the model, training mode, parameters: not the tree
    model.train()
    model[0].weight = nn.Parameter(torch.zeros(4, 4))
    assert structure_of(model) is first
    _agrees(model)


@pytest.mark.parametrize("change", ["replace", "add", "delete", "rename", "nested", "none_child", "shared"])
def test_every_change_to_the_tree_is_seen(change):
    model = _model()
    before = structure_of(model)
    if change == "replace":
        model[1][1] = nn.Linear(4, 3)
    elif change == "add":
        model.append(nn.Sigmoid())
    elif change == "delete":
        del model[1][0]
    elif change == "rename":  # the same modules under other names
        inner = model[1]
        inner._modules = {"act": inner._modules["0"], "out": inner._modules["1"]}
    elif change == "nested":  # a leaf becomes a container
        model[2].add_module("extra", nn.ReLU())
    elif change == "none_child":
        model[1].register_module("gap", None)
    elif change == "shared":  # one module under two names: named_modules lists it once
        model.add_module("again", model[0])
    after = structure_of(model)
    assert after is not before
    _agrees(model)


@pytest.mark.slow
def test_a_replaced_module_freed_cannot_pass_for_the_new_one():
    """A module freed and another made at its address (the same id): the kept structure
    refers to the old one, which no longer exists, and is built anew."""
    model = _model()
    structure_of(model)
    for _ in range(50):
        model[2] = nn.Tanh()
        gc.collect()
        _agrees(model)


def test_the_default_selection_follows_which_parameters_are_trainable_now():
    """The default selection holds the containers that own trainable parameters themselves:
    freezing or unfreezing one between captures changes it, though the tree is the same."""

    class Owner(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(4))
            self.body = nn.Linear(4, 4)

    model = nn.Sequential(Owner(), nn.ReLU())
    s = structure_of(model)
    assert s.selected(None) == resolve_layers(model, None) == ["0", "0.body", "1"]
    model[0].scale.requires_grad_(False)
    assert structure_of(model) is s
    assert s.selected(None) == resolve_layers(model, None) == ["0.body", "1"]
    model[0].scale.requires_grad_(True)
    assert s.selected(None) == ["0", "0.body", "1"]
    assert s.containers() == ["", "0"]


def test_selections_by_name_are_kept_and_predicates_asked_each_time():
    model = _model()
    s = structure_of(model)
    assert s.selected(["0", "1.*"]) == resolve_layers(model, ["0", "1.*"])
    assert s.selected(("0", "1.*")) == ["0", "1.0", "1.1"]
    asked = []
    assert s.selected(lambda n, m: asked.append(n) or isinstance(m, nn.Linear)) == ["0", "1.1"]
    s.selected(lambda n, m: asked.append(n) or isinstance(m, nn.Linear))
    assert len(asked) == 2 * len(s)
    with pytest.raises(GradExplorerError, match="No module is named or matches 'nope'"):
        s.selected("nope")
    got = s.selected(None)
    got.append("tampered")  # a copy: the kept selection is not the caller's list
    assert s.selected(None) == resolve_layers(model, None)


def test_a_kept_structure_keeps_no_model_alive():
    class Back(nn.Module):  # a module that refers to its model
        def __init__(self, owner):
            super().__init__()
            self.__dict__["owner"] = owner

    model = _model()
    model.add_module("back", Back(model))
    structure_of(model)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
