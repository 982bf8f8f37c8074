"""The fft formulation (cuFFT steps + a generated complex multiply-accumulate) for the three
convolutions with filters of 25 taps or more: on the CPU, its plans run in NumPy (the FFT steps by
numpy.fft, unnormalised as cuFFT, each kernel from its definition) against the float64 direct
reference, its workspace against the limit, its templates through nvcc (each build list checked whole, then a random sample of it built; -m slow
builds every job: tests.formulation_checks.BUILDS); on the GPU (-m gpu), every element against
float64."""
from __future__ import annotations

import dataclasses
import random
import shutil

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import reference
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.formulations.fft import DFT_FLATS, FFT, MAX_FFT, NAME, RADIX_THREADS, TILES_F
from autocnn.kernels.formulations.fft.fft_kernels import (DFT_PLANES, RADIX_MAX, RADIX_PLANES, dft_smem_bytes,
                                                          dft_tables, fdft_smem_bytes, fdft_tables, idft_planes,
                                                          idft_tables, mac_block, mma_block, mma_lead, mma_smem_bytes,
                                                          radix_factors, radix_lead, radix_smem_bytes, split_factor)
from autocnn.kernels.formulations.fft.fft_planes import (buffer_name, fft_conv, fft_size, fft_tiles, frequency_major,
                                                         is_phased, kept_columns, kept_rows, mac_gemm, operand_sizes,
                                                         placement, shares_workspace, smooth_size, spectrum, sub_filter,
                                                         takes_phases, tile_of, workspace_elements)
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.problem import PROBLEM_TYPES
from autocnn.kernels.steps import LibraryComplexGemm, LibraryFft
from autocnn.kernels.suite import CONV_OPS, odd_problems, seed_problems
from tests.formulation_checks import (BUILD_ARCHES, BUILDS, assert_verifies_on_gpu, build_failures, build_sample,
                                      compile_failures, operations_with)
from tests.plan_numpy import check_plans, frequency_major as frequency_major_view

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATIONS = operations_with(FFT)
SEEDS = ("kriz09", "convnet18_c2", "sweep_7x7", "sweep_11x11", "chellapilla06_c2", "scherer10_l3")


def small_problems(op: str) -> list[tuple[str, object]]:
    """Large-filter shapes that divide nothing evenly: the odd shapes with 25 taps or more (5x5
    stride 3 with asymmetric padding, 7x7 stride 2, batch 1), an image smaller than its filter's
    padding allows, strides larger than one, and fused epilogues."""
    make = PROBLEM_TYPES[op]
    out = [(n, p) for n, p in odd_problems(op) if p.R * p.S >= 25]
    out += [("f_7x5", make(N=3, C=4, H=9, W=12, K=5, R=7, S=5, stride=1, padding=(3, 1, 2, 4))),
            ("f_tiny", make(N=2, C=3, H=5, W=5, K=2, R=5, S=5, stride=1, padding=(2, 2, 2, 2))),
            ("f_s2", make(N=5, C=2, H=16, W=11, K=3, R=6, S=6, stride=(2, 3), padding=(1, 0, 2, 5)))]
    if op == "conv_fwd":
        out.append(("f_7x5_relu", dataclasses.replace(dict(out)["f_7x5"], bias=True, activation="tanh")))
    if op == "conv_wgrad":
        out.append(("f_s2_nobias", dataclasses.replace(dict(out)["f_s2"], bias=False)))
    return out


def space(op, problem):
    return OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": NAME})


