"""Formulations: how an op is computed (direct tiling, implicit GEMM, tensor-core GEMM, ...). Each is a
package folder, formulations/<name>/, holding its module (__init__.py: its parameters, constraints,
launch geometry) and the templates only it uses; what several share is in formulations/cores/
(base.py says what a formulation provides and how to add one).

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
from autocnn.kernels.formulations.depthwise import DEPTHWISE
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

# The order of each registry below is part of what is stored: Optuna keeps a trial's "formulation" as
# the index of its choice among the operation's formulations, in registry order. So a new formulation
# is appended to the end of its registry, and none is moved, inserted before another or removed: no
# stored choice index changes meaning and no operation's default moves
# (tests/test_formulation_order.py pins the order).
REGISTRY: tuple[Formulation, ...] = (DIRECT, IGEMM, GATHER, ROWS, TENSOR_CORE, UNROLLED, WINOGRAD, FFT, WINDOW_GATHER,
                                     CIRCULAR, CIRCULAR_BWD, WGMMA, HALO, TC_ROWS, WINOGRAD_FUSED, TMA, DEPTHWISE)

# conv_pool_fwd's (igemm_pool, direct_pool) and conv_pool_dz's (act_gather).
CONV_POOL: tuple[Formulation, ...] = (IGEMM_POOL, DIRECT_POOL, ACT_GATHER)

# The separable convolutions': sep_conv_fwd's and sep_conv_bwd_data's (the seed's register-based,
# one-pass and two-pass kernels) and sep_conv_wgrad's (sep_tiles).
SEPARABLE: tuple[Formulation, ...] = (SEP_REGISTER, SEP_ONEPASS, SEP_TWOPASS, SEP_TILES)
