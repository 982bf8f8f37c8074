"""fft: convolution in the frequency domain, for filters of 25 taps or more, all three ops.

Each op is one circular correlation or convolution of zero-padded planes of size FH x FW (at least
the padded input, so nothing wraps around), summed over a channel:

    conv_fwd       Y[n,k]  = corr(X[n,c] placed at (pt, pl), W[k,c]) summed over c, sampled at stride
    conv_bwd_data  dX[n,c] = conv(dY[n,k] spread at stride (zeros between), W[k,c]) summed over k,
                   read from (pt, pl)
    conv_wgrad     dW[k,c] = corr(X[n,c] placed at (pt, pl), dY[n,k] spread at stride) summed over n,
                   its first R x S; db by conv_bias_grad

Steps: generated kernels place the planes (fft_place_a, fft_place_b), cuFFT transforms them (R2C
library steps), a generated, tuned complex multiply-accumulate kernel sums the products over the
channel in the frequency domain (fft_mac), cuFFT
transforms back (C2R), and fft_crop scales, crops, samples the stride and applies bias and
activation. Images go in blocks of IMGS (the workspaces hold one block; conv_wgrad accumulates the
blocks' spectra; WS_SHARE lets conv_fwd's and conv_bwd_data's buffers whose lives do not overlap share
memory, so that a block holds more images). FFT_SIZE picks FH, FW: the smallest sizes with prime factors 2, 3, 5, 7
("smooth") or powers of two, for whole planes; FFT_TILE (below) cuts large images into FFT tiles.

The multiply-accumulate is, per frequency, a small complex matrix product. MAC "thread" gives each
thread one frequency and IT x JT outputs, its operands read from L2: four to eight products per
value loaded, and every block of outputs reads the operands again, so L2 traffic bounds it. MAC
"block" (sm_80 and later) stages [BL terms x rows x FB frequencies] tiles of both operands in shared
memory with cp.async (two stages) for a block of BI x BJ outputs at FB frequencies: each value
loaded from L2 serves BI or BJ outputs instead of IT or JT. MAC "mma" stages the same runs and forms
each frequency's products on the tensor cores (mma.sync.m16n8k8 on TF32 operands; a warp takes one
frequency and 16*IT x 8*JT outputs): 3xTF32 for fp32 problems, which keeps the FP32 bound (with
MAC_CROSS=1 the two cross products of each real product as one BF16 mma, tc's CROSS), and one
TF32 mma a product for tf32 ones (mma_block, mma_smem_bytes). Both tiled ones stage with one address
a thread a stage, each copy an immediate offset from it (stage_runs), and MAC_ORDER chooses which
blocks run together: each tile of O across the frequency groups, or the tiles of one group side by
side, so that tiles sharing an operand's tile find it in L2.

MAC "cublas" hands the products to cuBLAS's strided-batched complex GEMM (operation.LibraryComplexGemm),
one matrix product a frequency: FP32 for fp32 problems, CUBLAS_COMPUTE_32F_FAST_TF32 for tf32 ones.
cuBLAS needs unit stride along one dimension of each matrix, which spectra stored plane after plane
do not have, so with it every spectrum is stored frequency-major, [frequency][plane] (mac_gemm gives
each op's matrices in that layout). The direct transforms stage a block's DFT_PLANES spectra in
shared memory and store them a frequency at a time (store_frequency_major), the factorised inverse
reads a frequency's planes together, and cuFFT's steps use its strided layouts. Measured on an H200
(11x11, 64 -> 64 channels, 32 x 32, batch 128; 924 frequencies of 128 x 64 x 64): the FP32 GEMMs take
98 us where the generated "block" took 146 and "mma" 112, TF32 46 us; the staged stores cost the
direct transforms 10-15% (stored as computed, one plane's values planes apart, they had doubled), and
cuFFT's strided transforms run about 3x slower than its packed ones. The tuner weighs it per shape.

Each operand's spectra come from placed planes and cuFFT's R2C (XFORM_A / XFORM_B "cufft"), or
from a direct transform (fft_dft_a / fft_dft_b, "dft"): two small matrix products per plane in
shared memory with tabulated twiddles, over only the rows and columns that hold data, reading the
source once. It wins for filters (an 11x11 filter in a 42x42 plane: 31 us against 75 for 4,096
planes on an H100) and loses for images (shared-memory loads bound it), so it is a choice per operand.
DFT_FLAT_A / DFT_FLAT_B (with "dft"): that transform takes a block's planes one at a time, and for
the small sources of a filter's phases (scherer10_l2's backward-data: 4,096 sub-filters of 4 x 4 in
70 x 70 planes, 82 MB of spectra) its rows' stage is a few threads' work and its stores short runs.
A non-zero value is the planes a block takes together (dft_flat): their data loaded at once, their
row spectra a thread an element, then the block's spectra element by element in the order stored,
one run of stores. 0 is the per-plane form. Measured on an H200 there: 33.2 us per plane, 30.2 with
4 planes a block, 33.5 with 16 (256 blocks); the stores ran at 2.7 TB/s, so their pattern was not
all that held the transform back.
"fdft" computes the same spectra with each size split in two factors, FW = W1*W2 and FH = H1*H2 (one
Cooley-Tukey step: small DFTs of W1 points, twiddles, small DFTs of W2 points): W1 + W2 multiply-adds
a point instead of FW, so images too can skip the placed planes and cuFFT's passes over memory.
"radix" is an FFT of the whole plane in one kernel, in place of placing and cuFFT's R2C: mixed-radix
Stockham stages in shared memory (radix_factors: the size's prime factors merged into radices of up
to RADIX_MAX, each a butterfly written out as straight-line code with exact constants), two data rows
as one complex row, the rows' first stage reading the source and the columns' last writing the
spectrum as cuFFT's R2C lays it out. cuFFT moves about 1.3 TB/s over its two passes for every size
from 64 to 96 (batches of 3,840 planes on an H200: 70 x 70 R2C 124.5 us, 72 x 72 122.3, 64 x 64 95.6),
so a plane read once and its spectrum written once is the gain: scherer10_l2's dY (3,840 planes of
70 x 70) 155.6 us placed + R2C, 90.2 with radix on 256 threads a block; fdft, with its twiddles read
from shared memory for every product and 77 KB a block, took 205-307 there. XFORM_O "radix" runs the
same stages the other way, as conj(FFT(conj X)): the columns' first stage reads the spectrum, two kept
rows make one complex row (the imaginary parts at frequencies 0 and FW/2 dropped, as a C2R transform
drops them), and the rows' last stage stores the kept outputs with the crop's epilogue (83.5 us where
C2R + crop took 157.2). Not for conv_wgrad, whose few kept taps the factorised inverse computes alone.
RADIX_THREADS gives the radix kernels their own block size (0: FFT_THREADS).
The way back (XFORM_O): cuFFT's C2R of whole planes and fft_crop, or "fdft", the factorised inverse
(fft_idft) that reads each plane's spectrum once and computes and stores only the outputs the op
keeps (the cropped, stride-sampled rows and columns) with the crop's scale, bias and activation.
conv_wgrad transforms back once, after every block of images, and keeps only dW's R x S taps of each
plane (a sub-filter's with the phases apart): a few percent of the plane, which the inverse's
column and row stages compute alone.

The placing and cropping kernels are copies, judged by bandwidth. Measured on an H200, scherer10_l2's
backward-data placed dY at 52% of the copy rate and cropped dX at 56% (63 and 58.5 us for about
138 MB each) with one element a thread: a thread has one 4-byte load in flight, a full SM (2,048
threads) 8 KB, where about 4 TB/s over a DRAM latency near 0.7 us asks some 20 KB a SM. FFT_VEC=4
gives a thread four consecutive elements of the destination (flat over its planes, so a run may
cross a row or a plane): four loads in flight, 32 KB a full SM, and one float4 store where the run's
address is 16-byte aligned (a placed plane's always; an output's where the block's offset leaves it
so), four scalar stores where not. 1, one element a thread, is what the kernels were first. On the
H200, scherer10_l2's backward-data (60 images in one block): placing 62.1 -> 37.3 us, cropping
57.4 -> 35.0, the plan 563.2 -> 516.5; the tuner decides per shape.

Strides above one in conv_bwd_data and conv_wgrad (STRIDE_PHASES=1): the stride's phases taken apart,
each a stride-1 convolution of planes a stride's factor smaller instead of dY spread at the stride.
Row h of the padded input is phase a = h mod SH, position i = h div SH, and the taps of phase a are
the sub-filter W[a + SH*u] (u < RU = ceil(R / SH)). conv_bwd_data: dX's phase (a, b) is the full
convolution of dY (not spread) with its sub-filter, so O has SH*SW*C planes per image, B K*SH*SW*C
sub-filters. conv_wgrad: the sub-filter (a, b) of dW is the correlation of X's phase (a, b) with dY,
so A has SH*SW*C planes per image and O K*SH*SW*C. The products are as many as with spreading, and
the planes are SH*SW times smaller (the spread planes' spectra repeat SH*SW times over).

FFT tiling (FFT_TILE = F, 16 to 128; 0, whole planes, first). The op's output plane is
cut into tiles of TY x TX outputs, each computed from the window of the input that it reads, placed
in an F x F plane: conv_fwd and conv_wgrad tile Y's (dY's) P x Q positions, TY = (F - R) div SH + 1,
the window (TY - 1)*SH + R rows of X; conv_bwd_data tiles dX, TY = F - R + 1, the window
TY + R - 1 rows of dY spread at the stride. Within a window no product wraps around the plane, so
each tile is exact; tile t of image n is, to the multiply-accumulate, an image of its own (A's plane
(n*TILES + t)*C + c; conv_wgrad sums over images and tiles alike), and the crop (or the factorised
inverse) puts each tile's outputs in place. Images whose whole padded planes exceed MAX_FFT are
served this way only; smaller ones may gain too, from planes of a fast size near the window's (as
cuDNN's FFT_TILING, with 32 x 32 tiles). Every tiled operand is found by Op::load at the plane's
origin, as with the stride's phases apart (which tiling does not combine with).

The direct transforms' twiddles (dft, fdft, the factorised inverse) are computed here in double
precision, rounded once and rendered into the source as tables, never evaluated per block; the
template checks them against its own placement. An operand transformed directly has no placed
planes in its workspace.
"""
from __future__ import annotations