class Kernels:
    """The formulation's generated kernels in NumPy, from each op's definition as correlations.
    With STRIDE_PHASES=1 a plane index of the phased operand is (outer, a*SW + b, c): phase (a, b).
    With FFT tiles (FFT_TILE) an image's planes are (tile, channel): tile t = ty*TW + tx reads the
    window of the input that its outputs need, and the multiply-accumulate takes tiles as images.
    With MAC "cublas" the spectra are frequency-major: a step's P planes as [frequency][plane], P the
    planes of the block it transforms (the GEMM itself is the plan's library step)."""

    def __init__(self, problem, config):
        self.p = problem
        self.phased = is_phased(config)
        self.tile = tile_of(config)
        self.t = fft_tiles(problem, self.tile) if self.tile else None
        self.fh, self.fw = fft_size(fft_conv(problem, self.phased, self.tile), config["FFT_SIZE"])
        self.phases = problem.stride[0] * problem.stride[1] if self.phased else 1
        self.share = shares_workspace(config)
        self.freq_major = frequency_major(config)
        self.f = fft_conv(problem, self.phased, self.tile)

    def _tile_corners(self, step_h=1, step_w=1):
        """Each tile's (t, first output row * step_h, first output column * step_w)."""
        t = self.t
        return [(ty * t.TW + tx, ty * t.TY * step_h, tx * t.TX * step_w) for ty in range(t.TH) for tx in range(t.TW)]

    def _place_x_tiles(self, b, out, n0, nb):
        # Tile t's window of the padded X: rows from its first output's row times SH.
        p, t, (pt, pl), (sh, sw) = self.p, self.t, self.p.padding[:2], self.p.stride
        (wh, ww) = t.window_a
        padded = np.zeros((nb, p.C, t.TH * t.TY * sh + wh, t.TW * t.TX * sw + ww))
        padded[:, :, pt:pt + p.H, pl:pl + p.W] = b["x"].reshape(p.x_shape)[n0:n0 + nb]
        planes = self._planes(b[out], nb * t.count * p.C).reshape(nb, t.count, p.C, self.fh, self.fw)
        planes[...] = 0
        for i, h0, w0 in self._tile_corners(sh, sw):
            planes[:, i, :, :wh, :ww] = padded[:, :, h0:h0 + wh, w0:w0 + ww]

    def _place_dy_tiles(self, b, out, n0, nb):
        p, t, (sh, sw) = self.p, self.t, self.p.stride
        dy = b["dy"].reshape(p.y_shape)[n0:n0 + nb]
        planes = self._planes(b[out], nb * t.count * p.K).reshape(nb, t.count, p.K, self.fh, self.fw)
        planes[...] = 0
        if p.op == "conv_wgrad":   # tile t of dY spread at the stride
            grid = np.zeros((nb, p.K, t.TH * t.TY, t.TW * t.TX))
            grid[:, :, :p.P, :p.Q] = dy
            for i, h0, w0 in self._tile_corners():
                planes[:, i, :, :t.TY * sh:sh, :t.TX * sw:sw] = grid[:, :, h0:h0 + t.TY, w0:w0 + t.TX]
            return
        # conv_bwd_data: dX row h reads dY spread at u = h + PT - r; tile t's window starts at its
        # first row + PT - (R - 1). The spread dY with R - 1 rows of zeros before it (u from -(R-1)).
        (pt, pl), (wh, ww) = p.padding[:2], t.window_a
        mh, mw = p.R - 1, p.S - 1
        spread = np.zeros((nb, p.K, mh + t.TH * t.TY + pt + wh + sh * p.P, mw + t.TW * t.TX + pl + ww + sw * p.Q))
        spread[:, :, mh:mh + sh * p.P:sh, mw:mw + sw * p.Q:sw] = dy
        for i, h0, w0 in self._tile_corners():
            u0, v0 = h0 + pt - (p.R - 1) + mh, w0 + pl - (p.S - 1) + mw
            planes[:, i, :, :wh, :ww] = spread[:, :, u0:u0 + wh, v0:v0 + ww]

    def buf(self, name):   # the buffer the plan's step names for ``name`` (WS_SHARE)
        return buffer_name(name, self.share)

    def _planes(self, buf, count):
        return buf[:count * self.fh * self.fw].reshape(count, self.fh, self.fw)

    def _spectra(self, buf, *shape):
        count, half = int(np.prod(shape)), self.fw // 2 + 1
        spectra = buf[:2 * count * self.fh * half].view(np.complex128)
        if self.freq_major:   # element (plane, frequency) at frequency*count + plane
            seen = frequency_major_view(spectra, count, self.fh, half).reshape(*shape, self.fh, half)
            assert np.shares_memory(seen, spectra)
            return seen
        return spectra.reshape(*shape, self.fh, half)

    def _block_planes(self, operand, nb):
        """The planes a step of the block transforms: A's, B's (the filters once, or conv_wgrad's dY) or O's
        (conv_wgrad's all of them)."""
        f = self.f
        if operand == "B" and self.p.op != "conv_wgrad":
            return f.b_planes
        if operand == "O" and self.p.op == "conv_wgrad":   # summed over the blocks, transformed back once
            return f.out_planes
        return nb * f.tiles * {"A": f.a_planes, "B": f.b_planes, "O": f.out_planes}[operand]

    def _place_x(self, b, out, n0, nb):
        p, (pt, pl) = self.p, self.p.padding[:2]
        planes = self._planes(b[out], nb * p.C).reshape(nb, p.C, self.fh, self.fw)
        planes[...] = 0
        planes[:, :, pt:pt + p.H, pl:pl + p.W] = b["x"].reshape(p.x_shape)[n0:n0 + nb]

    def _place_x_phases(self, b, out, n0, nb):
        # Phase (a, b) of the padded X: rows SH*i + a, columns SW*j + b, for i, j within the wrap-free size.
        p, (pt, pl), (sh, sw) = self.p, self.p.padding[:2], self.p.stride
        hi, wi = fft_conv(p, True).HP, fft_conv(p, True).WP
        padded = np.zeros((nb, p.C, sh * hi + sh, sw * wi + sw))
        padded[:, :, pt:pt + p.H, pl:pl + p.W] = b["x"].reshape(p.x_shape)[n0:n0 + nb]
        planes = self._planes(b[out], nb * self.phases * p.C).reshape(nb, sh, sw, p.C, self.fh, self.fw)
        planes[...] = 0
        for ph_a in range(sh):
            for ph_b in range(sw):
                planes[:, ph_a, ph_b, :, :hi, :wi] = padded[:, :, ph_a:ph_a + sh * hi:sh, ph_b:ph_b + sw * wi:sw]

    def _place_dy(self, b, out, n0, nb):
        p, (sh, sw) = self.p, (1, 1) if self.phased else self.p.stride   # phases: dY as it is
        planes = self._planes(b[out], nb * p.K).reshape(nb, p.K, self.fh, self.fw)
        planes[...] = 0
        planes[:, :, :sh * p.P:sh, :sw * p.Q:sw] = b["dy"].reshape(p.y_shape)[n0:n0 + nb]

    def fft_place_a(self, b, n0, nb):
        if self.tile:
            return (self._place_dy_tiles if self.p.op == "conv_bwd_data" else self._place_x_tiles)(
                b, self.buf("fft_a"), n0, nb)
        if self.p.op == "conv_bwd_data":
            return self._place_dy(b, self.buf("fft_a"), n0, nb)
        (self._place_x_phases if self.phased else self._place_x)(b, self.buf("fft_a"), n0, nb)

    def fft_place_b(self, b, n0, nb):
        p = self.p
        if p.op == "conv_wgrad" and self.tile:
            return self._place_dy_tiles(b, "fft_b", n0, nb)
        if p.op == "conv_wgrad":
            return self._place_dy(b, "fft_b", n0, nb)
        if self.phased:   # the sub-filters W[k, c, a + SH*u, b + SW*v]
            (sh, sw), (ru, su) = p.stride, sub_filter(p)
            planes = self._planes(b["fft_b"], p.K * self.phases * p.C).reshape(p.K, sh, sw, p.C, self.fh, self.fw)
            planes[...] = 0
            w = b["w"].reshape(p.w_shape)
            for ph_a in range(sh):
                for ph_b in range(sw):
                    sub = w[:, :, ph_a::sh, ph_b::sw]
                    planes[:, ph_a, ph_b, :, :sub.shape[2], :sub.shape[3]] = sub
            return
        planes = self._planes(b["fft_b"], p.K * p.C).reshape(p.K, p.C, self.fh, self.fw)
        planes[...] = 0
        planes[:, :, :p.R, :p.S] = b["w"].reshape(p.w_shape)

    def _spectra_of(self, b, placed, spectra, place, block_planes):
        # The direct transform: the placed planes' half spectra, as numpy.fft (unnormalised) has them.
        # A directly transformed operand has no placed planes in the plan: room for as many as its spectra.
        count = b[spectra].size // (2 * self.fh * (self.fw // 2 + 1))
        placed = self.buf(placed)
        scratch = {**b, placed: np.zeros(count * self.fh * self.fw)}
        place(scratch)
        planes = scratch[placed].reshape(-1, self.fh, self.fw)
        if self.freq_major:   # the block's planes, frequency-major
            self._spectra(b[spectra], block_planes)[...] = np.fft.rfft2(planes[:block_planes])
            return
        out = b[spectra][:b[spectra].size // 2 * 2].view(np.complex128)   # a shared buffer may be odd-sized
        out[:planes.size // self.fw * (self.fw // 2 + 1)] = np.fft.rfft2(planes).ravel()

    def fft_dft_a(self, b, n0, nb):
        self._spectra_of(b, "fft_a", "fft_af", lambda scratch: self.fft_place_a(scratch, n0, nb),
                         self._block_planes("A", nb))

    def fft_dft_b(self, b, n0, nb):
        self._spectra_of(b, "fft_b", "fft_bf", lambda scratch: self.fft_place_b(scratch, n0, nb),
                         self._block_planes("B", nb))

    def fft_mac(self, b, nb, accumulate):
        p = self.p
        # As the kernel does: with accumulate the products are added to what O holds.
        if p.op == "conv_fwd":      # corr(x, w): X conj(W), summed over c
            a, w = self._spectra(b["fft_af"], nb, p.C), self._spectra(b["fft_bf"], p.K, p.C)
            out, total = self._spectra(b["fft_of"], nb, p.K), np.einsum("ncf...,kcf...->nkf...", a, np.conj(w))
        elif p.op == "conv_bwd_data":   # conv(dy spread, w): DY W, summed over k (phases: C's planes per phase)
            cp = self.phases * p.C
            a, w = self._spectra(b["fft_af"], nb, p.K), self._spectra(b["fft_bf"], p.K, cp)
            out, total = self._spectra(b["fft_of"], nb, cp), np.einsum("nkf...,kcf...->ncf...", a, w)
        else:                           # corr(x, dy spread): X conj(DY), summed over n and blocks
            cp = self.phases * p.C
            a, d = self._spectra(b["fft_af"], nb, cp), self._spectra(b["fft_bf"], nb, p.K)
            out, total = self._spectra(b["fft_of"], p.K, cp), np.einsum("nkf...,ncf...->kcf...", np.conj(d), a)
        out[...] = out + total if accumulate else total

    def fft_idft(self, b, n0, nb):
        # XFORM_O fdft: cuFFT's C2R (unnormalised) and the crop in one; the plan has no real output planes.
        count = b["fft_of"].size // (2 * self.fh * (self.fw // 2 + 1))
        if self.freq_major:   # the block's planes are the run's
            count = self._block_planes("O", nb)
        planes = np.fft.irfft2(self._spectra(b["fft_of"], count), s=(self.fh, self.fw)) * (self.fh * self.fw)
        self.fft_crop({**b, self.buf("fft_o"): planes.ravel()}, n0, nb)

    def fft_crop(self, b, n0, nb):
        p, scale = self.p, 1.0 / (self.fh * self.fw)
        (pt, pl), (sh, sw) = p.padding[:2], p.stride
        if self.tile and p.op != "conv_wgrad":   # each tile's outputs into place
            t = self.t
            fwd = p.op == "conv_fwd"
            planes = p.K if fwd else p.C
            o = self._planes(b[self.buf("fft_o")], nb * t.count * planes).reshape(nb, t.count, planes, self.fh, self.fw)
            out = np.zeros((nb, planes, t.TH * t.TY, t.TW * t.TX))
            for i, h0, w0 in self._tile_corners():
                out[:, :, h0:h0 + t.TY, w0:w0 + t.TX] = (o[:, i, :, :t.TY * sh:sh, :t.TX * sw:sw] if fwd else
                                                         o[:, i, :, p.R - 1:p.R - 1 + t.TY, p.S - 1:p.S - 1 + t.TX])
            if fwd:
                y = out[:, :, :p.P, :p.Q] * scale
                if p.bias:
                    y = y + b["bias"].reshape(1, -1, 1, 1)
                b["y"].reshape(p.y_shape)[n0:n0 + nb] = reference.activation(y, p.activation)
            else:
                b["dx"].reshape(p.x_shape)[n0:n0 + nb] = out[:, :, :p.H, :p.W] * scale
            return
        if p.op == "conv_fwd":
            o = self._planes(b[self.buf("fft_o")], nb * p.K).reshape(nb, p.K, self.fh, self.fw)
            y = o[:, :, :sh * p.P:sh, :sw * p.Q:sw] * scale
            if p.bias:
                y = y + b["bias"].reshape(1, -1, 1, 1)
            b["y"].reshape(p.y_shape)[n0:n0 + nb] = reference.activation(y, p.activation)
        elif p.op == "conv_bwd_data" and self.phased:   # padded row h: phase h mod SH, position h div SH
            o = self._planes(b[self.buf("fft_o")], nb * self.phases * p.C).reshape(nb, sh, sw, p.C, self.fh, self.fw)
            hs, ws = np.arange(p.H) + pt, np.arange(p.W) + pl
            picked = o[:, hs[:, None] % sh, ws[None, :] % sw, :, hs[:, None] // sh, ws[None, :] // sw]   # (H, W, nb, C)
            b["dx"].reshape(p.x_shape)[n0:n0 + nb] = picked.transpose(2, 3, 0, 1) * scale
        elif p.op == "conv_bwd_data":
            o = self._planes(b[self.buf("fft_o")], nb * p.C).reshape(nb, p.C, self.fh, self.fw)
            b["dx"].reshape(p.x_shape)[n0:n0 + nb] = o[:, :, pt:pt + p.H, pl:pl + p.W] * scale
        elif self.phased:   # tap r: phase r mod SH, position r div SH
            o = self._planes(b[self.buf("fft_o")], p.K * self.phases * p.C).reshape(p.K, sh, sw, p.C, self.fh, self.fw)
            rs, ss = np.arange(p.R), np.arange(p.S)
            picked = o[:, rs[:, None] % sh, ss[None, :] % sw, :, rs[:, None] // sh, ss[None, :] // sw]   # (R, S, K, C)
            b["dw"].reshape(p.w_shape)[...] = picked.transpose(2, 3, 0, 1) * scale
        else:
            o = self._planes(b[self.buf("fft_o")], p.K * p.C).reshape(p.K, p.C, self.fh, self.fw)
            b["dw"].reshape(p.w_shape)[...] = o[:, :, :p.R, :p.S] * scale

    def conv_bias_grad(self, b):
        b["db"][...] = b["dy"].reshape(self.p.y_shape).sum(axis=(0, 2, 3))


def test_fdft_splits_each_size_into_its_two_closest_factors():
    assert [split_factor(n) for n in (7, 35, 40, 42, 64, 70, 128, 135, 256)] == [1, 5, 5, 6, 8, 7, 8, 9, 16]


def test_fdft_rows_and_columns_are_the_dft_of_numpy():
    """The factorised transform's arithmetic (fdft in _fft_fdft.cuh.j2) written out in NumPy: a placed
    plane's half spectrum through the two stages of rows and of columns equals numpy.fft.rfft2."""
    rng = np.random.default_rng(3)
    for fh, fw in ((42, 42), (70, 35), (40, 64), (7, 12)):
        h1, w1 = split_factor(fh), split_factor(fw)
        h2, w2, half = fh // h1, fw // w1, fw // 2 + 1
        plane = np.zeros((fh, fw))
        plane[2:fh - 3, 1:fw - 2] = rng.standard_normal((fh - 5, fw - 3))
        tw = lambda m, n: np.exp(-2j * np.pi * (m % n) / n)
        # rows: in[x], x = w2*x1 + x2; ra[x2][v1]; spectrum[v1 + w1*v2]
        x1, x2, v1, v2 = np.arange(w1), np.arange(w2), np.arange(w1), np.arange(w2)
        ra = np.einsum("rab,ac->rbc", plane.reshape(fh, w1, w2), tw(np.outer(x1, v1), w1)) * tw(np.outer(x2, v1), fw)
        rows = np.einsum("rbc,bd->rcd", ra, tw(np.outer(x2, v2), w2))        # [r][v1][v2]
        rows = rows.transpose(0, 2, 1).reshape(fh, fw)[:, :half]             # v = v1 + w1*v2
        y1, y2, u1, u2 = np.arange(h1), np.arange(h2), np.arange(h1), np.arange(h2)
        ca = np.einsum("abv,ac->bcv", rows.reshape(h1, h2, half), tw(np.outer(y1, u1), h1)) * \
            tw(np.outer(y2, u1), fh)[:, :, None]
        spectrum = np.einsum("bcv,bd->cdv", ca, tw(np.outer(y2, u2), h2)).transpose(1, 0, 2).reshape(fh, half)
        assert np.allclose(spectrum, np.fft.rfft2(plane), atol=1e-9), (fh, fw)


def test_factorised_inverse_keeps_outputs_of_numpys_irfft2():
    """The factorised inverse's arithmetic (idft in _fft_fdft.cuh.j2) written out in NumPy: a half spectrum
    through the columns' two stages (only the kept rows in the second) and the rows' real sums with
    their doubled weights gives numpy.fft.irfft2's values at the kept rows and columns, with rows and
    columns kept at an offset and at a stride, and odd and even widths."""
    rng = np.random.default_rng(5)
    for (fh, fw), (oh, sh, nh), (ow, sw, nw) in (((42, 42), (5, 1, 32), (5, 1, 32)), ((40, 35), (0, 2, 20), (0, 3, 12)),
                                                ((70, 70), (0, 1, 67), (0, 1, 67)), ((7, 12), (3, 1, 4), (1, 1, 11))):
        h1 = split_factor(fh)
        h2, half = fh // h1, fw // 2 + 1
        spec = np.fft.rfft2(rng.standard_normal((fh, fw)))
        itw = lambda m, n: np.exp(2j * np.pi * (m % n) / n)
        u1, u2, y1, y2 = np.arange(h1), np.arange(h2), np.arange(h1), np.arange(h2)
        # first stage: s1[u2][y1][v] = w_FH^-(u2 y1) sum over u1 of Z[h2*u1 + u2][v] w_H1^-(u1 y1)
        s1 = np.einsum("abv,ac->bcv", spec.reshape(h1, h2, half), itw(np.outer(u1, y1), h1)) * \
            itw(np.outer(u2, y1), fh)[:, :, None]
        cols = np.einsum("bcv,bd->cdv", s1, itw(np.outer(u2, y2), h2))   # [y1][y2][v]: row y1 + h1*y2
        rows = cols.transpose(1, 0, 2).reshape(fh, half)[oh + sh * np.arange(nh)]
        v, xs = np.arange(half), ow + sw * np.arange(nw)
        weight = np.where((v == 0) | (2 * v == fw), 1.0, 2.0) / (fh * fw)
        table = weight[:, None] * np.exp(-2j * np.pi * (np.outer(v, xs) % fw) / fw)   # c_v SCALE w_FW^(v x)
        kept = rows.real @ table.real + rows.imag @ table.imag
        expected = np.fft.irfft2(spec, s=(fh, fw))[oh:oh + sh * nh:sh, ow:ow + sw * nw:sw]
        assert kept.shape == expected.shape and np.allclose(kept, expected, atol=1e-12), (fh, fw)


def test_rendered_twiddle_tables_transform_as_numpy_does():
    """The tables fft.py renders into the kernels (float32, rounded once from double precision): dft's
    for every operand's placement of each op (phases apart and not) give numpy.fft.rfft2 of the placed
    plane through the kernel's two products; fdft's are its three factor tables of each size; the
    inverse's row table gives irfft2's kept columns from the kept rows' half spectra."""
    rng = np.random.default_rng(11)
    checked = 0
    for op in CONV_OPS:
        for name, problem in small_problems(op):
            for phased in ((False, True) if takes_phases(problem) else (False,)):
                fh, fw = fft_size(fft_conv(problem, phased), "smooth")
                half = fw // 2 + 1
                for operand, (sh, sw) in operand_sizes(problem, phased).items():
                    off_h, off_w, step_h, step_w = placement(problem, phased)[operand]
                    src = rng.standard_normal((sh, sw))
                    placed = np.zeros((fh, fw))
                    placed[off_h:off_h + step_h * sh:step_h, off_w:off_w + step_w * sw:step_w] = src
                    table = np.array(dft_tables((sh, sw), placement(problem, phased)[operand], fh, fw))
                    assert table.dtype == np.float64 and np.all(table == table.astype(np.float32))
                    table = table[:, 0] + 1j * table[:, 1]
                    tw, th = table[:sw * half].reshape(sw, half), table[sw * half:].reshape(fh, sh)
                    got, expected = th @ (src @ tw), np.fft.rfft2(placed)
                    assert np.abs(got - expected).max() <= 1e-6 * np.abs(expected).max(), f"{op} {name} {operand}"
                    checked += 1
                if op != "conv_wgrad":   # the inverse's rows: the kept columns of irfft2
                    first, step, count = kept_columns(problem, phased)
                    spec = np.fft.rfft2(rng.standard_normal((fh, fw)))
                    rows = np.fft.ifft(spec, axis=0) * fh   # the columns inverted, unnormalised as the kernel's
                    columns = -(-count // 4) * 4
                    table = np.array(idft_tables(kept_columns(problem, phased), fh, fw))[:half * columns]
                    table = (table[:, 0] + 1j * table[:, 1]).reshape(half, columns)
                    got = rows.real @ table.real + rows.imag @ table.imag
                    expected = np.fft.irfft2(spec, s=(fh, fw))[:, first:first + step * count:step]
                    assert np.abs(got[:, :count] - expected).max() <= 1e-6 * np.abs(expected).max(), f"{op} {name}"
                    assert not got[:, count:].any()   # the padding to whole column groups stores nothing
    assert checked >= 2 * sum(len(small_problems(op)) for op in CONV_OPS)
    for fh, fw in ((42, 42), (70, 35)):
        tables = np.array(fdft_tables(fh, fw))
        w1, h1 = split_factor(fw), split_factor(fh)
        w2, h2 = fw // w1, fh // h1
        a = np.arange(max(fh, fw))
        expected = np.concatenate([np.exp(-2j * np.pi * (np.outer(a[:f], a[:g]) % n) / n).ravel()
                                   for f, g, n in ((w1, w1, w1), (w2, w1, fw), (w2, w2, w2),
                                                   (h1, h1, h1), (h2, h1, fh), (h2, h2, h2))])
        assert np.abs(tables[:, 0] + 1j * tables[:, 1] - expected).max() < 1e-7


def test_smooth_sizes_have_only_small_prime_factors():
    assert [smooth_size(n) for n in (1, 11, 13, 17, 23, 38, 97, 127)] == [1, 12, 14, 18, 24, 40, 98, 128]


@pytest.mark.parametrize("op", CONV_OPS)
def test_plans_compute_the_convolution_in_numpy(op, rng):
    """Default candidates and sampled configs (both FFT sizes, blocks that do not divide the batch)
    on odd shapes: placing, transforms, spectra products, cropping and stride sampling give the
    float64 reference's result to rounding."""
    pyrng = random.Random(int(rng.integers(2**31)))

    def configs(problem):
        sp = space(op, problem)
        return [*(sp.validate(c) for c in OPERATIONS[op].candidates(problem, NAME)), *sp.sample(pyrng, 4)]

    checked = check_plans(OPERATIONS[op], small_problems(op), configs, Kernels, rng, tolerance=1e-11)
    assert checked >= 5 * len(small_problems(op))


@pytest.mark.parametrize("op", ("conv_bwd_data", "conv_wgrad"))
def test_stride_phases_compute_the_convolution_in_numpy_on_strided_shapes(op, rng):
    """Both STRIDE_PHASES settings, each of the three multiply-accumulates, on every strided shape
    (strides 2 and 3, filters that no stride divides, asymmetric padding): against float64."""
    strided = [(n, p) for n, p in small_problems(op) if takes_phases(p)]
    strided.append(("s3_9x8", PROBLEM_TYPES[op](N=3, C=3, H=20, W=17, K=4, R=9, S=8, stride=3, padding=(4, 2, 1, 3))))
    assert len(strided) >= 3

    def configs(problem):
        base = {k: v for k, v in OPERATIONS[op].candidates(problem, NAME)[0].items()
                if k not in ("FB", "BL", "MAC_ORDER", "DFT_FLAT_B")}
        macs = ({"MAC": "thread", "IT": 2, "JT": 1}, {"MAC": "block", "IT": 1, "JT": 2, "FB": 4, "BL": 4},
                {"MAC": "mma", "IT": 1, "JT": 1, "FB": 4, "BL": 8})
        return [space(op, problem).complete({**base, **mac, "IMGS": min(2, problem.N), "STRIDE_PHASES": ph, "XFORM_A": xa, "XFORM_B": xb})
                for ph in (0, 1) for mac in macs for xa, xb in (("cufft", "cufft"), ("dft", "dft"))]

    assert check_plans(OPERATIONS[op], strided, configs, Kernels, rng, tolerance=1e-11) == 12 * len(strided)


def test_stride_phases_make_planes_a_stride_smaller_with_the_same_products():
    """scherer10_l2's backward-data (8x8, stride 2, 128x128): dY spread at the stride needs 135 x 135
    planes, its phases 70 x 70 (P + ceil(R/SH) - 1 = 67, smooth); the multiply-accumulate's outputs
    grow by the four phases, its frequencies shrink by about as much."""
    problem = dict(seed_problems("conv_bwd_data"))["scherer10_l2"]
    spread, phased = fft_conv(problem), fft_conv(problem, True)
    assert fft_size(spread, "smooth") == (135, 135) and fft_size(phased, "smooth") == (70, 70)
    assert (phased.a_planes, phased.b_planes, phased.out_planes) == (64, 64 * 4 * 16, 4 * 16)
    assert operand_sizes(problem, True) == {"A": (64, 64), "B": (4, 4)}
    wgrad = dict(seed_problems("conv_wgrad"))["scherer10_l2"]
    assert fft_size(fft_conv(wgrad, True), "smooth") == (70, 70)
    assert (fft_conv(wgrad, True).a_planes, fft_conv(wgrad, True).out_planes) == (4 * 16, 64 * 4 * 16)
    assert not takes_phases(dict(seed_problems("conv_fwd"))["scherer10_l2"])
    assert not takes_phases(dict(seed_problems("conv_bwd_data"))["sweep_7x7"])
    assert "STRIDE_PHASES" not in [p.name for p in space("conv_bwd_data", dict(seed_problems("conv_bwd_data"))["sweep_7x7"]).params]


def test_filters_below_25_taps_are_left_to_others_and_images_beyond_the_largest_fft_tiled():
    three = PROBLEM_TYPES["conv_fwd"](N=2, C=3, H=9, W=9, K=4, R=3, S=3, padding=1)
    with pytest.raises(InfeasibleConfigError, match="filters of 25 taps or more, not 3x3"):
        OPERATIONS["conv_fwd"].default_config(three, LIMITS, formulation=NAME)
    big = PROBLEM_TYPES["conv_fwd"](N=1, C=1, H=MAX_FFT, W=8, K=1, R=5, S=5, padding=2)
    sp = space("conv_fwd", big)
    whole = {**OPERATIONS["conv_fwd"].candidates(big, NAME)[0], "FFT_TILE": 0}
    with pytest.raises(InfeasibleConfigError, match="270x12 FFT planes exceed 256: FFT_TILE cuts the image"):
        sp.validate(whole)
    # ... so its default is tiled, and every feasible config is.
    assert OPERATIONS["conv_fwd"].default_config(big, LIMITS, formulation=NAME)["FFT_TILE"] == 32
    assert all(c["FFT_TILE"] for c in sp.sample(random.Random(1), 20))


def test_workspace_is_computed_and_never_above_the_limit():
    rng = random.Random()
    for op in CONV_OPS:
        for name, problem in [*((n, p) for n, p in seed_problems(op) if n in SEEDS), *small_problems(op)]:
            for config in [OPERATIONS[op].default_config(problem, LIMITS, formulation=NAME),
                           *space(op, problem).sample(rng, 6)]:
                plan = OPERATIONS[op].plan(problem, config)
                share = shares_workspace(config)
                expected = workspace_elements(fft_conv(problem, is_phased(config), tile_of(config)), config["FFT_SIZE"], config["IMGS"],
                                              config["XFORM_A"], config["XFORM_B"], config.get("XFORM_O", "cufft"),
                                              share)
                assert ("fft_a" in expected) == (config["XFORM_A"] == "cufft" and not share) and \
                    ("fft_b" in expected) == (config["XFORM_B"] == "cufft") and \
                    ("fft_o" in expected) == (config.get("XFORM_O", "cufft") == "cufft" and not share)
                assert plan.workspace_bytes == 4 * sum(expected.values()) <= WORKSPACE_LIMIT_BYTES, f"{op} {name}"
    # sweep_11x11's 4,096 filter spectra and 64 images of 64 planes each exceed 256 MiB.
    problem = dict(seed_problems("conv_fwd"))["sweep_11x11"]
    with pytest.raises(InfeasibleConfigError, match="bytes of workspace exceed the limit"):
        space("conv_fwd", problem).complete({"formulation": NAME, "FFT_SIZE": "pow2", "IMGS": 128, "FFT_THREADS": 128,
                                             "IT": 2, "JT": 2, "MAC": "thread",
                                             "XFORM_A": "cufft", "XFORM_B": "cufft"})


def test_shared_workspace_takes_all_of_scherer10_l2s_images_in_one_block():
    """WS_SHARE 1: A's placed planes share O's spectra and A's spectra O's planes, so scherer10_l2's
    backward-data (phases apart, cuFFT both ways) takes its 60 images in one block under 256 MiB
    (each pair the larger of the two), where unshared it needs 312 MB; a directly transformed A and O
    leave nothing to share, and the space says so."""
    problem = dict(seed_problems("conv_bwd_data"))["scherer10_l2"]
    f = fft_conv(problem, True)
    alone = workspace_elements(f, "smooth", 64, "cufft", "dft", "cufft")
    shared = workspace_elements(f, "smooth", 64, "cufft", "dft", "cufft", share=True)
    assert set(shared) == {"fft_af", "fft_bf", "fft_of"}
    assert shared["fft_of"] == max(alone["fft_a"], alone["fft_of"]) and \
        shared["fft_af"] == max(alone["fft_af"], alone["fft_o"]) and shared["fft_bf"] == alone["fft_bf"]
    assert 4 * sum(shared.values()) <= WORKSPACE_LIMIT_BYTES < 4 * sum(alone.values())
    sp = space("conv_bwd_data", problem)
    base = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 64, "FFT_THREADS": 256, "IT": 4, "JT": 4,
            "MAC": "block", "FB": 4, "BL": 8, "XFORM_A": "cufft", "XFORM_B": "dft", "XFORM_O": "cufft",
            "STRIDE_PHASES": 1}
    with pytest.raises(InfeasibleConfigError, match="bytes of workspace exceed the limit"):
        sp.complete({**base, "WS_SHARE": 0})
    plan = OPERATIONS["conv_bwd_data"].plan(problem, sp.complete({**base, "WS_SHARE": 1}))
    assert dict(plan.workspaces) == shared
    names = [(s.src, s.dst) if isinstance(s, LibraryFft) else (s.kernel, s.args) for s in plan.steps]
    assert ("fft_of", "fft_af") in names and ("fft_af", "fft_af") not in names   # R2C into af, C2R from of
    assert ("fft_place_a", ("dy", "fft_of")) in names and ("fft_crop", ("fft_af", "bias", "dx")) in names
    with pytest.raises(InfeasibleConfigError, match="WS_SHARE=1 shares placed or real planes"):
        sp.complete({**base, "IMGS": 16, "XFORM_A": "fdft", "XFORM_O": "fdft", "WS_SHARE": 1})


@pytest.mark.parametrize("op", ("conv_fwd", "conv_bwd_data"))
def test_shared_workspace_plans_compute_the_convolution_in_numpy(op, rng):
    """WS_SHARE 1 on every shape, blocks of images smaller than the batch (each block places into the
    buffer the last one's C2R read, and computes its spectra where the last one's planes were), with
    and without the phases and with either way back: against float64. cuFFT's C2R in the NumPy model
    overwrites its input with NaN, so a step reading a buffer another already reused shows."""
    def configs(problem):
        base = {k: v for k, v in OPERATIONS[op].candidates(problem, NAME)[0].items()
                if k not in ("FB", "BL", "MAC_ORDER", "DFT_FLAT_B")}
        phases = (0, 1) if takes_phases(problem) else (None,)
        out = []
        for ph in phases:
            for xa, xo in (("cufft", "cufft"), ("cufft", "fdft"), ("dft", "cufft")):
                extra = {} if ph is None else {"STRIDE_PHASES": ph}
                out.append(space(op, problem).complete({**base, **extra, "MAC": "thread", "IT": 1, "JT": 2,
                                                        "IMGS": 1, "XFORM_A": xa,
                                                        "XFORM_O": xo, "WS_SHARE": 1}))
        return out

    problems = small_problems(op)
    assert check_plans(OPERATIONS[op], problems, configs, Kernels, rng, tolerance=1e-11) >= 3 * len(problems)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op, shape", (("conv_fwd", "f_7x5"), ("conv_bwd_data", "f_s2")))
def test_shared_workspace_verifies_under_emulation(op, shape, tmp_path):
    """WS_SHARE 1 with the generated kernels run by the CPU emulator (tests/cuda_emulator.py; cuFFT in
    NumPy, its C2R overwriting its input): blocks of images smaller than the batch, so each block's
    placing writes where the last block's C2R read and its R2C where the last block's crop read;
    conv_bwd_data with its stride's phases apart. fp32, every element against float64 at the bound."""
    from tests.cuda_emulator import emulated_failure

    problem = dict(small_problems(op))[shape]
    assert problem.N > 2
    config = space(op, problem).complete({
        "formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 2, "FFT_THREADS": 64, "IT": 1, "JT": 1, "MAC": "block",
        "FB": 4, "BL": 4, "MAC_ORDER": "tiles", "XFORM_A": "cufft", "XFORM_B": "dft", "XFORM_O": "cufft",
        "WS_SHARE": 1, **({"STRIDE_PHASES": 1} if takes_phases(problem) else {})})
    plan = OPERATIONS[op].plan(problem, config)
    assert {name for name, _ in plan.workspaces} == {"fft_af", "fft_bf", "fft_of"}
    why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, random.randrange(2**31))
    assert why is None, why


@pytest.mark.parametrize("mac", ({"MAC": "thread", "XFORM_A": "cufft", "XFORM_B": "cufft"},
                                 {"MAC": "block", "FB": 8, "BL": 4, "XFORM_A": "dft", "XFORM_B": "cufft"}))
@pytest.mark.parametrize("phases", (0, 1))
def test_wgrad_transforms_back_once_after_accumulating_every_block(mac, phases):
    problem = dict(small_problems("conv_wgrad"))["f_s2"]     # N = 5
    config = space("conv_wgrad", problem).complete({"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 2,
                                                    "FFT_THREADS": 64, "IT": 1, "JT": 2, "STRIDE_PHASES": phases, **mac})
    plan = OPERATIONS["conv_wgrad"].plan(problem, config)
    macs = [s for s in plan.steps if s.kernel == "fft_mac"]
    assert [m.scalars for m in macs] == [(2, 0), (2, 1), (1, 1)]
    assert [s.kind for s in plan.library_ffts].count("c2r") == 1 and plan.steps[-1].kernel == "conv_bias_grad"
    fwd = dict(small_problems("conv_fwd"))["f_s2"]
    fwd_config = {k: v for k, v in config.as_dict().items() if k != "STRIDE_PHASES"}   # conv_fwd has no phases
    steps = OPERATIONS["conv_fwd"].plan(fwd, space("conv_fwd", fwd).complete(fwd_config)).steps
    assert [s.kernel for s in steps[:2]] == ["fft_place_b", "cufftExecR2C"]     # the filters' spectra once
    assert sum(isinstance(s, LibraryFft) and s.kind == "c2r" for s in steps) == 3


@pytest.mark.parametrize("phases", (0, 1))
def test_wgrad_factorised_inverse_computes_only_the_taps_once(phases):
    """conv_wgrad with XFORM_O fdft: one fft_idft after every block of images, over all of O's planes,
    keeping each plane's R x S taps (a sub-filter's with the phases apart), then db; no C2R, no crop,
    no real output planes, and FFT_VEC with nothing left to copy is refused."""
    problem = dict(small_problems("conv_wgrad"))["f_s2"]     # N = 5, with a bias
    sp = space("conv_wgrad", problem)
    config = sp.complete({"formulation": NAME, "IMGS": 2, "FFT_THREADS": 64, "MAC": "thread", "IT": 1, "JT": 2,
                          "STRIDE_PHASES": phases, "XFORM_A": "fdft", "XFORM_B": "dft", "XFORM_O": "fdft"})
    plan = OPERATIONS["conv_wgrad"].plan(problem, config)
    kernels = [s.kernel for s in plan.steps]
    assert kernels.count("fft_mac") == 3 and kernels.count("fft_idft") == 1
    assert kernels[-2:] == ["fft_idft", "conv_bias_grad"] and not plan.library_ffts and "fft_crop" not in kernels
    assert "fft_o" not in dict(plan.workspaces)
    f = fft_conv(problem, bool(phases))
    fh, fw = fft_size(f, "smooth")
    idft = plan.steps[-2]
    assert idft.grid[0] == cdiv(f.out_planes, idft_planes(fh, fw)) and idft.scalars == (0, 1)
    assert kept_columns(problem, bool(phases)) == (0, 1, sub_filter(problem)[1] if phases else problem.S)
    with pytest.raises(InfeasibleConfigError, match="FFT_VEC=4 .* the plan has none"):
        sp.validate({**config.as_dict(), "FFT_VEC": 4})


def test_tiled_multiply_accumulate_blocks_cover_every_output_and_need_cp_async():
    """MAC "block": the grid covers every frequency, row and column of O (rows: the block's images,
    or K for conv_wgrad), its shared memory is two stages of both tiles, and it is refused before
    sm_80, where the other MAC still runs."""
    rng = random.Random(5)
    for op in CONV_OPS:
        for name, problem in [*((n, p) for n, p in seed_problems(op) if n in SEEDS), *small_problems(op)]:
            sp = space(op, problem).restrict({"MAC": "block"})
            for config in sp.sample(rng, 4):
                f = fft_conv(problem, is_phased(config), tile_of(config))
                fh, fw = fft_size(f, config["FFT_SIZE"])
                fb, bi, bj = mac_block(config)
                nb = min(config["IMGS"], problem.N)
                rows, cols = (problem.K, f.phases * problem.C) if op == "conv_wgrad" else (nb, f.out_planes)
                for mac in (s for s in OPERATIONS[op].plan(problem, config).steps if s.kernel == "fft_mac"):
                    gx, gy, gz = mac.grid
                    assert gx * fb >= spectrum(fh, fw) > (gx - 1) * fb, f"{op} {name} {config}"
                    assert gy * bi >= (mac.scalars[0] if op != "conv_wgrad" else rows) and gz * bj >= cols
                    assert mac.shared_bytes == 2 * config["BL"] * (bi + bj) * fb * 8 <= LIMITS.max_smem_per_block
                    assert mac.block == (config["FFT_THREADS"], 1, 1)
    problem = dict(seed_problems("conv_fwd"))["sweep_7x7"]
    old = OPERATIONS["conv_fwd"].space(problem, DeviceLimits("sm_75")).restrict({"formulation": NAME})
    with pytest.raises(InfeasibleConfigError, match="cp.async"):
        old.complete({"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 1, "FFT_THREADS": 128, "IT": 2, "JT": 2,
                      "MAC": "block", "FB": 4, "BL": 8, "XFORM_A": "cufft", "XFORM_B": "cufft"})
    assert OPERATIONS["conv_fwd"].default_config(problem, DeviceLimits("sm_75"), formulation=NAME)["MAC"] == "thread"


def test_tensor_core_multiply_accumulate_blocks_cover_every_output():
    """MAC "mma": a warp is one frequency and 16*IT x 8*JT outputs, the warps of a frequency split
    its rows; the grid covers every frequency, row and column of O; its shared memory is two padded
    stages of both tiles or the outputs' tile, whichever is larger, within the device's limit; both
    precisions; refused before sm_80."""
    rng = random.Random(7)
    for op in CONV_OPS:
        for name, problem in [*((n, p) for n, p in seed_problems(op) if n in SEEDS), *small_problems(op)]:
            for precision in ("fp32", "tf32"):
                problem = dataclasses.replace(problem, precision=precision)
                for config in space(op, problem).restrict({"MAC": "mma"}).sample(rng, 3):
                    f = fft_conv(problem, is_phased(config), tile_of(config))
                    fh, fw = fft_size(f, config["FFT_SIZE"])
                    fb, bi, bj = mma_block(config)
                    assert bi == 16 * config["IT"] * (config["FFT_THREADS"] // 32 // fb) and bj == 8 * config["JT"]
                    nb = min(config["IMGS"], problem.N)
                    rows, cols = (problem.K, f.phases * problem.C) if op == "conv_wgrad" else (nb, f.out_planes)
                    stages = 2 * fb * (config["BL"] * (mma_lead(bi) + mma_lead(bj)) + 8) * 8
                    for mac in (s for s in OPERATIONS[op].plan(problem, config).steps if s.kernel == "fft_mac"):
                        gx, gy, gz = mac.grid
                        assert gx * fb >= spectrum(fh, fw) > (gx - 1) * fb, f"{op} {name} {config}"
                        assert gy * bi >= (mac.scalars[0] if op != "conv_wgrad" else rows) and gz * bj >= cols
                        assert mac.shared_bytes == mma_smem_bytes(config) == max(stages, bi * bj * fb * 8)
                        assert mac.shared_bytes <= LIMITS.max_smem_per_block and mac.block == (config["FFT_THREADS"], 1, 1)
    assert [mma_lead(n) for n in (8, 16, 32, 64, 128)] == [20, 20, 36, 68, 132]   # 4 (mod 16)
    problem = dict(seed_problems("conv_bwd_data"))["sweep_7x7"]
    old = OPERATIONS["conv_bwd_data"].space(problem, DeviceLimits("sm_75")).restrict({"formulation": NAME})
    with pytest.raises(InfeasibleConfigError, match="MAC=mma.*cp.async"):
        old.complete({"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 1, "FFT_THREADS": 128, "IT": 1, "JT": 2,
                      "MAC": "mma", "FB": 4, "BL": 8, "XFORM_A": "cufft", "XFORM_B": "cufft"})


@pytest.mark.parametrize("change, message", [
    ({"FFT_THREADS": 128, "FB": 8}, "FFT_THREADS=128 is not a multiple of 256"),
    ({"BL": 4}, "BL=4 is not a multiple of 8"),
    ({"IT": 8, "JT": 1}, "at most 4 m16 tiles a warp along the rows, not IT=8"),
    ({"IT": 2, "JT": 8}, "IT=2, JT=8 needs 256 accumulators a thread \\(fp32\\), more than 128"),
])
def test_tensor_core_multiply_accumulate_refuses_what_it_cannot_run(change, message):
    problem = dict(seed_problems("conv_bwd_data"))["sweep_7x7"]
    base = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 32, "FFT_THREADS": 256, "IT": 1, "JT": 4, "MAC": "mma",
            "FB": 4, "BL": 16, "XFORM_A": "cufft", "XFORM_B": "dft"}
    sp = space("conv_bwd_data", problem)
    assert sp.complete(base)["MAC"] == "mma"
    with pytest.raises(InfeasibleConfigError, match=message):
        sp.complete({**base, **change})
    # tf32 keeps no partial sums apart: twice the tile fits in the same accumulators.
    tf32 = space("conv_bwd_data", dataclasses.replace(problem, precision="tf32"))
    assert tf32.complete({**base, "IT": 2, "JT": 8})["JT"] == 8


def test_tensor_core_fragment_reads_are_free_of_bank_conflicts():
    """MAC "mma" reads its fragments as 8-byte complex numbers from [term][row] tiles whose row pitch
    is mma_lead(rows): a half-warp's 16 reads then fall on 16 different bank pairs (shared memory
    serves 16 eight-byte words a pass), for the A fragment (rows g and g+8, terms t and t+4) and the
    B fragment (terms t and t+4, column g) of every tile size the configs give, at any warp offset
    (a multiple of 16 rows, or 8 columns a tile). The index formulas are _fft_glue.cuh.j2's (mma_lead)."""
    for rows in (16, 32, 48, 64, 96, 128, 192, 256):            # BI = 16 * IT * warps a frequency
        ld = mma_lead(rows)
        for first in range(0, rows, 16):
            for q in range(4):
                for half in (range(16), range(16, 32)):
                    words = {((lane % 4 + (q >> 1) * 4) * ld + first + lane // 4 + (q & 1) * 8) % 16 for lane in half}
                    assert len(words) == 16, (rows, first, q)
    for cols in (8, 16, 32, 64):                                 # BJ = 8 * JT
        ld = mma_lead(cols)
        for first in range(0, cols, 8):
            for q in range(2):
                for half in (range(16), range(16, 32)):
                    words = {((lane % 4 + q * 4) * ld + first + lane // 4) % 16 for lane in half}
                    assert len(words) == 16, (cols, first, q)
    # Without the padding a power-of-two pitch puts the four terms of a half-warp on one bank pair.
    assert len({((lane % 4) * 64 + lane // 4) % 16 for lane in range(16)}) == 4


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_tensor_core_multiply_accumulate_builds_without_spills(builds, tmp_path):
    """The largest tiles each precision allows (128 accumulators a thread) and the tuned shapes of
    sweep_7x7 and sweep_11x11 compile for sm_90 with no spills, every op."""
    jobs = []
    for op in CONV_OPS:
        for row in ("sweep_7x7", "sweep_11x11"):
            for precision, tiles in (("fp32", ((1, 8), (2, 4), (1, 4))), ("tf32", ((2, 8), (4, 4), (2, 4)))):
                problem = dataclasses.replace(dict(seed_problems(op))[row], precision=precision)
                for (it, jt), (fb, bl) in zip(tiles, ((4, 16), (8, 8), (4, 8))):
                    config = space(op, problem).complete(
                        {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 64, "FFT_THREADS": 256, "IT": it, "JT": jt,
                         "MAC": "mma", "FB": fb, "BL": bl, "XFORM_A": "cufft", "XFORM_B": "dft"})
                    jobs.append((f"{op} {row} {precision} {config}", OPERATIONS[op].plan(problem, config), True))
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("op, phases", [(op, ph) for op in CONV_OPS for ph in ((0, 1) if op != "conv_fwd" else (None,))])
def test_direct_transforms_replace_placing_and_r2c_of_their_operand(op, phases):
    """XFORM_A / XFORM_B = dft: one fft_dft_a/b launch (DFT_PLANES planes a block, its shared
    memory from the operand's data planes) where place + cuFFT R2C were, for every block of images
    that transforms the operand; the other operand and the C2R are untouched."""
    problem = dict(small_problems(op))["f_s2"]                  # N = 5: blocks of 2, 2 and 1
    base = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 2, "FFT_THREADS": 64, "IT": 1, "JT": 2,
            "MAC": "thread", **({} if phases is None else {"STRIDE_PHASES": phases})}
    sizes = operand_sizes(problem, bool(phases))
    fh, fw = fft_size(fft_conv(problem, bool(phases)), "smooth")
    cufft = OPERATIONS[op].plan(problem, space(op, problem).complete({**base, "XFORM_A": "cufft", "XFORM_B": "cufft"}))
    for xa, xb in (("dft", "cufft"), ("cufft", "dft"), ("dft", "dft"), ("fdft", "cufft"), ("dft", "fdft"),
                   ("fdft", "fdft")):
        plan = OPERATIONS[op].plan(problem, space(op, problem).complete({**base, "XFORM_A": xa, "XFORM_B": xb}))
        names = [s.kernel if not isinstance(s, LibraryFft) else f"{s.kind}:{s.src}" for s in plan.steps]
        before = [s.kernel if not isinstance(s, LibraryFft) else f"{s.kind}:{s.src}" for s in cufft.steps]
        for operand, xform in (("a", xa), ("b", xb)):
            if xform != "cufft":
                before = [n for n in before if n != f"r2c:fft_{operand}"]
                before = [f"fft_dft_{operand}" if n == f"fft_place_{operand}" else n for n in before]
                f = fft_conv(problem, bool(phases))
                for step in (s for s in plan.steps if s.kernel == f"fft_dft_{operand}"):
                    nb = step.scalars[1]
                    planes = nb * (f.a_planes if operand == "a" else f.b_planes)   # filters: nb = 1
                    assert step.grid == (cdiv(planes, DFT_PLANES), 1, 1) and step.block == (64, 1, 1)
                    smem = (dft_smem_bytes if xform == "dft" else fdft_smem_bytes)(sizes[operand.upper()], fh, fw)
                    assert step.shared_bytes == smem
        assert names == before, f"{op} {xa} {xb}"


def test_configs_from_before_the_tiled_multiply_accumulate_complete_to_the_thread_one():
    """A stale fft record (tuned before MAC, XFORM, XFORM_O, WS_SHARE, FFT_VEC, FFT_TILE and
    RADIX_THREADS existed) is a first guess for its retune: completed, it names the multiply-accumulate,
    the transforms, the buffers, the copies (one element a thread), the whole planes it ran and no
    radix block size of its own."""
    problem = dict(seed_problems("conv_bwd_data"))["sweep_11x11"]
    old = {"formulation": NAME, "IMGS": 64, "FFT_SIZE": "smooth", "FFT_THREADS": 256, "IT": 4, "JT": 4}
    assert space("conv_bwd_data", problem).complete(old).as_dict() == {**old, "MAC": "thread", "XFORM_A": "cufft",
                                                                        "XFORM_B": "cufft", "XFORM_O": "cufft",
                                                                        "WS_SHARE": 0, "FFT_VEC": 1, "FFT_TILE": 0,
                                                                        "RADIX_THREADS": 0}


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_templates_build_without_spills(arch, tmp_path):
    problems = {op: [*((n, p) for n, p in seed_problems(op) if n in SEEDS[:2]), *small_problems(op)[:3]]
                for op in CONV_OPS}
    failures = build_failures(OPERATIONS, NAME, problems, arch, tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_tensor_core_multiply_accumulate_verifies_against_float64_on_the_gpu(op):
    """MAC "mma" in both precisions: fp32 (3xTF32) within the FP32 bound and tf32 within its own,
    every element checked, on the odd large-filter shapes (batch 1, asymmetric padding, strides,
    an image smaller than its filter's reach) and the 7x7 sweep row."""
    pytest.importorskip("cupy")
    problems = [*small_problems(op), ("sweep_7x7", dict(seed_problems(op))["sweep_7x7"])]
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 2, WORKSPACE_LIMIT_BYTES, fixed={"MAC": "mma"})


@pytest.mark.gpu
@pytest.mark.slow   # conv_bwd_data alone ran past 200 s on an H100
@pytest.mark.parametrize("op", CONV_OPS)
def test_fft_verifies_against_float64_on_the_gpu(op):
    """Default candidates and sampled configs of the seed shapes with large filters (5x5 to 11x11,
    strided ones included) and of odd ones (batch 1, asymmetric padding, an image smaller than the
    filter's reach) pass the FP32 bound, every element checked, the workspace within the limit."""
    pytest.importorskip("cupy")
    problems = [(n, p) for n, p in seed_problems(op) if n in SEEDS] + small_problems(op)
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 3, WORKSPACE_LIMIT_BYTES)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_stride_phases_build_without_spills(builds, tmp_path):
    """STRIDE_PHASES=1 on scherer10_l2 (the row it is for) and the strided odd shapes, every
    multiply-accumulate and both transforms of each operand, both precisions, for sm_90."""
    jobs = []
    for op in ("conv_bwd_data", "conv_wgrad"):
        problems = [("scherer10_l2", dict(seed_problems(op))["scherer10_l2"]),
                    *((n, p) for n, p in small_problems(op) if takes_phases(p))]
        for name, problem in problems:
            for precision in ("fp32", "tf32"):
                problem = dataclasses.replace(problem, precision=precision)
                base = {k: v for k, v in OPERATIONS[op].candidates(problem, NAME)[0].items()
                        if k not in ("FB", "BL", "MAC_ORDER", "DFT_FLAT_B")}
                for mac, xform in ((({"MAC": "mma", "IT": 1, "JT": 4, "FB": 4, "BL": 8}), "dft"),
                                   (({"MAC": "block", "IT": 2, "JT": 2, "FB": 4, "BL": 8}), "cufft"),
                                   (({"MAC": "thread", "IT": 2, "JT": 2}), "dft")):
                    config = space(op, problem).complete({**base, **mac, "IMGS": 1, "STRIDE_PHASES": 1,
                                                          "XFORM_A": xform, "XFORM_B": xform})
                    jobs.append((f"{op} {name} {precision} {config}", OPERATIONS[op].plan(problem, config), True))
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", ("conv_bwd_data", "conv_wgrad"))
def test_stride_phases_verify_against_float64_on_the_gpu(op):
    """STRIDE_PHASES=1 in both precisions (fp32 within the FP32 bound, tf32 within its own), every
    element checked: the strided odd shapes (strides 2 and 3 with asymmetric padding, filters no
    stride divides, batch 1) and scherer10_l3 (8x8, stride 2)."""
    pytest.importorskip("cupy")
    problems = [*((n, p) for n, p in small_problems(op) if takes_phases(p)),
                ("s3_9x8", PROBLEM_TYPES[op](N=3, C=3, H=20, W=17, K=4, R=9, S=8, stride=3, padding=(4, 2, 1, 3))),
                ("scherer10_l3", dict(seed_problems(op))["scherer10_l3"])]
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 3, WORKSPACE_LIMIT_BYTES, fixed={"STRIDE_PHASES": 1})


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_factorised_transforms_build_without_spills(builds, tmp_path):
    """XFORM fdft for either operand and XFORM_O fdft for the way back on the sweep rows and
    scherer10_l2 (phases apart and not), every op, for sm_90: the kernels are there and spill nothing."""
    jobs = []
    for op in CONV_OPS:
        for row in ("sweep_7x7", "sweep_11x11", "scherer10_l2"):
            problem = dict(seed_problems(op))[row]
            for ph in ((0, 1) if takes_phases(problem) else (None,)):
                for xa, xb, xo in (("fdft", "fdft", "fdft"), ("fdft", "dft", "cufft"), ("cufft", "dft", "fdft")):
                    config = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 1, "FFT_THREADS": 256, "IT": 2,
                              "JT": 2, "MAC": "thread", "XFORM_A": xa, "XFORM_B": xb,
                              **({} if ph is None else {"STRIDE_PHASES": ph}), "XFORM_O": xo}
                    try:
                        config = space(op, problem).complete(config)
                    except InfeasibleConfigError:
                        continue   # scherer10_l2 spread at the stride: 135 x 135 planes exceed shared memory
                    jobs.append((f"{op} {row} {config}", OPERATIONS[op].plan(problem, config), True))
    assert len(jobs) >= 20 and sum("fft_idft" in [st.kernel for st in job[1].steps] for job in jobs) >= 12
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_factorised_transforms_verify_against_float64_on_the_gpu(op):
    """XFORM_A=fdft (images, dY or X's phases) in both precisions on the odd large-filter shapes and
    the 11x11 sweep row, every element within the bound."""
    pytest.importorskip("cupy")
    problems = [*small_problems(op), ("sweep_11x11", dict(seed_problems(op))["sweep_11x11"])]
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 2, WORKSPACE_LIMIT_BYTES, fixed={"XFORM_A": "fdft"})


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_factorised_inverse_verifies_against_float64_on_the_gpu(op):
    """XFORM_O=fdft (the kept outputs straight from the spectra, bias and activation fused; the weight
    gradient's taps once after every block) in both precisions on the odd large-filter shapes
    (strides, asymmetric padding, batch 1, an image smaller than its filter's reach), the 11x11 sweep
    row and scherer10_l2 (its backward-data and weight gradient with the phases apart or not), every
    element within the bound."""
    pytest.importorskip("cupy")
    problems = [*small_problems(op), *((row, dict(seed_problems(op))[row]) for row in ("sweep_11x11", "scherer10_l2"))]
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 2, WORKSPACE_LIMIT_BYTES, fixed={"XFORM_O": "fdft"})


@pytest.mark.gpu
@pytest.mark.parametrize("op", ("conv_fwd", "conv_bwd_data"))
def test_shared_workspace_verifies_against_float64_on_the_gpu(op):
    """WS_SHARE 1 with blocks of two images on the odd large-filter shapes of more than two images
    (so each block's placing and R2C overwrite what the last block's C2R and crop read), in both
    precisions, then scherer10_l2's backward-data with all its images in one block, the case WS_SHARE
    is for: every element within the bound, the workspace within the limit."""
    pytest.importorskip("cupy")
    problems = [(n, p) for n, p in small_problems(op) if p.N > 2]
    assert problems
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 2, WORKSPACE_LIMIT_BYTES,
                           fixed={"WS_SHARE": 1, "IMGS": 2})
    if op == "conv_bwd_data":   # scherer10_l2's forward has no fft config of 64 images within the limit
        scherer = dict(seed_problems(op))["scherer10_l2"]
        assert_verifies_on_gpu(OPERATIONS[op], NAME, [("scherer10_l2", scherer)], 1, WORKSPACE_LIMIT_BYTES,
                               fixed={"WS_SHARE": 1, "IMGS": next_pow2(scherer.N)})


# -- FFT_VEC: the placing and cropping copies, four consecutive elements a thread --------------------

def copy_problems(op: str) -> list[tuple[str, object]]:
    """The odd large-filter shapes, and for conv_fwd one whose 177 filter planes of 9 x 9 hold 14,337
    elements: 3,584 runs of four fill 56 blocks of 64 threads exactly, and the last element needs a
    run, and a block, of its own."""
    out = small_problems(op)
    if op == "conv_fwd":
        out.append(("f_tail", PROBLEM_TYPES[op](N=2, C=3, H=5, W=5, K=59, R=5, S=5, stride=1, padding=2)))
    return out


# Every shape of copy_problems, with and without its stride's phases where it has them.
COPY_CASES = [(op, name, ph) for op in CONV_OPS for name, p in copy_problems(op)
              for ph in ((0, 1) if takes_phases(p) else (None,))]
COPIES = ("fft_place_a", "fft_place_b", "fft_crop")


def with_copies(op, problem, phases, vec, **change):
    """A config whose plan has every copy (both operands placed, cuFFT both ways) at FFT_VEC=vec, in
    blocks of two images where the batch has more (so that a block's outputs start at an odd element
    on the odd shapes)."""
    config = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": min(2, problem.N), "FFT_THREADS": 64, "IT": 1, "JT": 1,
              "MAC": "thread", "XFORM_A": "cufft", "XFORM_B": "cufft", "FFT_VEC": vec,
              **({} if phases is None else {"STRIDE_PHASES": phases}),
              **({"XFORM_O": "cufft", "WS_SHARE": 0} if op != "conv_wgrad" else {}), **change}
    return space(op, problem).complete(config)


def copied_elements(problem, config, step):
    """The elements a copy writes: placed planes of A or B (a block's, or the filters' once), or the
    outputs it crops (a block's, or conv_wgrad's dW once)."""
    p, f = problem, fft_conv(problem, is_phased(config), tile_of(config))
    fh, fw = fft_size(f, config["FFT_SIZE"])
    nb = step.scalars[1]
    if step.kernel == "fft_place_a":
        return nb * f.tiles * f.a_planes * fh * fw
    if step.kernel == "fft_place_b":
        return (nb * f.tiles if p.op == "conv_wgrad" else 1) * f.b_planes * fh * fw
    return {"conv_fwd": nb * p.K * p.P * p.Q, "conv_bwd_data": nb * p.C * p.H * p.W,
            "conv_wgrad": p.K * p.C * p.R * p.S}[p.op]


def test_vectorised_copies_take_a_thread_per_run_of_four_and_change_nothing_else():
    """FFT_VEC=4 changes only the grids of the copies (fft_place_a, fft_place_b, fft_crop): a thread
    for each four consecutive elements of the destination, the last run cut short; every other step
    of the plan, and each copy's arguments and scalars, are FFT_VEC=1's. 1 is the first choice, and
    the default candidates keep it."""
    for op, name, ph in COPY_CASES:
        problem = dict(copy_problems(op))[name]
        one, four = (with_copies(op, problem, ph, vec) for vec in (1, 4))
        steps_one, steps_four = OPERATIONS[op].plan(problem, one).steps, OPERATIONS[op].plan(problem, four).steps
        assert len(steps_one) == len(steps_four) and {s.kernel for s in steps_four} >= set(COPIES)
        for a, b in zip(steps_one, steps_four):
            if b.kernel not in COPIES:
                assert a == b, f"{op} {name} {ph}"
                continue
            elements = copied_elements(problem, four, b)
            assert a.grid == (cdiv(elements, 64), 1, 1) and b.grid == (cdiv(cdiv(elements, 4), 64), 1, 1)
            assert dataclasses.replace(a, grid=b.grid) == b, f"{op} {name} {ph}"
        assert space(op, problem).param("FFT_VEC").choices[0] == 1
        assert all(c["FFT_VEC"] == 1 for c in OPERATIONS[op].candidates(problem, NAME))


def test_vectorised_copies_need_a_copy_to_vectorise():
    """FFT_VEC=4 where conv_fwd's or conv_bwd_data's plan has no copy (both operands and the way back
    transformed directly) is refused, saying why; any one copy admits it, and conv_wgrad, which
    always crops dW, always does."""
    for op in ("conv_fwd", "conv_bwd_data"):
        problem = dict(small_problems(op))["f_7x5"]
        with pytest.raises(InfeasibleConfigError, match="FFT_VEC=4 .* the plan has none: only FFT_VEC=1"):
            with_copies(op, problem, None, 4, XFORM_A="fdft", XFORM_B="dft", XFORM_O="fdft")
        assert with_copies(op, problem, None, 1, XFORM_A="fdft", XFORM_B="dft", XFORM_O="fdft")["FFT_VEC"] == 1
        for xa, xb, xo in (("cufft", "dft", "fdft"), ("fdft", "cufft", "fdft"), ("fdft", "dft", "cufft")):
            plan = OPERATIONS[op].plan(problem, with_copies(op, problem, None, 4, XFORM_A=xa, XFORM_B=xb, XFORM_O=xo))
            assert len([s for s in plan.steps if s.kernel in COPIES]) >= 1
    problem = dict(small_problems("conv_wgrad"))["f_7x5"]
    plan = OPERATIONS["conv_wgrad"].plan(problem, with_copies("conv_wgrad", problem, None, 4, XFORM_A="fdft",
                                                              XFORM_B="fdft"))
    assert [s.kernel for s in plan.steps if s.kernel in COPIES] == ["fft_crop"]


@pytest.mark.parametrize("op", CONV_OPS)
def test_vectorised_copies_compute_the_convolution_in_numpy(op, rng):
    """FFT_VEC=4 plans (every copy, blocks of two images; with and without the phases; forward and
    backward-data also with WS_SHARE 1) on every odd shape: against float64."""
    def configs(problem):
        phases = (0, 1) if takes_phases(problem) else (None,)
        shares = ({}, {"WS_SHARE": 1}) if op != "conv_wgrad" else ({},)
        return [with_copies(op, problem, ph, 4, **share) for ph in phases for share in shares]

    problems = copy_problems(op)
    assert check_plans(OPERATIONS[op], problems, configs, Kernels, rng, tolerance=1e-11) >= len(problems)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op, shape, phases", COPY_CASES)
def test_vectorised_copies_verify_under_emulation(op, shape, phases, tmp_path):
    """The generated FFT_VEC=4 copies run by the CPU emulator (cuFFT in NumPy) on every odd shape of
    each op, with and without the stride's phases: planes whose size is odd (runs that cross rows and
    planes, float4 stores at any run of them), a last run cut short, blocks of two images whose outputs
    start at an odd element (scalar stores there), bias and activation in conv_fwd's crop. fp32,
    every element against float64 at the bound."""
    from tests.cuda_emulator import emulated_failure

    problem = dict(copy_problems(op))[shape]
    config = with_copies(op, problem, phases, 4)
    why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, random.randrange(2**31))
    assert why is None, why


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_vectorised_copies_build_without_spills(builds, tmp_path):
    """FFT_VEC=4 on scherer10_l2 (the row it is for: backward-data with the phases apart), sweep_7x7
    and the strided odd shape, every op, phases apart and not, both precisions, for sm_90: every
    kernel there, none spilling."""
    jobs = []
    for op in CONV_OPS:
        problems = [(row, dict(seed_problems(op))[row]) for row in ("scherer10_l2", "sweep_7x7")]
        problems += [(n, p) for n, p in small_problems(op) if n in ("f_s2", "f_7x5_relu")]
        for name, problem in problems:
            for precision in ("fp32", "tf32"):
                problem = dataclasses.replace(problem, precision=precision)
                for ph in ((0, 1) if takes_phases(problem) else (None,)):
                    config = with_copies(op, problem, ph, 4, IMGS=1, FFT_THREADS=256, MAC="block", IT=2, JT=2, FB=4,
                                         BL=8, MAC_ORDER="tiles")
                    jobs.append((f"{op} {name} {precision} {config}", OPERATIONS[op].plan(problem, config), True))
    assert len(jobs) >= 20
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_vectorised_copies_verify_against_float64_on_the_gpu(op):
    """FFT_VEC=4 with every copy in the plan (both operands placed; cuFFT and the crop on the way
    back) in both precisions on the odd large-filter shapes, with and without the stride's phases
    where a shape has them; then conv_bwd_data's scherer10_l2 as it was measured (phases apart, all
    60 images in one block with WS_SHARE 1): every element within the bound, the workspace within
    the limit. On the GPU a misaligned float4 store would fault, which the emulator cannot show."""
    pytest.importorskip("cupy")
    copies = {"FFT_VEC": 4, "XFORM_A": "cufft", **({"XFORM_O": "cufft"} if op != "conv_wgrad" else {"XFORM_B": "cufft"})}
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in small_problems(op) for pr in ("fp32", "tf32")]
    plain = [(n, p) for n, p in problems if not takes_phases(p)]
    strided = [(n, p) for n, p in problems if takes_phases(p)]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, plain, 2, WORKSPACE_LIMIT_BYTES, fixed=copies)
    for phases in ((0, 1) if strided else ()):
        assert_verifies_on_gpu(OPERATIONS[op], NAME, strided, 2, WORKSPACE_LIMIT_BYTES,
                               fixed={**copies, "STRIDE_PHASES": phases})
    if op == "conv_bwd_data":
        scherer = dict(seed_problems(op))["scherer10_l2"]
        assert_verifies_on_gpu(OPERATIONS[op], NAME, [("scherer10_l2", scherer)], 1, WORKSPACE_LIMIT_BYTES,
                               fixed={**copies, "STRIDE_PHASES": 1, "WS_SHARE": 1, "IMGS": next_pow2(scherer.N)})


