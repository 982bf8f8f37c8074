"""Formulations: how an op is computed (direct tiling, implicit GEMM, tensor-core GEMM, ...), each
with its parameters, constraints, launch geometry and templates beside it (base.py says what a
formulation provides and how to add one).

REGISTRY is the one place formulations are offered: each operation composes the ones that serve
it, in this order (the order of its "formulation" parameter's choices).
"""
from autocnn.kernels.formulations.base import Formulation, OpFormulation  # noqa: F401
from autocnn.kernels.formulations.circular import CIRCULAR
from autocnn.kernels.formulations.circular_bwd import CIRCULAR_BWD
from autocnn.kernels.formulations.direct import DIRECT
from autocnn.kernels.formulations.fft import FFT
from autocnn.kernels.formulations.gather import GATHER
from autocnn.kernels.formulations.halo import HALO
from autocnn.kernels.formulations.igemm import IGEMM
from autocnn.kernels.formulations.rows import ROWS
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