import functools
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto
from autocnn.kernels.formulations.fft.fft_kernels import (DFT_PLANES, RADIX_PLANES, dft_flat_of, dft_smem_bytes,
                                                          dft_tables, factor_tables, fdft_smem_bytes, fdft_tables,
                                                          float2_literals, frequency_major_stage_bytes, idft_planes,
                                                          idft_smem_bytes, idft_tables, mac_block, mac_smem_bytes,
                                                          mma_accumulators, mma_block, mma_lead, mma_smem_bytes,
                                                          radix_butterflies, radix_factors, radix_lead,
                                                          radix_smem_bytes, radix_tables, radix_threads_of,
                                                          split_factor, twiddle, xform_smem_bytes)
from autocnn.kernels.formulations.fft.fft_planes import (SHARED_WITH, FftConv, FftTiles, buffer_name, fft_conv,
                                                         fft_size, fft_tiles, frequency_major, inverse_of, is_phased,
                                                         kept_columns, kept_outputs, kept_rows, mac_gemm, operand_sizes,
                                                         placement, shares_buffers, shares_workspace, smooth_size,
                                                         spectrum, sub_filter, takes_phases, tile_of, whole_planes,
                                                         workspace_elements)
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import arch_number, sixteen_bit_rule, smem_rule, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch, LibraryComplexGemm, LibraryFft