# -- FFT tiles (FFT_TILE) --------------------------------------------------------------------------

def big_problem(op: str, **kw):
    """An image whose whole padded planes exceed MAX_FFT (300 x 270 with a 5x5 filter), odd everywhere:
    only FFT tiles serve it."""
    args = dict(N=2, C=3, H=300, W=271, K=5, R=5, S=5, stride=1, padding=(2, 1, 3, 2))
    return PROBLEM_TYPES[op](**{**args, **kw})


def tiled(op, problem, tile, **over):
    """A tiled config of ``problem``: block multiply-accumulate, placed operands and cuFFT's way back
    unless ``over`` says otherwise."""
    config = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": min(2, problem.N), "FFT_THREADS": 64, "IT": 1,
              "JT": 1, "MAC": "block", "FB": 4, "BL": 4, "MAC_ORDER": "tiles", "XFORM_A": "cufft", "XFORM_B": "cufft",
              "FFT_VEC": 1, "FFT_TILE": tile, **({"STRIDE_PHASES": 0} if takes_phases(problem) else {}),
              **({"XFORM_O": "cufft", "WS_SHARE": 0} if op != "conv_wgrad" else {})}
    config |= over
    if config["MAC"] not in ("block", "mma"):   # the tiled multiply-accumulates' own parameters
        config = {k: v for k, v in config.items() if k not in ("FB", "BL", "MAC_ORDER")}
    if config["MAC"] == "cublas":               # and the generated ones'
        config = {k: v for k, v in config.items() if k not in ("IT", "JT")}
    return space(op, problem).complete(config)


