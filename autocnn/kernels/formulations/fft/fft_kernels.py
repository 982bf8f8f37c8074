"""The fft formulation's generated kernels, in numbers: the twiddle tables its direct, factorised and
radix transforms and its inverse read (computed here in double precision, rounded once, rendered
into the source), and the shared memory and tiles of those transforms and of the multiply-accumulate
(the formulation is in fft.py, its planes in fft_planes.py).
"""
from __future__ import annotations

import functools
import math
import struct

from autocnn.kernels.formulations.fft.fft_planes import spectrum
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.space import Config

DFT_PLANES = 4        # planes a block of the direct transform computes (they share its twiddle tables)
# XFORM "radix": planes a block transforms one after another (two: a block's tables copied half as
# often as with one, and four times the blocks of DFT_PLANES, so that the last wave is short), and
# the largest radix of its butterflies (the sizes' prime factors 2, 3, 5, 7 merged up to it).
RADIX_PLANES = 2
RADIX_MAX = 9


def twiddle(m: int, n: int, scale: float = 1.0) -> tuple[float, float]:
    """scale * e^(-2 pi i m / n) rounded to float32, the angle reduced exactly first."""
    angle = 2.0 * math.pi * (m % n) / n

    def f32(x: float) -> float:
        return struct.unpack("f", struct.pack("f", x))[0]
    return f32(scale * math.cos(angle)), f32(-scale * math.sin(angle))


# The tables below are pure functions of sizes and placements, cached (tuples): every plan of an fft
# config renders them, and computing and printing them was a fifth of planning one.
Table = tuple[tuple[float, float], ...]


@functools.lru_cache(maxsize=512)
def float2_literals(values: Table) -> str:
    """A float2 initialiser list, exact: hexadecimal float literals, four to a line."""
    items = [f"{{{re.hex()}f, {im.hex()}f}}" for re, im in values]
    return ",\n    ".join(", ".join(items[i:i + 4]) for i in range(0, len(items), 4))


@functools.lru_cache(maxsize=256)
def factor_tables(n: int, inverse: bool = False) -> Table:
    """One size's twiddles for the factorised transforms (n = F1*F2, F1 = split_factor(n)), as the
    kernels lay them out: [a][b] w_F1^(a b), [c][b] w_n^(c b), [c][d] w_F2^(c d), c, d < F2 and
    a, b < F1; conjugated for the inverse."""
    f1 = split_factor(n)
    f2 = n // f1
    out = [twiddle(a * b, f1) for a in range(f1) for b in range(f1)]
    out += [twiddle(c * b, n) for c in range(f2) for b in range(f1)]
    out += [twiddle(c * d, f2) for c in range(f2) for d in range(f2)]
    return tuple((re, -im) for re, im in out) if inverse else tuple(out)