NAME = "fft"
MIN_TAPS = 25
MAX_FFT = 256
IMGS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
THREADS = (64, 128, 256)
TILE = (1, 2, 4, 8)   # 8 x 8 outputs: 128 accumulators, four products per value loaded
# "cublas" (last: the code of configs written before it is unchanged): cuBLAS's batched complex GEMM,
# one product a frequency, on frequency-major spectra (mac_gemm).
MAC = ("thread", "block", "mma", "cublas")
GENERATED_MACS = MAC[:3]
FREQS = (4, 8)        # frequencies per block of MAC "block" and "mma": 32- or 64-byte runs per plane
TERMS = (4, 8, 16)    # terms per shared-memory stage of MAC "block" and "mma"
# The order in which the tiled multiply-accumulate's blocks run (the launch's geometry is the same):
# "frequencies", each tile of O across the frequency groups (blockIdx.x the group), the order it was
# first written in (first, so records tuned before the choice existed keep their code); "tiles", the
# tiles of O of one frequency group side by side, so that the tiles that share an operand tile read
# it from DRAM once between them and from L2 after.
MAC_ORDERS = ("frequencies", "tiles")
MIN_BLOCK_ARCH = 80   # cp.async, and mma.sync on TF32 operands
MMA_K = 8             # terms of one mma k-step: "mma" stages whole k-steps
MMA_MAX_IT = 4        # m16 tiles a warp along O's rows
# Accumulators a thread (re and im, 4 floats per mma tile; fp32 also keeps a stage's partial sums
# apart from the total): at most 128; ptxas reports whether the fragments still fit without spills.
MMA_MAX_ACCUMULATORS = 128
# An operand's forward transform: placed planes + cuFFT R2C, computed directly (dft), computed
# directly with each size split into two factors (fdft), or a mixed-radix FFT in one kernel (radix,
# last: the code of configs written before it is unchanged).
XFORMS = ("cufft", "dft", "fdft", "radix")
# The output's inverse transform: cuFFT C2R + fft_crop, the factorised inverse of the kept outputs,
# or the radix stages over the kept rows (radix_ifft; last, as in XFORMS).
XFORMS_O = ("cufft", "fdft", "radix")
# conv_wgrad keeps dW's R x S taps of each plane, a few percent of it, which the factorised inverse
# computes alone: the radix inverse, which computes whole planes, is not offered there.
XFORMS_O_WGRAD = XFORMS_O[:2]
# DFT_FLAT_A / DFT_FLAT_B: planes a block of a direct transform ("dft") takes together, output
# elements flat over them (dft_flat in _fft_dft.cuh.j2); 0, a plane at a time with register tiles
# (DFT_PLANES a block), is the code of configs written before the parameter.
DFT_FLATS = (0, 4, 16)
# RADIX_THREADS: threads a block of the radix transforms, 0 (first) for FFT_THREADS. Their blocks
# hold a plane's buffers (42 KB for 70 x 70) and want more threads than the multiply-accumulate's
# best (scherer10_l2's dY on an H200: 137.3 us with 128 threads, 108.8 with 256; its MAC 154.8 us
# with 128, 172.2 with 256), so they have a count of their own.
RADIX_THREADS = (0, 256, 512)
DEFAULT_WORKSPACE_BYTES = WORKSPACE_LIMIT_BYTES // 4
# Workspace buffers whose lives in a block of images do not overlap, sharing memory (WS_SHARE 1;
# conv_fwd and conv_bwd_data): A's placed planes (placed, then read by the R2C) die before O's
# spectra are written (the products, then read by the C2R), and A's spectra (the R2C, then the
# products) before O's planes (the C2R, then the crop); the next block's placing comes after the
# crop. Each pair is one buffer of the larger size, named by its later member. Fewer bytes a block,
# so more images a block under the workspace limit (scherer10_l2's backward-data: all 60 in 237 MB
# instead of 32); the kernels are the same. 0, no sharing, is what the plans were first.
WS_SHARES = (0, 1)
# Consecutive elements a thread of the placing and cropping kernels (fft_place_a, fft_place_b,
# fft_crop) copies: 1, the kernels as first written (first, so records tuned before the choice
# existed keep their code); 4, four loads in flight a thread and float4 stores (the module's note).
VECS = (1, 4)
# FFT_TILE: 0, whole planes (first: the plans as they were before tiling), or the edge F of square
# FFT tiles (powers of two: cuFFT's fastest sizes; the module's note).
TILES_F = (0, 16, 32, 64, 128)


# The FFT core: _fft.cuh.j2 and the parts it includes (transforms, multiply-accumulates).
CORE_TEMPLATES = ("_fft.cuh.j2", "_fft_place.cuh.j2", "_fft_dft.cuh.j2", "_fft_radix.cuh.j2", "_fft_fdft.cuh.j2",
                  "_fft_mac_parts.cuh.j2", "_fft_mac_block.cuh.j2", "_fft_mac_mma.cuh.j2", "_fft_mac_thread.cuh.j2")