def test_fft_tiles_cover_every_output_from_windows_that_fit_their_planes():
    """For every op, tile edge, stride and filter (strides 1-3, filters 5x5 to 11x7): the tiles cover
    the output plane exactly (the last one may hang over), each tile's window fits its F x F plane,
    and a window reads what the tile's outputs need: conv_fwd's last output of a tile reads window
    row (TY - 1)*SH + R - 1, conv_bwd_data's first reads window rows 0 .. R - 1."""
    make = PROBLEM_TYPES
    checked = 0
    for op in CONV_OPS:
        for stride in (1, 2, 3):
            for r, s in ((5, 5), (11, 7), (6, 9)):
                p = make[op](N=1, C=1, H=200, W=157, K=1, R=r, S=s, stride=stride, padding=(2, 1, 0, 3))
                for tile in TILES_F[1:]:
                    if tile <= max(r, s):
                        continue
                    t = fft_tiles(p, tile)
                    extent = (p.H, p.W) if op == "conv_bwd_data" else (p.P, p.Q)
                    for size, n, out in ((t.TY, t.TH, extent[0]), (t.TX, t.TW, extent[1])):
                        assert size >= 1 and size * n >= out > size * (n - 1), f"{op} {p} {tile} {t}"
                    assert max(t.window_a) <= tile and (t.window_b is None or max(t.window_b) <= tile)
                    if op == "conv_bwd_data":
                        assert t.window_a == (t.TY + r - 1, t.TX + s - 1)
                    else:
                        assert t.window_a == ((t.TY - 1) * stride + r, (t.TX - 1) * stride + s)
                    f = fft_conv(p, False, tile)
                    assert fft_size(f, "smooth") == fft_size(f, "pow2") == (tile, tile) and f.tiles == t.count
                    checked += 1
    assert checked >= 100