@functools.lru_cache(maxsize=256)
def dft_tables(src: tuple[int, int], place: tuple[int, int, int, int], fh: int, fw: int) -> Table:
    """The direct transform's tables (Dft in _fft_dft.cuh.j2) for an operand's SRC_H x SRC_W data placed
    at (OFF_H, OFF_W) with steps (STEP_H, STEP_W): [x][v] w_FW^(v col(x)), then [u][r] w_FH^(u row(r))."""
    (sh, sw), (off_h, off_w, step_h, step_w) = src, place
    columns = [twiddle(v * (off_w + x * step_w), fw) for x in range(sw) for v in range(fw // 2 + 1)]
    return tuple(columns + [twiddle(u * (off_h + r * step_h), fh) for u in range(fh) for r in range(sh)])


def fdft_tables(fh: int, fw: int) -> Table:
    """fdft's six twiddle tables (Fdft in _fft_fdft.cuh.j2): the width's three, then the height's."""
    return factor_tables(fw) + factor_tables(fh)


@functools.lru_cache(maxsize=256)
def idft_tables(kept: tuple[int, int, int], fh: int, fw: int) -> Table:
    """The factorised inverse's tables (Idft in _fft_fdft.cuh.j2): [v][j] c_v w_FW^(v x_j) / (FH FW) for
    the kept columns x_j = first + step*j (kept_columns: first, step, count; zero for the padding to
    whole column groups; c_v = 2 but at v = 0 and v = FW/2), then the height's three conjugated
    tables."""
    first, step, count = kept
    columns = cdiv(count, IDFT_COLUMNS) * IDFT_COLUMNS
    rows = [twiddle(v * (first + step * j), fw, (1.0 if v == 0 or 2 * v == fw else 2.0) / (fh * fw))
            if j < count else (0.0, 0.0) for v in range(fw // 2 + 1) for j in range(columns)]
    return tuple(rows) + factor_tables(fh, inverse=True)


def mac_block(config: Config | dict) -> tuple[int, int, int]:
    """The tiled multiply-accumulates: frequencies, rows and columns of O per block. MAC "block": a
    warp is FB frequencies x 32/FB column threads, the block's warps its row threads; "mma": see
    mma_block."""
    if config["MAC"] == "mma":
        return mma_block(config)
    fb, warps = config["FB"], config["FFT_THREADS"] // 32
    return fb, warps * config["IT"], (32 // fb) * config["JT"]


def mac_smem_bytes(config: Config | dict) -> int:
    """The tiled multiply-accumulates' shared memory. MAC "block": two stages of both operands'
    tiles, 8 bytes a complex number; "mma": see mma_smem_bytes."""
    if config["MAC"] == "mma":
        return mma_smem_bytes(config)
    fb, bi, bj = mac_block(config)
    return 2 * config["BL"] * (bi + bj) * fb * 8


def mma_block(config: Config | dict) -> tuple[int, int, int]:
    """MAC "mma": frequencies, rows and columns of O per block. A warp takes one frequency and
    16*IT rows x 8*JT columns; the FFT_THREADS/32/FB warps of a frequency split its rows."""
    fb, warps = config["FB"], config["FFT_THREADS"] // 32
    return fb, 16 * config["IT"] * (warps // fb), 8 * config["JT"]


def mma_lead(n: int) -> int:
    """A frequency's row of n complex numbers padded to 4 (mod 16): conflict-free fragment reads."""
    return n + (4 - n) % 16


def mma_smem_bytes(config: Config | dict) -> int:
    """MAC "mma": two stages of both operands' [frequency][term][row] tiles (each frequency's tile
    padded by 4 complex numbers), or the outputs' [row][column][frequency] tile, whichever is larger."""
    fb, bi, bj = mma_block(config)
    bl = config["BL"]
    stages = 2 * fb * ((bl * mma_lead(bi) + 4) + (bl * mma_lead(bj) + 4)) * 8
    return max(stages, bi * bj * fb * 8)


def mma_accumulators(config: Config | dict, split3: bool) -> int:
    return 8 * config["IT"] * config["JT"] * (2 if split3 else 1)


def split_factor(n: int) -> int:
    """fdft's first factor of a transform size: its largest divisor not above sqrt(n), so that the
    two factors' sum, the complex multiply-adds per point, is least."""
    return max(d for d in range(1, int(n ** 0.5) + 1) if n % d == 0)


def frequency_major_stage_bytes(fh: int, fw: int) -> int:
    """The direct transforms' stage of a block's spectra under MAC "cublas" (store_frequency_major in
    _fft_dft.cuh.j2): DFT_PLANES half spectra."""
    return 8 * DFT_PLANES * spectrum(fh, fw)


def fdft_smem_bytes(src: tuple[int, int], fh: int, fw: int) -> int:
    """The factorised direct transform's shared memory (Fdft in _fft_fdft.cuh.j2): the six twiddle tables,
    the rows' spectra placed at their rows, and either the placed data rows with the rows' first
    stage or the columns' first stage (the two never live at once)."""
    sh, _ = src
    half = fw // 2 + 1
    w1, h1 = split_factor(fw), split_factor(fh)
    w2, h2 = fw // w1, fh // h1
    tables = 8 * (w1 * w1 + w2 * w1 + w2 * w2 + h1 * h1 + h2 * h1 + h2 * h2)
    return tables + 8 * fh * half + max(12 * sh * fw, 8 * fh * half)


@functools.lru_cache(maxsize=256)
def radix_factors(n: int) -> tuple[int, ...]:
    """The radices of XFORM "radix"'s stages for a transform of n points (a product of 2, 3, 5, 7):
    the prime factors, largest first, each merged into the first radix it keeps within RADIX_MAX,
    so that the stages (each one pass over shared memory and a barrier) are few. 70: 7, 5, 2."""
    primes, m = [], n
    for prime in (7, 5, 3, 2):
        while m % prime == 0:
            primes.append(prime)
            m //= prime
    if m != 1:
        raise ValueError(f"XFORM radix transforms sizes whose prime factors are 2, 3, 5 and 7, not {n}")
    radices: list[int] = []
    for prime in primes:
        i = next((i for i, r in enumerate(radices) if r * prime <= RADIX_MAX), None)
        if i is None:
            radices.append(prime)
        else:
            radices[i] *= prime
    return tuple(radices)


def radix_threads_of(config: Config | dict) -> int:
    """Threads a block of the config's radix transforms: RADIX_THREADS, or FFT_THREADS where it is 0
    (or the config was written before the parameter)."""
    return config.get("RADIX_THREADS", 0) or config["FFT_THREADS"]


def radix_lead(fh: int) -> int:
    """The column buffers' row length (float2s): FH made odd, so that a warp reading or writing
    one element of each of consecutive columns meets no bank conflict."""
    return fh | 1


def radix_smem_bytes(rows: int, fh: int, fw: int) -> int:
    """The radix kernels' shared memory (radix_fft and radix_ifft in _fft_radix.cuh.j2), either way: the
    twiddle tables w_FW^m and w_FH^m, and two buffers that the stages pass between, each the larger
    of the rows' [pairs][FW] (``rows`` real rows taken two at a time: the source's data rows forward,
    the kept rows back) and the columns' [FW/2 + 1][radix_lead(FH)] complex numbers."""
    return 8 * (fw + fh + 2 * max((rows + 1) // 2 * fw, (fw // 2 + 1) * radix_lead(fh)))


@functools.lru_cache(maxsize=256)
def radix_tables(fh: int, fw: int) -> Table:
    """XFORM "radix"'s twiddles between stages: w_FW^m (m < FW), then w_FH^m (m < FH)."""
    return tuple(twiddle(m, fw) for m in range(fw)) + tuple(twiddle(m, fh) for m in range(fh))


def radix_butterflies(fh: int, fw: int) -> dict[int, tuple[tuple[str, str], ...]]:
    """Each radix the two sizes' stages use, with its constants w_R^m (m < R) as exact hexadecimal
    float literals: the template writes each butterfly out as straight-line code (a small DFT)."""
    return {r: tuple((re.hex() + "f", im.hex() + "f") for re, im in (twiddle(m, r) for m in range(r)))
            for r in sorted(set(radix_factors(fh)) | set(radix_factors(fw)))}


def dft_flat_of(config: Config | dict, operand: str) -> int:
    """Planes a block of the operand's flat direct transform, 0 where it has none (DFT_FLAT_<operand>
    set, or the config written before the parameter, or a transform other than "dft")."""
    return config.get(f"DFT_FLAT_{operand}", 0) if config[f"XFORM_{operand}"] == "dft" else 0


def xform_smem_bytes(xform: str, src: tuple[int, int], fh: int, fw: int, freq_major: bool = False,
                     flat: int = 0) -> int:
    """The shared memory of an operand's forward transform: none for placed planes + cuFFT; a direct
    one's own, and with frequency-major spectra the block's stage of them (but the flat one's)."""
    if xform == "cufft":
        return 0
    if xform == "radix":
        return radix_smem_bytes(src[0], fh, fw)   # plane-major only (a constraint keeps it from MAC "cublas")
    if flat:
        return dft_smem_bytes(src, fh, fw, flat)   # frequency-major as it computes them: no stage
    stage = frequency_major_stage_bytes(fh, fw) if freq_major else 0
    return (dft_smem_bytes if xform == "dft" else fdft_smem_bytes)(src, fh, fw) + stage


IDFT_PLANES = (4, 2, 1)       # planes a block of the factorised inverse takes through its stages together
IDFT_PLANES_BYTES = 48 * 1024  # ... as many as have their spectra in this much shared memory (or one)
IDFT_COLUMNS = 4              # adjacent output columns a thread of its last stage (Idft::JB)


def idft_planes(fh: int, fw: int) -> int:
    return next((n for n in IDFT_PLANES if n * 8 * spectrum(fh, fw) <= IDFT_PLANES_BYTES), 1)


def idft_smem_bytes(out_w: int, fh: int, fw: int) -> int:
    """The factorised inverse's shared memory (Idft in _fft_fdft.cuh.j2): the rows' table of real outputs
    (kept columns padded to whole groups of IDFT_COLUMNS), the columns' two twiddle tables, and the
    spectra of the planes it takes together, worked in place."""
    h1 = split_factor(fh)
    h2 = fh // h1
    columns = cdiv(out_w, IDFT_COLUMNS) * IDFT_COLUMNS
    return 8 * ((fw // 2 + 1) * columns + h1 * h1 + h2 * h1 + h2 * h2 + idft_planes(fh, fw) * spectrum(fh, fw))


def dft_smem_bytes(src: tuple[int, int], fh: int, fw: int, planes: int = 1) -> int:
    """The direct transform's shared memory: twiddle tables of rows and columns, the rows' spectra
    (8 bytes a complex number) and the data of the planes it holds at once: one (Dft in _fft_dft.cuh.j2),
    or DFT_FLAT's (DftFlat)."""
    sh, sw = src
    half = fw // 2 + 1
    return 8 * (sw * half + fh * sh + planes * sh * half) + 4 * planes * sh * sw