class _Fft(OpFormulation):
    formulation = NAME
    summary = "FFTs (cuFFT or direct) + a generated complex multiply-accumulate over channels, or cuBLAS's"
    ARGS = {"conv_fwd": (("x", "y"), ("fft_af", "fft_bf")), "conv_bwd_data": (("dy", "dx"), ("fft_af", "fft_bf")),
            "conv_wgrad": (("x", "dw"), ("fft_bf", "fft_af"))}

    def __init__(self, op: str):
        self.op = op
        self.templates = (f"fft_{op}.cu.j2", "_fft_glue.cuh.j2", *CORE_TEMPLATES, "_mma_sync.cuh.j2",
                          *(("_bias_grad.cuh.j2",) if op == "conv_wgrad" else ()))

    def params(self, problem: Any) -> list[Param]:
        forms = (fft_conv(problem),) + ((fft_conv(problem, True),) if takes_phases(problem) else ())
        sizes = ("smooth",) if all(fft_size(f, "smooth") == fft_size(f, "pow2") for f in forms) else ("smooth", "pow2")
        phases = [Param("STRIDE_PHASES", (1, 0), "the stride's phases as stride-1 transforms of smaller planes, "
                        "or dY spread at the stride")] if takes_phases(problem) else []
        # XFORM_O: conv_wgrad's came later (its first value, cuFFT, is the code it had before).
        inverse = [Param("XFORM_O", XFORMS_O_WGRAD if self.op == "conv_wgrad" else XFORMS_O,
                         "transform back: cuFFT C2R of whole planes and a crop, or the "
                         "kept outputs alone computed directly (each size split in two factors, or but for conv_wgrad "
                         "by the radix stages)")]
        inverse += [Param("WS_SHARE", WS_SHARES, "workspace buffers whose lives do not overlap share memory (A's "
                          "placed planes with O's spectra, A's spectra with O's planes): more images a block")] \
            if shares_buffers(problem) else []
        vec = [Param("FFT_VEC", VECS, "consecutive elements a thread of the placing and cropping kernels "
                     "(4: four loads in flight and a float4 store where aligned)")]
        tiling = [Param("FFT_TILE", TILES_F, "FFT tiles: the output cut into tiles each transformed in F x F "
                        "planes from the window it reads (0: whole planes)")]
        return [Param("FFT_SIZE", sizes, "FFT planes: smallest 2^a 3^b 5^c 7^d size, or power of two"),
                Param("IMGS", choices_upto(IMGS, next_pow2(problem.N)), "images per block (the workspaces hold one)"),
                Param("FFT_THREADS", THREADS, "threads per block of the generated kernels"),
                Param("MAC", MAC, "multiply-accumulate: a thread per frequency from L2, shared-memory tiles, "
                      "shared-memory tiles on the tensor cores, or cuBLAS's batched complex GEMM (spectra "
                      "stored frequency-major)"),
                # After MAC (a parameter's condition names earlier ones): cuBLAS's GEMM has no outputs a
                # thread of ours. The order of a config's parameters changes no code (Config.key sorts).
                Param("IT", TILE, "multiply-accumulate outputs per thread along its first index",
                      (("MAC", GENERATED_MACS),)),
                Param("JT", TILE, "multiply-accumulate outputs per thread along its second index",
                      (("MAC", GENERATED_MACS),)),
                Param("FB", FREQS, "frequencies per block of the tiled multiply-accumulate",
                      (("MAC", ("block", "mma")),)),
                Param("BL", TERMS, "terms per shared-memory stage of the tiled multiply-accumulate",
                      (("MAC", ("block", "mma")),)),
                Param("MAC_ORDER", MAC_ORDERS, "order of the tiled multiply-accumulate's blocks: each tile of O "
                      "over the frequency groups, or every tile of a frequency group together (operands shared in L2)",
                      (("MAC", ("block", "mma")),)),
                Param("XFORM_A", XFORMS, "transform of the first operand: placed + cuFFT R2C, or computed directly "
                      "(whole, each size split in two factors, or a mixed-radix FFT in one kernel)"),
                Param("XFORM_B", XFORMS, "transform of the second operand: placed + cuFFT R2C, or computed directly "
                      "(whole, each size split in two factors, or a mixed-radix FFT in one kernel)"),
                *[Param(f"DFT_FLAT_{operand}", DFT_FLATS, f"planes a block of operand {operand}'s direct transform "
                        "takes together, its spectra computed and stored flat over them (0: a plane at a time)",
                        ((f"XFORM_{operand}", ("dft",)),)) for operand in ("A", "B")],
                Param("RADIX_THREADS", RADIX_THREADS, "threads a block of the radix transforms (0: FFT_THREADS)"),
                *phases, *inverse, *vec, *tiling,
                # 0 first: the three TF32 mmas a real product, the code of configs written before the parameter
                *([Param("MAC_CROSS", (0, 1), "MAC mma: 3xTF32's cross products as one BF16 mma a real product "
                         "(0: two TF32 mmas)", (("MAC", ("mma",)),))] if problem.precision.tf32x3 else [])]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem
        if p.R * p.S < MIN_TAPS:
            why = f"fft serves filters of {MIN_TAPS} taps or more, not {p.R}x{p.S}"
            return [Constraint(("FFT_SIZE",), lambda s: why)]
        # Rules over the planes also read STRIDE_PHASES where the problem has it (*ph: () or (0|1,)).
        ph_key = ("STRIDE_PHASES",) if takes_phases(p) else ()
        # The plan's form: whole planes (phases apart or not) or FFT tiles of each edge. Rules over
        # the planes read FFT_TILE, and STRIDE_PHASES where the problem has it: keys (tile, *ph).
        @functools.lru_cache(maxsize=None)
        def form(phased, tile):
            return fft_conv(p, phased, tile), operand_sizes(p, phased, tile)

        def conv(keys):
            tile, ph = keys[0], keys[1:]
            return form(bool(ph and ph[0]) and not tile, tile)[0]

        def size(how, *keys):
            fh, fw = fft_size(conv(keys), how)
            return None if max(fh, fw) <= MAX_FFT else \
                f"{fh}x{fw} FFT planes exceed {MAX_FFT}: FFT_TILE cuts the image into tiles of smaller planes"

        whole = fft_conv(p)

        def tiling(tile, how, *ph):
            if not tile:
                return None
            if ph and ph[0]:
                return f"FFT_TILE={tile} tiles dY spread at the stride: only with STRIDE_PHASES=0"
            if how != "smooth":
                return f"FFT_TILE={tile} sets the planes' size itself: only with FFT_SIZE=smooth"
            if tile < max(p.R, p.S) + 1:
                return f"FFT_TILE={tile} planes leave no room for a tile beside the {p.R}x{p.S} filter"
            if fft_tiles(p, tile).count < 2:
                return (f"FFT_TILE={tile}: one tile covers the whole output, as whole planes of "
                        f"{whole.HP}x{whole.WP} do")
            return None

        def block_arch(mac):
            ok = mac in ("thread", "cublas") or arch_number(limits.arch) >= MIN_BLOCK_ARCH
            return None if ok else (f"the tiled multiply-accumulate (MAC={mac}) needs cp.async "
                                    f"(sm_{MIN_BLOCK_ARCH} or later), not {limits.arch}")

        split3 = p.precision.tf32x3

        def mma_shape(mac, threads, it, jt, fb, bl):
            if mac != "mma":
                return None
            if threads % (32 * fb):
                return f"MAC=mma gives each of FB={fb} frequencies whole warps: FFT_THREADS={threads} is not a multiple of {32 * fb}"
            if bl % MMA_K:
                return f"MAC=mma stages whole mma k-steps of {MMA_K} terms: BL={bl} is not a multiple of {MMA_K}"
            if it > MMA_MAX_IT:
                return f"MAC=mma takes at most {MMA_MAX_IT} m16 tiles a warp along the rows, not IT={it}"
            accumulators = mma_accumulators({"IT": it, "JT": jt}, split3)
            if accumulators > MMA_MAX_ACCUMULATORS:
                return (f"MAC=mma with IT={it}, JT={jt} needs {accumulators} accumulators a thread "
                        f"({p.precision}), more than {MMA_MAX_ACCUMULATORS}")
            return None

        def dft_smem(operand):
            def nbytes(how, xform, mac, tile, *ph):
                f, sizes = form(bool(ph and ph[0]) and not tile, tile)
                return xform_smem_bytes(xform, sizes[operand], *fft_size(f, how), mac == "cublas")
            return nbytes

        # The flat transform's own rule, where DFT_FLAT_<operand> applies (XFORM_<operand> "dft"). The
        # per-plane rule above holds for flat configs too: conservative (with MAC "cublas" it counts a
        # stage the flat form does without), never letting through a launch that cannot run.
        def flat_smem(operand):
            def nbytes(how, flat, tile, *ph):
                f, sizes = form(bool(ph and ph[0]) and not tile, tile)
                return dft_smem_bytes(sizes[operand], *fft_size(f, how), flat) if flat else 0
            return nbytes

        def inverse_and_form(keys):   # the values of (XFORM_O, FFT_TILE, *ph_key): XFORM_O and (tile, *ph)
            return keys[0], keys[1:]

        def idft_smem(how, *keys):
            xo, tph = inverse_and_form(keys)
            phased = bool(tph[1:] and tph[1])
            if xo == "radix":
                return radix_smem_bytes(kept_rows(p, phased, tph[0])[2], *fft_size(conv(tph), how))
            if xo != "fdft":
                return 0
            return idft_smem_bytes(kept_columns(p, phased, tph[0])[2], *fft_size(conv(tph), how))

        inverse = smem_rule(limits, ("FFT_SIZE", "XFORM_O", "FFT_TILE", *ph_key), idft_smem)

        s_key = ("WS_SHARE",) if shares_buffers(p) else ()

        def workspace(how, imgs, xa, xb, *keys):   # keys: (*s_key, XFORM_O, FFT_TILE, *ph_key)
            share, keys = (bool(keys[0]), keys[1:]) if s_key else (False, keys)
            xo, tph = inverse_and_form(keys)
            return WORKSPACE_ELEMENT.size * sum(workspace_elements(conv(tph), how, imgs, xa, xb, xo, share).values())

        def something_to_share(share, xa, xo):   # a directly transformed A and O leave no pair
            if share and xa != "cufft" and xo != "cufft":
                return "WS_SHARE=1 shares placed or real planes, and XFORM_A and XFORM_O both compute without them"
            return None

        sharing = [Constraint(("WS_SHARE", "XFORM_A", "XFORM_O"), something_to_share)] if s_key else []

        def something_to_copy(vec, xa, xb, xo):
            if vec > 1 and xa != "cufft" and xb != "cufft" and xo != "cufft":
                return (f"FFT_VEC={vec} sets the elements a thread of the placing and cropping kernels, and with "
                        f"XFORM_A, XFORM_B and XFORM_O all direct the plan has none: only FFT_VEC=1")
            return None

        copies = Constraint(("FFT_VEC", "XFORM_A", "XFORM_B", "XFORM_O"), something_to_copy)

        def radix_threads(threads, *xforms):
            if threads and "radix" not in xforms:
                return (f"RADIX_THREADS={threads} sets the threads of the radix transforms, and none of XFORM_A, "
                        f"XFORM_B, XFORM_O is radix: only RADIX_THREADS=0")
            return None

        def radix_layout(mac, *xforms):   # radix works plane after plane; cuBLAS's spectra are frequency-major
            if mac == "cublas" and "radix" in xforms:
                return ("XFORM radix reads and stores spectra plane after plane, and MAC=cublas's are "
                        "frequency-major: radix only with MAC thread, block or mma")
            return None

        return [Constraint(("FFT_SIZE", "FFT_TILE", *ph_key), size),
                sixteen_bit_rule(p, NAME, "FFT_SIZE", "its transforms, spectra and their products are FP32 (complex "
                                                      "float32 planes)"),
                Constraint(("FFT_TILE", "FFT_SIZE", *ph_key), tiling), Constraint(("MAC",), block_arch),
                Constraint(("MAC", "FFT_THREADS", "IT", "JT", "FB", "BL"), mma_shape),
                smem_rule(limits, ("FFT_SIZE", "XFORM_A", "MAC", "FFT_TILE", *ph_key), dft_smem("A")),
                smem_rule(limits, ("FFT_SIZE", "XFORM_B", "MAC", "FFT_TILE", *ph_key), dft_smem("B")),
                *[smem_rule(limits, ("FFT_SIZE", f"DFT_FLAT_{operand}", "FFT_TILE", *ph_key), flat_smem(operand))
                  for operand in ("A", "B")],
                smem_rule(limits, ("MAC", "FFT_THREADS", "IT", "JT", "FB", "BL"),
                          lambda mac, t, i, j, fb, bl: mac_smem_bytes({"MAC": mac, "FFT_THREADS": t, "IT": i, "JT": j,
                                                                       "FB": fb, "BL": bl})),
                inverse, *sharing, copies, Constraint(("MAC", "XFORM_A", "XFORM_B", "XFORM_O"), radix_layout),
                Constraint(("RADIX_THREADS", "XFORM_A", "XFORM_B", "XFORM_O"), radix_threads),
                workspace_rule(limits.workspace_bytes,
                               ("FFT_SIZE", "IMGS", "XFORM_A", "XFORM_B", *s_key, "XFORM_O", "FFT_TILE", *ph_key),
                               workspace)]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        # Strided ops take their phases apart: the same products over planes SH*SW times smaller.
        phases = {"STRIDE_PHASES": 1} if takes_phases(problem) else {}
        f = fft_conv(problem, bool(phases))
        imgs = choices_upto(IMGS, next_pow2(problem.N))
        fits = [i for i in imgs if WORKSPACE_ELEMENT.size * sum(workspace_elements(f, "smooth", i).values()) <= DEFAULT_WORKSPACE_BYTES]
        inverse = {"XFORM_O": "cufft", **({"WS_SHARE": 0} if shares_buffers(problem) else {})}
        base = {"formulation": NAME, "FFT_SIZE": "smooth", "FFT_THREADS": 128, "XFORM_A": "cufft", "XFORM_B": "cufft",
                **phases, **inverse, "FFT_VEC": 1, "FFT_TILE": 0, "RADIX_THREADS": 0}
        # The filters' spectra (operand B but in conv_wgrad) computed directly: measured faster than
        # placing + cuFFT on an H100. The last runs on any GPU (no cp.async) and in the least workspace.
        filters = {"XFORM_B": "dft", "DFT_FLAT_B": 0} if self.op != "conv_wgrad" else {}
        # MAC_ORDER "tiles": every fft record tuned on both GPUs took it (MEASUREMENTS.md, the fft section).
        if max(fft_size(f, "smooth")) > MAX_FFT:
            # No whole plane serves the image: FFT tiles, the smallest of 32 (cuDNN's FFT_TILING) and up
            # whose outputs are at least about half its plane, dY spread where strided.
            tile = next((t for t in TILES_F if t >= 32 and t >= 2 * max(problem.R, problem.S)), TILES_F[-1])
            base = {**base, **({"STRIDE_PHASES": 0} if phases else {}), "FFT_TILE": tile}
            f = fft_conv(problem, False, tile)
            fits = [i for i in imgs if WORKSPACE_ELEMENT.size * sum(workspace_elements(f, "smooth", i).values()) <= DEFAULT_WORKSPACE_BYTES]
        return [{**base, "IMGS": max(fits, default=1), "IT": 4, "JT": 4, "MAC": "block", "FB": 4, "BL": 8,
                 "MAC_ORDER": "tiles", **filters},
                {**base, "IMGS": max(fits, default=1), "IT": 2, "JT": 2, "MAC": "thread"},
                {**base, "IMGS": 1, "IT": 1, "JT": 1, "MAC": "thread"}]

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        tile = tile_of(config)
        fh, fw = fft_size(fft_conv(problem, is_phased(config), tile), config["FFT_SIZE"])
        tiles = fft_tiles(problem, tile) if tile else None
        return {"fft_tiles": tiles, "fft_loaded": is_phased(config) or bool(tile), "fft_h": fh, "fft_w": fw, "fft_threads": config["FFT_THREADS"],
                # MAC "cublas" has no IT, JT: the constants its source declares (and no kernel reads) say 1.
                "fft_it": config.get("IT", TILE[0]), "fft_jt": config.get("JT", TILE[0]), "bias_grad_threads": config["FFT_THREADS"], "fft_mac": config["MAC"],
                "fft_fb": config.get("FB", 0), "fft_bl": config.get("BL", 0),
                "fft_mac_tiles": config.get("MAC_ORDER") == "tiles", "fft_dft_planes": DFT_PLANES,
                "fft_dft_a": config["XFORM_A"] == "dft", "fft_dft_b": config["XFORM_B"] == "dft",
                "fft_dft_flat_a": dft_flat_of(config, "A"), "fft_dft_flat_b": dft_flat_of(config, "B"),
                "fft_fdft_a": config["XFORM_A"] == "fdft", "fft_fdft_b": config["XFORM_B"] == "fdft",
                "fft_radix_a": config["XFORM_A"] == "radix", "fft_radix_b": config["XFORM_B"] == "radix",
                "fft_radix_w": radix_factors(fw), "fft_radix_h": radix_factors(fh), "fft_radix_planes": RADIX_PLANES,
                "fft_radix_lead": radix_lead(fh), "fft_radix_threads": radix_threads_of(config),
                "fft_radix_rows": kept_rows(problem, is_phased(config), tile),
                "fft_h1": split_factor(fh), "fft_w1": split_factor(fw),
                "fft_split3": problem.precision.tf32x3, "fft_phased": is_phased(config),
                "fft_cross": config.get("MAC_CROSS", 0),
                "fft_fdft_o": inverse_of(config) == "fdft", "fft_vec": config["FFT_VEC"],
                "fft_radix_o": inverse_of(config) == "radix", "fft_kept_o": inverse_of(config) != "cufft",
                "fft_freq_major": frequency_major(config),
                **self._tables(problem, config, fh, fw)}

    @staticmethod
    def _tables(problem: Any, config: Config, fh: int, fw: int) -> dict[str, Any]:
        # The direct transforms' twiddles (dft, fdft, the inverse), computed here in double precision
        # and rendered into the source: a block copies them instead of evaluating each with a
        # double-precision sincospi (the 11x11 inverse, timed alone on an H100: 97.7 -> 86.4 us).
        out: dict[str, Any] = {}
        phased, tile = is_phased(config), tile_of(config)
        sizes, places = operand_sizes(problem, phased, tile), placement(problem, phased, tile)
        for operand in ("A", "B"):
            table = None
            if config[f"XFORM_{operand}"] == "dft":
                values = dft_tables(sizes[operand], places[operand], fh, fw)
                table = {"placement": places[operand], "literals": float2_literals(values),
                         "flat": dft_flat_of(config, operand)}
            out[f"fft_dft_tables_{operand.lower()}"] = table
        if "fdft" in (config["XFORM_A"], config["XFORM_B"]):
            out["fft_fdft_tables"] = float2_literals(fdft_tables(fh, fw))
        if "radix" in (config["XFORM_A"], config["XFORM_B"], inverse_of(config)):
            out.update(fft_radix_tables=float2_literals(radix_tables(fh, fw)),
                       fft_radix_butterflies=radix_butterflies(fh, fw))
        if inverse_of(config) == "fdft":
            kept = kept_columns(problem, phased, tile)
            out.update(fft_idft_planes=idft_planes(fh, fw), fft_idft_columns=kept,
                       fft_idft_tables=float2_literals(idft_tables(kept, fh, fw)))
        return out

    def buffers(self, problem: Any, config: Config) -> Buffers:
        return (), tuple(workspace_elements(fft_conv(problem, is_phased(config), tile_of(config)), config["FFT_SIZE"],
                                            config["IMGS"], config["XFORM_A"], config["XFORM_B"],
                                            inverse_of(config), shares_workspace(config)).items())

    def launches(self, problem: Any, config: Config) -> tuple:
        f, c = fft_conv(problem, is_phased(config), tile_of(config)), config
        fh, fw = fft_size(f, c["FFT_SIZE"])
        threads, real, spec = c["FFT_THREADS"], fh * fw, spectrum(fh, fw)
        (src, dst), (mac_x, mac_y) = self.ARGS[self.op]
        b = min(c["IMGS"], f.N)
        share = shares_workspace(c)

        def kernel(name, count, args, scalars=(), grid_yz=(1, 1)):
            return Launch(name, (cdiv(count, threads), *grid_yz), (threads, 1, 1), 0, args, scalars)

        def copy(name, elements, args, scalars):   # placing and cropping: FFT_VEC elements a thread
            return kernel(name, cdiv(elements, c["FFT_VEC"]), args, scalars)

        def mac(n0, nb):
            # O[i][j]: conv_fwd i = image, j = filter; conv_bwd_data i = image, j = channel;
            # conv_wgrad i = filter, j = channel (the images are the sum, accumulated after the first block).
            # FFT tiles are images to it: the block's images count nb * tiles.
            nb *= f.tiles
            rows, cols = (f.K, f.phases * f.C) if f.op == "conv_wgrad" else (nb, f.out_planes)
            # Only conv_wgrad sums over blocks of images; the others' blocks are separate images, and
            # cuFFT's C2R has meanwhile overwritten the previous block's spectra anyway.
            accumulate = int(f.op == "conv_wgrad" and n0 > 0)
            if c["MAC"] == "cublas":
                return mac_gemm(f, nb, spec, bool(accumulate), problem.precision.tf32)
            if c["MAC"] in ("block", "mma"):
                fb, bi, bj = mac_block(c)
                return Launch("fft_mac", (cdiv(spec, fb), cdiv(rows, bi), cdiv(cols, bj)), (threads, 1, 1),
                              mac_smem_bytes(c), (mac_x, mac_y, "fft_of"), (nb, accumulate))
            return kernel("fft_mac", spec, (mac_x, mac_y, "fft_of"), (nb, accumulate),
                          (cdiv(rows, c["IT"]), cdiv(cols, c["JT"])))

        def transform(kind, src_buf, dst_buf, planes):
            return LibraryFft(kind, src_buf, 0, dst_buf, 0, planes, fh, fw, frequency_major=frequency_major(c))

        sizes = operand_sizes(problem, is_phased(config), tile_of(config))

        def forward(operand, src, n0, nb, planes):
            # The operand's spectra: placed planes transformed by cuFFT, or computed directly.
            low = operand.lower()
            if c[f"XFORM_{operand}"] != "cufft":
                flat = dft_flat_of(c, operand)
                radix = c[f"XFORM_{operand}"] == "radix"
                per_block = RADIX_PLANES if radix else flat or DFT_PLANES
                return [Launch(f"fft_dft_{low}", (cdiv(planes, per_block), 1, 1),
                               (radix_threads_of(c) if radix else threads, 1, 1),
                               xform_smem_bytes(c[f"XFORM_{operand}"], sizes[operand], fh, fw, frequency_major(c),
                                                flat),
                               (src, f"fft_{low}f"),
                               (n0, nb))]
            placed = buffer_name(f"fft_{low}", share)
            return [copy(f"fft_place_{low}", planes * real, (src, placed), (n0, nb)),
                    transform("r2c", placed, f"fft_{low}f", planes)]

        steps: list = []
        if f.op != "conv_wgrad":   # the filters' spectra, once
            steps += forward("B", "w", 0, 1, f.b_planes)
        for n0 in range(0, f.N, b):
            nb = min(b, f.N - n0)
            steps += forward("A", src if f.op != "conv_wgrad" else "x", n0, nb, nb * f.tiles * f.a_planes)
            if f.op == "conv_wgrad":
                steps += forward("B", "dy", n0, nb, nb * f.tiles * f.b_planes)
            steps.append(mac(n0, nb))
            if f.op != "conv_wgrad" and inverse_of(c) == "radix":   # the kept outputs by the radix stages
                steps.append(Launch("fft_idft", (cdiv(nb * f.tiles * f.out_planes, RADIX_PLANES), 1, 1),
                                    (radix_threads_of(c), 1, 1),
                                    radix_smem_bytes(kept_rows(problem, is_phased(c), tile_of(c))[2], fh, fw),
                                    ("fft_of", "bias", dst), (n0, nb)))
            elif f.op != "conv_wgrad" and inverse_of(c) == "fdft":   # the kept outputs, straight from the spectra
                steps.append(Launch("fft_idft", (cdiv(nb * f.tiles * f.out_planes, idft_planes(fh, fw)), 1, 1),
                                    (threads, 1, 1),
                                    idft_smem_bytes(kept_columns(problem, is_phased(c), tile_of(c))[2], fh, fw),
                                    ("fft_of", "bias", dst), (n0, nb)))
            elif f.op != "conv_wgrad":
                planes_o = buffer_name("fft_o", share)
                steps += [transform("c2r", "fft_of", planes_o, nb * f.tiles * f.out_planes),
                          copy("fft_crop", nb * f.out_planes * problem.P * problem.Q if f.op == "conv_fwd"
                               else nb * f.C * problem.H * problem.W, (planes_o, "bias", dst), (n0, nb))]
        if f.op == "conv_wgrad" and inverse_of(c) == "fdft":   # dW's taps alone, once from the summed spectra
            steps.append(Launch("fft_idft", (cdiv(f.out_planes, idft_planes(fh, fw)), 1, 1), (threads, 1, 1),
                                idft_smem_bytes(kept_columns(problem, is_phased(c), tile_of(c))[2], fh, fw),
                                ("fft_of", "bias", dst), (0, 1)))
        elif f.op == "conv_wgrad":
            steps += [transform("c2r", "fft_of", "fft_o", f.out_planes),
                      copy("fft_crop", f.K * f.C * problem.R * problem.S, ("fft_o", "bias", dst), (0, 1))]
        if f.op == "conv_wgrad" and problem.bias:
            steps.append(Launch("conv_bias_grad", (f.K, 1, 1), (threads, 1, 1), 0, ("dy", "db")))
        return tuple(steps)

    def code_helpers(self) -> tuple:
        return (smooth_size, FftConv, FftTiles, fft_tiles, tile_of, whole_planes, takes_phases, sub_filter, fft_conv,
                is_phased, fft_size, spectrum, mac_block,
                mac_smem_bytes, mma_block, mma_lead, mma_smem_bytes, operand_sizes,
                dft_smem_bytes, split_factor, fdft_smem_bytes, radix_factors, radix_threads_of, radix_lead, radix_smem_bytes, kept_outputs, kept_rows,
                radix_tables, radix_butterflies, frequency_major_stage_bytes, xform_smem_bytes, workspace_elements, shares_buffers,
                buffer_name, shares_workspace, SHARED_WITH, frequency_major, mac_gemm,
                inverse_of, kept_columns, idft_planes, idft_smem_bytes, twiddle, float2_literals, factor_tables,
                fdft_tables, idft_tables, placement, dft_tables, self.ARGS)


FFT = Formulation(NAME, tuple(_Fft(op) for op in ("conv_fwd", "conv_bwd_data", "conv_wgrad")))