def test_fft_tiles_are_ruled_by_what_they_can_run():
    """FFT_TILE refuses, naming why: the stride's phases apart (tiles take dY spread), FFT_SIZE pow2
    (the tile sets the size), a plane with no room beside the filter, one tile over the whole output.
    Whole planes (0) stay the first choice, and the workspace counts every tile's planes."""
    strided = big_problem("conv_bwd_data", stride=2)
    cases = [(strided, {"STRIDE_PHASES": 1}, "only with STRIDE_PHASES=0"),
             (big_problem("conv_fwd"), {"FFT_SIZE": "pow2"}, "only with FFT_SIZE=smooth"),
             (big_problem("conv_fwd", R=17, S=3), {"FFT_TILE": 16}, "no room for a tile beside the 17x3 filter"),
             (dict(small_problems("conv_fwd"))["f_tiny"], {"FFT_TILE": 16}, "one tile covers the whole output")]
    for problem, change, message in cases:
        sp = space(problem.op, problem)
        if "FFT_SIZE" in change and "pow2" not in sp.param("FFT_SIZE").choices:
            continue
        with pytest.raises(InfeasibleConfigError, match=message):
            sp.validate({**tiled(problem.op, problem, 32).as_dict(), **change})
    assert space("conv_fwd", big_problem("conv_fwd")).param("FFT_TILE").choices[0] == 0
    p = big_problem("conv_wgrad")
    config = tiled("conv_wgrad", p, 32)
    t = fft_tiles(p, 32)
    sizes = dict(OPERATIONS["conv_wgrad"].plan(p, config).workspaces)
    assert sizes["fft_a"] == 2 * t.count * p.C * 32 * 32 and sizes["fft_b"] == 2 * t.count * p.K * 32 * 32
    assert sizes["fft_of"] == p.K * p.C * 2 * spectrum(32, 32)


