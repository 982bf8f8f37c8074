"""Formulations: how an op is computed (direct tiling, implicit GEMM, tensor-core GEMM, ...), each
with its parameters, constraints, launch geometry and templates beside it (base.py says what a
formulation provides and how to add one).

This is the one place formulations are offered: REGISTRY to the five operations and conv_bwd_fused,
CONV_POOL to the fused convolution and averaging (kernels/conv_pool.py), SEPARABLE to the separable
convolutions (kernels/sep_conv.py). Each operation composes the formulations of its registry that
serve it, in the registry's order (the order of its "formulation" parameter's choices);
kernels/registry.py gives each operation its registry.
"""
from autocnn.kernels.formulations.act_gather import ACT_GATHER
from autocnn.kernels.formulations.base import Formulation, OpFormulation  # noqa: F401
from autocnn.kernels.formulations.circular import CIRCULAR
from autocnn.kernels.formulations.circular_bwd import CIRCULAR_BWD
from autocnn.kernels.formulations.direct import DIRECT
from autocnn.kernels.formulations.direct_pool import DIRECT_POOL
from autocnn.kernels.formulations.fft import FFT
from autocnn.kernels.formulations.gather import GATHER
from autocnn.kernels.formulations.halo import HALO
from autocnn.kernels.formulations.igemm import IGEMM
from autocnn.kernels.formulations.igemm_pool import IGEMM_POOL
from autocnn.kernels.formulations.rows import ROWS
from autocnn.kernels.formulations.sep_onepass import SEP_ONEPASS
from autocnn.kernels.formulations.sep_register import SEP_REGISTER
from autocnn.kernels.formulations.sep_tiles import SEP_TILES
from autocnn.kernels.formulations.sep_twopass import SEP_TWOPASS
from autocnn.kernels.formulations.tc_rows import TC_ROWS
from autocnn.kernels.formulations.tensorcore import TENSOR_CORE
from autocnn.kernels.formulations.tma import TMA
from autocnn.kernels.formulations.unrolled import UNROLLED
from autocnn.kernels.formulations.wgmma import WGMMA
from autocnn.kernels.formulations.window_gather import WINDOW_GATHER
from autocnn.kernels.formulations.winograd import WINOGRAD
from autocnn.kernels.formulations.winograd_fused import WINOGRAD_FUSED

# A formulation registered later comes after the ones before it, so that no operation's default and
# no stored choice index of its "formulation" parameter moves (fft, verified on the GPU in all three
# ops before it was registered, after winograd; its verification is in MEASUREMENTS.md).
# circular (Scherer et al. 2010) comes after the others: today's defaults do not change.
# circular_bwd serves conv_bwd_fused only (kernels/conv_bwd_fused.py), the one-pass backward.
# wgmma (Hopper only, tf32 conv_fwd) comes last for the same reason as circular, and halo (Hopper only)
# after it. tc_rows (conv_wgrad on tensor cores over staged rows) came after them all: no default or
# stored choice index of the operations moved. winograd_fused (conv_fwd and conv_bwd_data, 3x3
# stride 1) after tc_rows for the same reason, and tma (conv_bwd_data, Hopper only) last.
REGISTRY: tuple[Formulation, ...] = (DIRECT, IGEMM, GATHER, ROWS, TENSOR_CORE, UNROLLED, WINOGRAD, FFT, WINDOW_GATHER,
                                     CIRCULAR, CIRCULAR_BWD, WGMMA, HALO, TC_ROWS, WINOGRAD_FUSED, TMA)

# conv_pool_fwd's (igemm_pool, direct_pool) and conv_pool_dz's (act_gather).
CONV_POOL: tuple[Formulation, ...] = (IGEMM_POOL, DIRECT_POOL, ACT_GATHER)

# The separable convolutions': sep_conv_fwd's and sep_conv_bwd_data's (the seed's register-based,
# one-pass and two-pass kernels) and sep_conv_wgrad's (sep_tiles).
SEPARABLE: tuple[Formulation, ...] = (SEP_REGISTER, SEP_ONEPASS, SEP_TWOPASS, SEP_TILES)
