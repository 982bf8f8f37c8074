"""The order of the formulation registries (formulations/__init__.py) is pinned.

An operation's "formulation" parameter offers the formulations of its registry that serve it, in
the registry's order, and Optuna stores a trial's choice as an index into those choices: reordering
a registry, inserting into it or removing from it would give every stored study and record of the
operation another formulation than the one it measured. A new formulation is appended; then append
its name here too, to the registry and to each operation it serves. Any other change of these
tuples is the mistake this test is for.
"""
from __future__ import annotations

from autocnn.kernels.formulations import CONV_POOL, REGISTRY, SEPARABLE
from autocnn.kernels.registry import OPERATIONS

REGISTRIES = {
    "REGISTRY": ("direct", "igemm", "gather", "rows", "tc", "unrolled", "winograd", "fft", "window_gather",
                 "circular", "circular_bwd", "wgmma", "halo", "tc_rows", "winograd_fused", "tma", "depthwise"),
    "CONV_POOL": ("igemm_pool", "direct_pool", "act_gather"),
    "SEPARABLE": ("sep_register", "sep_onepass", "sep_twopass", "sep_tiles"),
}

CHOICES = {
    "conv_fwd": ("direct", "igemm", "tc", "unrolled", "winograd", "fft", "circular", "wgmma", "halo",
                 "winograd_fused", "depthwise"),
    "conv_bwd_data": ("direct", "igemm", "gather", "tc", "unrolled", "winograd", "fft", "wgmma", "halo",
                      "winograd_fused", "tma", "depthwise"),
    "conv_wgrad": ("atomic", "two_pass", "rows", "tc", "unrolled", "winograd", "fft", "wgmma", "tc_rows", "depthwise"),
    "avgpool_fwd": ("window_gather",),
    "avgpool_bwd": ("window_gather",),
    "conv_bwd_fused": ("circular_bwd",),
    "conv_pool_fwd": ("igemm_pool", "direct_pool"),
    "conv_pool_dz": ("act_gather",),
    "sep_conv_fwd": ("sep_register", "sep_onepass", "sep_twopass"),
    "sep_conv_bwd_data": ("sep_register", "sep_onepass", "sep_twopass"),
    "sep_conv_wgrad": ("sep_tiles",),
}


def test_the_registries_keep_their_order():
    registries = {"REGISTRY": REGISTRY, "CONV_POOL": CONV_POOL, "SEPARABLE": SEPARABLE}
    assert {name: tuple(f.name for f in r) for name, r in registries.items()} == REGISTRIES


def test_each_operation_keeps_its_formulation_choices_in_order():
    assert {name: op.formulation_names for name, op in OPERATIONS.items()} == CHOICES