def tile_cases(op):
    """(name, problem, config) for the tile tests: every odd shape that two tiles or more cut at 16, and
    the big image at 32 and 64; the transforms and the way back rotating over placed + cuFFT, dft and
    fdft, FFT_VEC 1 and 4."""
    forms = ({"XFORM_A": "cufft", "XFORM_B": "cufft", "FFT_VEC": 1}, {"XFORM_A": "dft", "XFORM_B": "fdft", "FFT_VEC": 1},
             {"XFORM_A": "fdft", "XFORM_B": "dft", "FFT_VEC": 4})
    out = []
    problems = [(n, p, 16) for n, p in small_problems(op) if fft_tiles(p, 16).count > 1 and max(p.R, p.S) < 16]
    problems += [("big", big_problem(op), 32), ("big_s2", big_problem(op, N=1, stride=2), 64)]
    for i, (name, problem, tile) in enumerate(problems):
        form = dict(forms[i % 3])
        form["XFORM_O"] = "fdft" if i % 3 == 1 else "cufft"
        out.append((f"{name} F={tile}", problem, tiled(op, problem, tile, **form)))
    return out


@pytest.mark.parametrize("op", CONV_OPS)
def test_fft_tiles_compute_the_convolution_in_numpy(op, rng):
    """Tiled plans with the kernels written from each op's definition (windows cut from the padded
    or spread input, each tile's outputs put in place): the float64 reference's result to rounding,
    on the odd shapes and on an image past MAX_FFT, strided too."""
    cases = tile_cases(op)
    config_of = {problem: config for _, problem, config in cases}
    assert len(config_of) == len(cases) >= 4
    checked = check_plans(OPERATIONS[op], [(name, problem) for name, problem, _ in cases],
                          lambda problem: [config_of[problem]], Kernels, rng, tolerance=1e-11)
    assert checked == len(cases)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op", CONV_OPS)
def test_fft_tiles_verify_under_emulation(op, tmp_path):
    """The generated tiled kernels run by the CPU emulator (cuFFT in NumPy) on the odd shapes: windows
    at the image's edges and past them (zeros), strides 2 and 3, asymmetric padding, tiles hanging over
    the output, bias and activation in conv_fwd's crop and inverse. fp32, every element against
    float64 at the bound."""
    from tests.cuda_emulator import emulated_failure

    cases = [c for c in tile_cases(op) if not c[0].startswith("big")]
    assert len(cases) >= 3
    for name, problem, config in cases:
        why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, random.randrange(2**31))
        assert why is None, f"{name}: {why}"


def precision_jobs(op, cases, change_by_precision):
    """compile_failures' jobs: each (name, problem, config) case in every precision of
    ``change_by_precision``, its config changed as that says (precision -> parameters)."""
    jobs = []
    for name, problem, config in cases:
        for precision, change in change_by_precision.items():
            p = dataclasses.replace(problem, precision=precision)
            c = space(op, p).complete({**config.as_dict(), **change})
            jobs.append((f"{op} {name} {precision} {c}", OPERATIONS[op].plan(p, c), True))
    return jobs


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_fft_tiles_build_without_spills(builds, tmp_path):
    """Every tile case of every op, both precisions, MAC block and mma, for sm_90: every kernel there,
    none spilling."""
    mac = {"fp32": {"MAC": "mma", "BL": 8, "FFT_THREADS": 128}, "tf32": {}}
    jobs = [job for op in CONV_OPS for job in precision_jobs(op, tile_cases(op), mac)]
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_fft_tiles_verify_against_float64_on_the_gpu(op):
    """FFT tiles on the GPU in both precisions: the odd shapes at 16 and the image past MAX_FFT (only
    tiles serve it) with its default and sampled tiled configs: every element within the bound, the
    workspace within the limit."""
    pytest.importorskip("cupy")
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p, _ in
                ((n, p, c) for n, p, c in tile_cases(op) if not n.startswith("big")) for pr in ("fp32", "tf32")]
    for strided in (False, True):   # STRIDE_PHASES (0 with tiles) is a parameter of strided ones only
        group = [(n, p) for n, p in problems if takes_phases(p) == strided]
        if group:
            assert_verifies_on_gpu(OPERATIONS[op], NAME, group, 2, WORKSPACE_LIMIT_BYTES,
                                   fixed={"FFT_TILE": 16, **({"STRIDE_PHASES": 0} if strided else {})})
    big = [(f"big {pr}", big_problem(op, precision=pr)) for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, big, 3, WORKSPACE_LIMIT_BYTES)


def assert_cases_verify_under_emulation(op, cases, tmp_path):
    """Each (name, problem, config) case's generated kernels run by the CPU emulator (cuFFT and
    cuBLAS in NumPy) verify against float64 at the bound, every element."""
    from tests.cuda_emulator import emulated_failure

    for name, problem, config in cases:
        why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, random.randrange(2**31))
        assert why is None, f"{name}: {why}"


def assert_cases_verify_on_the_gpu(op, cases):
    """Each (name, problem, config) case in both precisions (MAC_CROSS, fp32's alone, completed again
    for each) verifies on the GPU against float64 at the bound, every element."""
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    loader, failures = KernelLoader(), []
    for name, problem, config in cases:
        for precision in ("fp32", "tf32"):
            p = dataclasses.replace(problem, precision=precision)
            c = space(op, p).complete({k: v for k, v in config.as_dict().items() if k != "MAC_CROSS"})
            check = check_candidate(loader.load(OPERATIONS[op].plan(p, c)), p, time_it=False)
            if not check.verification.passed:
                failures.append(f"{name} {precision} {c}: {check.verification.message}")
    assert not failures, "\n".join(failures)


def assert_cases_compute_in_numpy(op, cases, rng):
    """Each (name, problem, config) case's plan in NumPy gives the float64 reference's result to
    rounding; at least six cases."""
    config_of = {problem: config for _, problem, config in cases}
    checked = check_plans(OPERATIONS[op], [(name, problem) for name, problem, _ in cases],
                          lambda problem: [config_of[problem]], Kernels, rng, tolerance=1e-11)
    assert checked == len(cases) >= 6


# MAC "cublas": cuBLAS's batched complex GEMM, one a frequency, on frequency-major spectra.

def cublas_cases(op):
    """(name, problem, config) with MAC "cublas" on the odd shapes: blocks of images smaller than the
    batch, each transform of A and B in turn (placed + cuFFT's strided R2C, dft, fdft), both ways back
    (cuFFT's strided C2R and crop, the factorised inverse), the stride's phases apart where strided,
    WS_SHARE and one case in FFT tiles."""
    forms = (("cufft", "dft", "fdft"), ("dft", "fdft", "cufft"), ("fdft", "cufft", "fdft"))
    out = []
    for i, (name, problem) in enumerate(small_problems(op)):
        xa, xb, xo = forms[i % 3]
        config = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": min(2, problem.N), "FFT_THREADS": 64,
                  "MAC": "cublas", "XFORM_A": xa, "XFORM_B": xb, "FFT_VEC": 1, "FFT_TILE": 0}
        config["XFORM_O"] = xo
        if op != "conv_wgrad":
            config["WS_SHARE"] = int(xa == "cufft" or xo == "cufft") * (i % 2)
        if takes_phases(problem):
            config["STRIDE_PHASES"] = (i + 1) % 2
        out.append((name, problem, space(op, problem).complete(config)))
    name, tiled_problem = next((n, p) for n, p in small_problems(op) if fft_tiles(p, 16).count > 1 and max(p.R, p.S) < 16)
    out.append((f"{name} F=16", tiled_problem, tiled(op, tiled_problem, 16, MAC="cublas",
                                                    XFORM_A="fdft", XFORM_B="dft", XFORM_O="fdft")))
    return out


@pytest.mark.parametrize("op", CONV_OPS)
def test_cublas_multiply_accumulate_is_a_complex_gemm_a_frequency_on_frequency_major_spectra(op):
    """The plan calls cuBLAS once a block of images (batch = the half spectrum's frequencies) where
    the generated kernel ran, every cuFFT step takes its spectra frequency-major, the source has no
    multiply-accumulate kernel and the transforms write (and the inverse reads) frequency-major; tf32
    problems alone let cuBLAS use TF32; it has no IT and JT (outputs a thread of a generated one)."""
    problem = dict(small_problems(op))["f_s2"]     # N = 5: blocks of 2, 2 and 1 images
    for precision in ("fp32", "tf32"):
        p = dataclasses.replace(problem, precision=precision)
        config = space(op, p).complete({"formulation": NAME, "IMGS": 2, "MAC": "cublas",
                                        "XFORM_A": "cufft", "XFORM_B": "fdft",
                                        **({"STRIDE_PHASES": 0} if takes_phases(p) else {}), "XFORM_O": "fdft"})
        plan = OPERATIONS[op].plan(p, config)
        gemms = plan.library_complex_gemms
        assert "fft_mac" not in plan.kernel_names and "fft_mac(" not in plan.source
        assert len(gemms) == 3 and all(g.tf32 == (precision == "tf32") for g in gemms)
        f = fft_conv(p)
        spec = spectrum(*fft_size(f, "smooth"))
        assert all(g.batch == spec for g in gemms)
        assert [g.accumulate for g in gemms] == ([False, True, True] if op == "conv_wgrad" else [False] * 3)
        assert plan.library_ffts and all(s.frequency_major for s in plan.library_ffts)
        assert "store_frequency_major(stage, out, first, last, planes);" in plan.source   # fdft's staged store
        assert "__ldg(in + (size_t)(e / count) * planes + e % count)" in plan.source   # the inverse's load
        images = [g.m if op != "conv_wgrad" else g.k for g in gemms]
        assert images == [2, 2, 1]
        assert [g for g in gemms][-1] == mac_gemm(f, 1, spec, op == "conv_wgrad", precision == "tf32")
    # The generated multiply-accumulates keep spectra plane after plane, and cuFFT steps say nothing of layout.
    block = OPERATIONS[op].plan(problem, space(op, problem).complete({**config.as_dict(), "MAC": "block", "IT": 2}))
    assert not block.library_complex_gemms and "frequency_major" not in repr(block.library_ffts)
    assert "IT" not in config.as_dict() and "JT" not in config.as_dict()
    with pytest.raises(InvalidConfigError, match="IT=2 is not allowed: nothing here: it applies only when.*MAC in"):
        space(op, problem).validate({**config.as_dict(), "IT": 2})


@pytest.mark.parametrize("op", CONV_OPS)
def test_cublas_multiply_accumulate_computes_the_convolution_in_numpy(op, rng):
    """MAC "cublas" plans in NumPy: the transforms' frequency-major spectra (cuFFT's strided R2C and
    C2R, dft, fdft, the factorised inverse) and the complex GEMMs on exactly the views the plan names
    give the float64 reference's result to rounding."""
    assert_cases_compute_in_numpy(op, cublas_cases(op), rng)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op", CONV_OPS)
def test_cublas_multiply_accumulate_verifies_under_emulation(op, tmp_path):
    """The generated kernels that write and read frequency-major spectra (dft, fdft, the factorised
    inverse) run by the CPU emulator, cuFFT and cuBLAS in NumPy, on the odd shapes: fp32, every
    element against float64 at the bound."""
    from tests.cuda_emulator import emulated_failure

    cases = cublas_cases(op)
    for name, problem, config in cases[::2] + cases[-1:]:
        why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, random.randrange(2**31))
        assert why is None, f"{name}: {why}"


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_cublas_multiply_accumulate_builds_without_spills(builds, tmp_path):
    """The frequency-major transforms and inverse of every cublas case and of the 11x11 seed row, both
    precisions, for sm_90: every kernel there, none spilling."""
    jobs = []
    for op in CONV_OPS:
        seed = dict(seed_problems(op))["sweep_11x11"]
        seed_config = space(op, seed).complete({"formulation": NAME, "MAC": "cublas",
                                                "XFORM_A": "fdft", "XFORM_B": "dft", "XFORM_O": "fdft"})
        jobs += precision_jobs(op, [*cublas_cases(op), ("sweep_11x11", seed, seed_config)], {"fp32": {}, "tf32": {}})
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_cublas_multiply_accumulate_verifies_against_float64_on_the_gpu(op):
    """MAC "cublas" on the GPU in both precisions: fp32 (cuBLAS in FP32) within the FP32 bound and tf32
    (CUBLAS_COMPUTE_32F_FAST_TF32) within its own, every element checked, on the odd shapes (batch 1,
    asymmetric padding, strides, an image smaller than its filter's reach) and the 7x7 sweep row."""
    pytest.importorskip("cupy")
    problems = [*small_problems(op), ("sweep_7x7", dict(seed_problems(op))["sweep_7x7"])]
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 2, WORKSPACE_LIMIT_BYTES, fixed={"MAC": "cublas"})


def test_complex_gemm_steps_check_their_views_and_compute_each_op_as_stored():
    """LibraryComplexGemm refuses a view too short for its stored matrix, overlapping outputs and an
    unknown op, naming what was wrong; NumPy's run of it (as cuBLAS: views in complex numbers) gives
    op(A) op(B) with "n", "t" and "h" as their definitions say, batched, and adds with accumulate."""
    from autocnn.kernels.steps import MatrixView
    from tests.plan_numpy import numpy_gemm

    with pytest.raises(ValueError, match="op_b is one of"):
        LibraryComplexGemm(2, 3, 4, MatrixView("a", 0, 4), MatrixView("b", 0, 3), MatrixView("c", 0, 3), "n", "c")
    with pytest.raises(ValueError, match="complex GEMM operand a: a 4x2 matrix cannot have ld=1"):
        LibraryComplexGemm(2, 3, 4, MatrixView("a", 0, 1), MatrixView("b", 0, 3), MatrixView("c", 0, 3), "h", "n")
    with pytest.raises(ValueError, match="complex GEMM output matrices overlap"):
        LibraryComplexGemm(2, 3, 4, MatrixView("a", 0, 4, 8), MatrixView("b", 0, 3, 12), MatrixView("c", 0, 3, 5),
                           batch=2)
    rng = np.random.default_rng(7)
    m, n, k, batch = 3, 5, 4, 2

    def complex_buffer(count):
        return rng.standard_normal(2 * count)

    for op_a in ("n", "t", "h"):
        for op_b in ("n", "t", "h"):
            a_shape = (m, k) if op_a == "n" else (k, m)
            b_shape = (k, n) if op_b == "n" else (n, k)
            pad = 3   # batch strides past each matrix: views, not packed arrays
            bufs = {"a": complex_buffer(batch * (a_shape[0] * a_shape[1] + pad)),
                    "b": complex_buffer(batch * (b_shape[0] * b_shape[1] + pad)), "c": complex_buffer(batch * m * n)}
            step = LibraryComplexGemm(m, n, k, MatrixView("a", 0, a_shape[1], a_shape[0] * a_shape[1] + pad),
                                      MatrixView("b", 0, b_shape[1], b_shape[0] * b_shape[1] + pad),
                                      MatrixView("c", 0, n, m * n), op_a, op_b, batch, accumulate=True)
            before = bufs["c"].view(np.complex128).reshape(batch, m, n).copy()
            numpy_gemm(step, bufs)
            for i in range(batch):
                def stored(name, shape):
                    start = i * (shape[0] * shape[1] + pad)
                    return bufs[name].view(np.complex128)[start:start + shape[0] * shape[1]].reshape(shape)
                op = {"n": lambda x: x, "t": lambda x: x.T, "h": lambda x: np.conj(x.T)}
                expected = before[i] + op[op_a](stored("a", a_shape)) @ op[op_b](stored("b", b_shape))
                assert np.allclose(bufs["c"].view(np.complex128).reshape(batch, m, n)[i], expected), (op_a, op_b)


def test_varying_the_multiply_accumulate_drops_and_fills_the_parameters_it_turns_off_and_on():
    """`autocnn tune --vary MAC` from a record of the tiled MAC: its "cublas" variant keeps the
    transforms, images and threads and drops IT, JT, FB, BL and MAC_ORDER (nothing of cuBLAS's);
    back to "thread", IT and JT take their first choices. A variant the rules refuse as it stands (mma
    with 8 x 8 outputs a thread: more m16 tiles a warp than it takes) is repaired: IT moves to its
    nearest value that works (4 and 2 are refused too, with JT 8), 1, and nothing else changes."""
    from autocnn.search.tuner import _variants

    problem = dict(seed_problems("conv_fwd"))["sweep_11x11"]
    sp = space("conv_fwd", problem)
    record = sp.validate({"formulation": NAME, "IMGS": 128, "FFT_SIZE": "smooth", "FFT_THREADS": 256, "MAC": "block",
                          "IT": 8, "JT": 8, "FB": 4, "BL": 8, "MAC_ORDER": "tiles", "XFORM_A": "fdft", "XFORM_B": "dft",
                          "DFT_FLAT_B": 0, "XFORM_O": "fdft", "WS_SHARE": 0, "FFT_VEC": 1, "FFT_TILE": 0,
                          "RADIX_THREADS": 0})
    cublas = sp.with_choice(record, "MAC", "cublas")
    assert not {"IT", "JT", "FB", "BL", "MAC_ORDER"} & set(cublas.as_dict())
    assert all(cublas[k] == record[k] for k in ("IMGS", "FFT_THREADS", "XFORM_A", "XFORM_B", "XFORM_O"))
    thread = sp.with_choice(cublas, "MAC", "thread")
    assert (thread["IT"], thread["JT"]) == (1, 1) and "FB" not in thread.as_dict()
    variants = _variants(sp, [record], ["MAC"])
    assert [v["MAC"] for v in variants] == ["thread", "mma", "cublas"]
    with pytest.raises(InfeasibleConfigError):
        sp.with_choice(record, "MAC", "mma")
    mma = {k: v for k, v in variants[1].as_dict().items() if k != "MAC_CROSS"}   # turned on: its first choice
    assert mma == {**record.as_dict(), "MAC": "mma", "IT": 1}
    for it in (4, 2):
        with pytest.raises(InfeasibleConfigError):
            sp.validate({**variants[1].as_dict(), "IT": it})


# DFT_FLAT_A / DFT_FLAT_B: the direct transform taking a block's planes together, outputs flat.

def flat_cases(op):
    """(name, problem, config) with both operands' direct transforms flat, on the odd shapes: blocks
    of 4 and 16 planes in turn (the last block short wherever the planes are not a multiple), the
    stride's phases apart and not, plane-after-plane spectra (MAC "thread") and frequency-major ones
    (MAC "cublas", every third), and one case in FFT tiles (sources loaded through Op::load)."""
    out = []
    for i, (name, problem) in enumerate(small_problems(op)):
        config = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": min(2, problem.N), "FFT_THREADS": 64,
                  "MAC": "cublas" if i % 3 == 2 else "thread", "XFORM_A": "dft", "XFORM_B": "dft",
                  "DFT_FLAT_A": DFT_FLATS[1 + i % 2], "DFT_FLAT_B": DFT_FLATS[2 - i % 2], "FFT_VEC": 1, "FFT_TILE": 0}
        if op != "conv_wgrad":
            config |= {"XFORM_O": "cufft", "WS_SHARE": 0}
        if takes_phases(problem):
            config["STRIDE_PHASES"] = (i + 1) % 2
        out.append((name, problem, space(op, problem).complete(config)))
    name, tiled_problem = next((n, p) for n, p in small_problems(op) if fft_tiles(p, 16).count > 1 and max(p.R, p.S) < 16)
    out.append((f"{name} F=16", tiled_problem, tiled(op, tiled_problem, 16, MAC="thread", XFORM_A="dft",
                                                    XFORM_B="dft", DFT_FLAT_A=16, DFT_FLAT_B=4)))
    return out


@pytest.mark.parametrize("op", CONV_OPS)
def test_flat_direct_transforms_take_blocks_of_planes_and_leave_the_other_form_as_it_was(op):
    """DFT_FLAT_<operand> is a parameter of "dft" alone; a non-zero value launches one block a
    group of that many planes with DftFlat's shared memory, and 0, the first choice (what a record
    tuned before the parameter completes to), renders the source of the per-plane form unchanged."""
    problem = dict(small_problems(op))["f_s2"]
    sp = space(op, problem)
    base = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 2, "FFT_THREADS": 64, "MAC": "thread",
            "XFORM_A": "dft", "XFORM_B": "dft", **({"STRIDE_PHASES": 1} if takes_phases(problem) else {})}
    old = sp.complete(base)
    assert old["DFT_FLAT_A"] == old["DFT_FLAT_B"] == 0
    assert "dft_flat" not in OPERATIONS[op].plan(problem, old).source
    f, sizes = fft_conv(problem, True), operand_sizes(problem, True)
    fh, fw = fft_size(f, "smooth")
    for flat in DFT_FLATS[1:]:
        plan = OPERATIONS[op].plan(problem, sp.complete({**base, "DFT_FLAT_B": flat}))
        assert f"fft::dft_flat<fft::OperandB, {flat}>" in plan.source
        assert "fft::dft<fft::OperandA>" in plan.source and "dft_flat<fft::OperandA" not in plan.source
        steps = [s for s in plan.steps if getattr(s, "kernel", "") == "fft_dft_b"]
        planes = f.b_planes if op != "conv_wgrad" else 2 * f.b_planes   # conv_wgrad: dY, a block of 2 images
        assert steps and steps[0].grid == (cdiv(planes, flat), 1, 1)
        assert steps[0].shared_bytes == dft_smem_bytes(sizes["B"], fh, fw, flat)
    with pytest.raises(InvalidConfigError, match="DFT_FLAT_B=4 is not allowed"):
        sp.validate({**sp.complete({**base, "XFORM_B": "cufft"}).as_dict(), "DFT_FLAT_B": 4})


@pytest.mark.parametrize("op", CONV_OPS)
def test_flat_direct_transforms_compute_the_convolution_in_numpy(op, rng):
    """The flat cases' plans in NumPy (the transforms as their definitions say, on the launches the
    plan names) give the float64 reference's result to rounding."""
    assert_cases_compute_in_numpy(op, flat_cases(op), rng)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op", CONV_OPS)
def test_flat_direct_transforms_verify_under_emulation(op, tmp_path):
    """dft_flat run by the CPU emulator (cuFFT and cuBLAS in NumPy) on every flat case: short last
    blocks, both layouts of the spectra, phases and tiles; fp32, every element against float64 at
    the bound."""
    assert_cases_verify_under_emulation(op, flat_cases(op), tmp_path)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_flat_direct_transforms_build_without_spills(builds, tmp_path):
    """The flat cases and scherer10_l2's backward-data (the row the form is for: 4 x 4 sub-filters in
    70 x 70 planes, with its record's tensor-core multiply-accumulate), both precisions, for sm_90:
    every kernel there, none spilling."""
    jobs = []
    for op in CONV_OPS:
        jobs += precision_jobs(op, flat_cases(op), {"fp32": {}, "tf32": {}})
    op = "conv_bwd_data"
    row = dict(seed_problems(op))["scherer10_l2"]
    for flat in DFT_FLATS[1:]:
        # Completed in tf32, which has no MAC_CROSS: precision_jobs sets it for fp32.
        config = space(op, dataclasses.replace(row, precision="tf32")).complete({"formulation": NAME, "IMGS": 64, "FFT_SIZE": "smooth", "FFT_THREADS": 128,
                                          "MAC": "mma", "IT": 2, "JT": 4, "FB": 4, "BL": 8, "MAC_ORDER": "tiles",
                                          "XFORM_A": "cufft", "XFORM_B": "dft", "DFT_FLAT_B": flat,
                                          "STRIDE_PHASES": 1, "XFORM_O": "cufft", "WS_SHARE": 1, "FFT_VEC": 4})
        jobs += precision_jobs(op, [(f"scherer10_l2 flat {flat}", row, config)], {"fp32": {"MAC_CROSS": 1}, "tf32": {}})
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_flat_direct_transforms_verify_against_float64_on_the_gpu(op):
    """The flat direct transforms on the GPU, both precisions, every element within the bound: the
    flat cases, and configs sampled with both operands' transforms flat on the odd shapes and on
    scherer10_l2 (its 4 x 4 sub-filters' 4,096 planes)."""
    pytest.importorskip("cupy")
    assert_cases_verify_on_the_gpu(op, flat_cases(op))
    problems = [*small_problems(op), ("scherer10_l2", dict(seed_problems(op))["scherer10_l2"])]
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 1, WORKSPACE_LIMIT_BYTES,
                           fixed={"XFORM_A": "dft", "XFORM_B": "dft", "DFT_FLAT_A": 4, "DFT_FLAT_B": 16})


# -- XFORM "radix": a mixed-radix FFT of each plane in one kernel ------------------------------------

def test_radix_factors_merge_the_prime_factors_into_few_radices():
    """The stages' radices multiply to the size, none above RADIX_MAX, as few as first-fit merging of
    the prime factors (largest first) gives; a size with another prime factor is refused by name."""
    expected = {70: (7, 5, 2), 40: (5, 8), 42: (7, 6), 64: (8, 8), 72: (9, 8), 81: (9, 9), 7: (7,), 1: (), 98: (7, 7, 2)}
    for n, radices in expected.items():
        assert radix_factors(n) == radices
    for n in range(1, MAX_FFT + 1):
        if smooth_size(n) == n:
            radices = radix_factors(n)
            assert int(np.prod(radices)) == n and all(1 < r <= RADIX_MAX for r in radices)
    with pytest.raises(ValueError, match="2, 3, 5 and 7, not 22"):
        radix_factors(22)
    assert all(radix_lead(h) % 2 == 1 and radix_lead(h) in (h, h + 1) for h in range(1, 100))


def radix_cases(op):
    """(name, problem, config) with both operands transformed by "radix" on the odd shapes: the
    stride's phases apart and not, MAC thread and block, every way back but conv_wgrad's (cuFFT's C2R
    and crop, the factorised inverse, the radix inverse), FFT sizes smooth and powers of two, and
    one case in FFT tiles (sources loaded through Op::load, outputs stored a tile at a time)."""
    out = []
    for i, (name, problem) in enumerate(small_problems(op)):
        config = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": min(2, problem.N),
                  "FFT_THREADS": (64, 128)[i % 2], "MAC": "thread", "XFORM_A": "radix", "XFORM_B": "radix",
                  "FFT_VEC": 1, "FFT_TILE": 0, "RADIX_THREADS": (0, 256)[i % 2]}
        if i % 3 == 1:
            config |= {"MAC": "block", "IT": 2, "JT": 2, "FB": 4, "BL": 8, "MAC_ORDER": "tiles"}
        if op != "conv_wgrad":
            config |= {"XFORM_O": ("cufft", "fdft", "radix")[i % 3], "WS_SHARE": 0}
        if takes_phases(problem):
            config["STRIDE_PHASES"] = (i + 1) % 2
        if "pow2" in space(op, problem).param("FFT_SIZE").choices and i % 2:
            config["FFT_SIZE"] = "pow2"
        out.append((name, problem, space(op, problem).complete(config)))
    name, tiled_problem = next((n, p) for n, p in small_problems(op) if fft_tiles(p, 16).count > 1 and max(p.R, p.S) < 16)
    out.append((f"{name} F=16", tiled_problem, tiled(op, tiled_problem, 16, MAC="thread", XFORM_A="radix",
                                                    XFORM_B="radix",
                                                    **({"XFORM_O": "radix"} if op != "conv_wgrad" else {}))))
    return out


@pytest.mark.parametrize("op", CONV_OPS)
def test_radix_transforms_launch_a_block_per_pair_of_planes_and_refuse_frequency_major_spectra(op):
    """XFORM "radix" launches fft_dft_<operand> with one block per RADIX_PLANES planes and
    radix_smem_bytes of shared memory, renders the stages of radix_factors for both sizes, and is
    refused, naming why, with MAC "cublas" (whose spectra are frequency-major)."""
    problem = dict(small_problems(op))["f_s2"]
    sp = space(op, problem)
    base = {"formulation": NAME, "FFT_SIZE": "smooth", "IMGS": 2, "FFT_THREADS": 64, "MAC": "thread",
            "XFORM_A": "radix", "XFORM_B": "radix", **({"STRIDE_PHASES": 1} if takes_phases(problem) else {})}
    plan = OPERATIONS[op].plan(problem, sp.complete(base))
    f, sizes = fft_conv(problem, True), operand_sizes(problem, True)
    fh, fw = fft_size(f, "smooth")
    planes = {"A": 2 * f.a_planes, "B": f.b_planes if op != "conv_wgrad" else 2 * f.b_planes}
    for operand in ("A", "B"):
        steps = [s for s in plan.steps if getattr(s, "kernel", "") == f"fft_dft_{operand.lower()}"]
        assert steps and steps[0].grid == (cdiv(planes[operand], RADIX_PLANES), 1, 1)
        assert steps[0].shared_bytes == radix_smem_bytes(sizes[operand][0], fh, fw)
        assert f"fft::radix_fft<fft::Operand{operand}>" in plan.source
    w, h = radix_factors(fw), radix_factors(fh)
    assert f"constexpr int R = {w[0]}, B = FW / R;" in plan.source   # the rows' first stage, from the source
    assert all(f"radix::stage<{r}, FW, " in plan.source for r in w[1:])
    assert all(f"radix::stage<{r}, FH, " in plan.source for r in h[:-1])
    assert f"radix::last_stage<{h[-1]}, " in plan.source              # the columns' last, to the spectrum
    for threads in RADIX_THREADS[1:]:   # their own block size; the other kernels keep FFT_THREADS
        steps = OPERATIONS[op].plan(problem, sp.complete({**base, "RADIX_THREADS": threads})).steps
        assert {s.block[0] for s in steps if getattr(s, "kernel", "").startswith("fft_dft_")} == {threads}
        assert {s.block[0] for s in steps if getattr(s, "kernel", "") == "fft_mac"} == {64}
    if op != "conv_wgrad":   # the way back by the same stages: the kept outputs of each plane, in pairs of rows
        plan = OPERATIONS[op].plan(problem, sp.complete({**base, "XFORM_O": "radix", "RADIX_THREADS": 256}))
        steps = [s for s in plan.steps if getattr(s, "kernel", "") == "fft_idft"]
        assert steps and steps[0].grid == (cdiv(2 * f.out_planes, RADIX_PLANES), 1, 1) and steps[0].block[0] == 256
        assert steps[0].shared_bytes == radix_smem_bytes(kept_rows(problem, takes_phases(problem))[2], fh, fw)
        assert "fft::radix_ifft<fft::Output>" in plan.source and "cufftExec" not in repr(plan.steps)
        with pytest.raises(InfeasibleConfigError, match="radix reads and stores spectra plane after plane"):
            sp.validate(sp.complete({**base, "MAC": "cublas", "XFORM_A": "dft", "XFORM_B": "dft",
                                     "XFORM_O": "radix"}).as_dict())
    else:   # dW's taps are a few percent of each plane: the factorised inverse computes them alone
        assert "radix" not in sp.param("XFORM_O").choices
    with pytest.raises(InfeasibleConfigError, match="RADIX_THREADS=256 sets the threads of the radix transforms"):
        sp.validate(sp.complete({**base, "XFORM_A": "dft", "XFORM_B": "cufft"}).as_dict() | {"RADIX_THREADS": 256})
    with pytest.raises(InfeasibleConfigError, match="XFORM radix reads and stores spectra plane after plane"):
        sp.validate(sp.complete({**base, "MAC": "cublas", "XFORM_B": "dft"}).as_dict() | {"XFORM_A": "radix"})


@pytest.mark.parametrize("op", CONV_OPS)
def test_radix_transforms_compute_the_convolution_in_numpy(op, rng):
    """The radix cases' plans in NumPy (the transforms as their definitions say, on the launches the
    plan names) give the float64 reference's result to rounding."""
    assert_cases_compute_in_numpy(op, radix_cases(op), rng)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op", CONV_OPS)
def test_radix_transforms_verify_under_emulation(op, tmp_path):
    """radix_fft run by the CPU emulator (cuFFT in NumPy) on every radix case: odd sources in odd
    planes (the last pair of rows a single row), placed at the padding's offset or spread at the
    stride, phases, tiles, both sizes of FFT; fp32, every element against float64 at the bound."""
    assert_cases_verify_under_emulation(op, radix_cases(op), tmp_path)


def scherer_radix_config(precision):
    """scherer10_l2's backward-data record's config with its dY transformed by "radix"."""
    op = "conv_bwd_data"
    row = dataclasses.replace(dict(seed_problems(op))["scherer10_l2"], precision=precision)
    config = {"formulation": NAME, "IMGS": 64, "FFT_SIZE": "smooth", "FFT_THREADS": 128, "MAC": "mma", "IT": 2,
              "JT": 4, "FB": 4, "BL": 8, "MAC_ORDER": "tiles", "XFORM_A": "radix", "XFORM_B": "dft", "DFT_FLAT_B": 4,
              "STRIDE_PHASES": 1, "XFORM_O": "cufft", "WS_SHARE": 1, "FFT_VEC": 4,
              **({"MAC_CROSS": 1} if precision == "fp32" else {})}
    return row, space(op, row).complete(config)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("builds", BUILDS)
def test_radix_transforms_build_without_spills(builds, tmp_path):
    """The radix cases, both precisions, and scherer10_l2's backward-data with its dY by "radix" (the
    row it was written for: 70 x 70 planes, radices 7, 5, 2) at every RADIX_THREADS, for sm_90: every
    kernel there, none spilling."""
    jobs = []
    for op in CONV_OPS:
        jobs += precision_jobs(op, radix_cases(op), {"fp32": {}, "tf32": {}})
    for precision in ("fp32", "tf32"):
        row, config = scherer_radix_config(precision)
        for threads in RADIX_THREADS:
            c = space("conv_bwd_data", row).complete({**config.as_dict(), "RADIX_THREADS": threads})
            jobs.append((f"scherer10_l2 {precision} {c}", OPERATIONS["conv_bwd_data"].plan(row, c), True))
    failures = compile_failures(build_sample(jobs, builds), "sm_90", tmp_path)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_radix_transforms_verify_against_float64_on_the_gpu(op):
    """The radix transforms on the GPU, both precisions, every element within the bound: the radix
    cases, configs sampled with both operands by "radix" on the odd shapes and the seed rows of 7x7
    and 11x11 filters, and scherer10_l2's backward-data as it is measured."""
    pytest.importorskip("cupy")
    cases = list(radix_cases(op))
    if op == "conv_bwd_data":
        for pr in ("fp32", "tf32"):   # dY by radix; the way back by radix (the record); both, on 256 threads
            row, config = scherer_radix_config(pr)
            c = config.as_dict()
            cases += [(f"scherer10_l2 {pr}", row, config),
                      (f"scherer10_l2 {pr} radix back", row,
                       space(op, row).complete({**c, "XFORM_A": "cufft", "XFORM_O": "radix"})),
                      (f"scherer10_l2 {pr} radix both ways", row, space(op, row).complete(
                          {**c, "XFORM_O": "radix", "RADIX_THREADS": 256, "WS_SHARE": 0, "FFT_VEC": 1, "IMGS": 32}))]
    assert_cases_verify_on_the_gpu(op, cases)
    rows = dict(seed_problems(op))
    problems = [*small_problems(op), ("sweep_7x7", rows["sweep_7x7"]), ("sweep_11x11", rows["sweep_11x11"])]
    problems = [(f"{n} {pr}", dataclasses.replace(p, precision=pr)) for n, p in problems for pr in ("fp32", "tf32")]
    assert_verifies_on_gpu(OPERATIONS[op], NAME, problems, 1, WORKSPACE_LIMIT_BYTES,
                           fixed={"XFORM_A": "radix", "XFORM_B": "radix"})
